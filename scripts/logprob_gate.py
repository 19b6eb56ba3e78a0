"""Do the rollout engine's and the trainer's log-probs of the sampled tokens agree in a run? The check of
scripts/gpu_smoke.sh's run, which samples step 2 with the weights that step 1's sync streamed into an
engine whose own copy a level-2 sleep had dropped.

    python scripts/logprob_gate.py <run_dir>/metrics.jsonl [--step 2]

One line; exit status 0 when the step's gaps are within the limits below, 1 when one is above its limit
or the step logged none of them.

The gate reads |log p_engine - log p_trainer| per sampled token (`training/rollout_logprob_diff_*`,
grl/algo/mismatch.py), its mean and its 99th percentile, and not its maximum: the largest gap of a step
grows with the number of tokens it samples (the rarest bf16 rounding of a near-certain token, or a
near-tie that vLLM's kernels and the trainer's break differently), so a sound run with more tokens
could fail a gate on the maximum. A lost weight or buffer moves most tokens, which the mean and the p99
both see.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# (limit in nats, why). Measured on an H200 (docs/PERFORMANCE.md, scripts/gpu_parts.py): the hf engine in
# bf16 against the FSDP2 scorer on the embedded model, mean 0.03 and max 0.31-0.35 over 384 tokens.
LIMITS = {
    "training/rollout_logprob_diff_mean": (
        0.1,
        "3x the mean of a sound bf16 pair (0.03), room for vLLM's kernels; an engine with wrong weights "
        "samples tokens the trainer finds nats less likely, on most tokens",
    ),
    "training/rollout_logprob_diff_p99": (
        1.0,
        "a factor e on one token's probability, about 3x the largest gap of a sound bf16 pair (0.35); "
        "broken weights put far more than 1% of the tokens beyond it",
    ),
}


def verdict(records: list[dict], step: int) -> tuple[bool, str]:
    """(passed, one line) for `step` of a run's metrics records. A NaN gap fails."""
    values: dict[str, float] = {}
    for record in records:
        if record.get("step") == step:
            values.update({key: record[key] for key in LIMITS if key in record})
    absent = [key for key in LIMITS if key not in values]
    if absent:
        return False, f"step {step} logged no {', '.join(absent)}"
    over = [
        f"{key} {values[key]:.4g} nat > {limit:g} ({why})"
        for key, (limit, why) in LIMITS.items()
        if not values[key] <= limit
    ]
    if over:
        return False, f"step {step}: {'; '.join(over)}: the engine's weights are not the trainer's"
    return True, f"step {step}: " + ", ".join(
        f"{key} {values[key]:.4g} nat <= {LIMITS[key][0]:g}" for key in LIMITS
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics", type=Path, help="the run's metrics.jsonl")
    parser.add_argument(
        "--step", type=int, default=2, help="the step to check (default 2: the first after a sync)"
    )
    args = parser.parse_args(argv)
    records = (
        [json.loads(line) for line in args.metrics.read_text().splitlines() if line.strip()]
        if args.metrics.exists()
        else []
    )
    passed, line = verdict(records, args.step)
    print(line if passed else f"{line} ({args.metrics})", file=sys.stdout if passed else sys.stderr)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
