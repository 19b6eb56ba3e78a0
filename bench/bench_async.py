"""Rollouts ahead of the update against the synchronous step: the CPU preset, both ways, one after the other.

    .venv/bin/python bench/bench_async.py [--steps 4] [--staleness 1] [--seed 1] [--old-log-probs engine]
                                          [--extra KEY=VALUE ...]

Arm A is `grl-train preset=cpu` as the README runs it (the engine in the actor's rank, every step samples
from the weights it trains). Arm B is the same run with the engine in a rollout worker of its own that
samples the next step's episodes while the actor trains (`actor_rollout_ref.hybrid_engine=false
rollout.max_staleness=K actor_rollout_ref.actor.tis_imp_ratio_cap=2`); on CPU the engine then takes half
the cores and the actor's rank the other half. With `--old-log-probs engine` both arms skip the
old-log-prob pass and clip around the engine's log-probs (`recompute_old_log_probs=false`; arm B then has
no TIS, whose weight would be 1). Validation, checkpoints and the export are off, so each
step is rollout + update. Printed: each arm's step times, the mean of each phase, training steps per hour
(from the summed step times, and from the wall time of the whole command, Ray's start included), and B/A.

In arm B a step's `timing_s/gen` overlaps the update of the step before; `timing_s/wait_prev_gen` is the
time the trainer waited for it and `timing_s/rollout_wait_weights` the time the rollout waited for weights.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = (
    "gen",
    "wait_prev_gen",
    "rollout_wait_weights",
    "old_log_prob",
    "update_actor",
    "sync_weights",
    "step",
)


def run_arm(name: str, overrides: list[str], folder: Path) -> dict:
    run_dir = folder / name
    cmd = [
        sys.executable,
        "-m",
        "grl.train",
        "preset=cpu",
        "test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.export_hf=false",
        "save_freq=-1",
        "trainer.logger=[jsonl]",
        f"trainer.run_dir={run_dir}/run",
        f"trainer.default_local_dir={run_dir}/ckpt",
        *overrides,
    ]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"bench_async: arm {name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "timing_s/step" in r]
    return {
        "wall": wall,
        "steps": [r["timing_s/step"] - r.get("timing_s/save_checkpoint", 0.0) for r in steps],
        "phases": {p: statistics.fmean(r.get(f"timing_s/{p}", 0.0) for r in steps) for p in PHASES},
        "success": [round(r.get("train/tetrisAgent_gap_dim_4/success", float("nan")), 3) for r in steps],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--staleness", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--old-log-probs",
        choices=("recompute", "engine"),
        default="recompute",
        help="PPO's old log-probs: a pass at the trained weights (arm B adds TIS), or the engine's",
    )
    parser.add_argument("--extra", nargs="*", default=[], help="overrides given to both arms")
    args = parser.parse_args()
    recompute = args.old_log_probs == "recompute"
    common = [
        f"total_training_steps={args.steps}",
        f"trainer.seed={args.seed}",
        *args.extra,
        f"actor_rollout_ref.actor.recompute_old_log_probs={recompute}",
    ]
    ahead = [
        "actor_rollout_ref.hybrid_engine=false",
        f"rollout.max_staleness={args.staleness}",
        *(["actor_rollout_ref.actor.tis_imp_ratio_cap=2"] if recompute else []),
    ]
    with tempfile.TemporaryDirectory(prefix="bench_async_") as tmp:
        arms = {
            "A synchronous": run_arm("sync", common, Path(tmp)),
            f"B max_staleness={args.staleness}": run_arm("ahead", common + ahead, Path(tmp)),
        }
    print(
        f"preset=cpu, {args.steps} steps, seed {args.seed}, validation off, old log-probs: "
        f"{args.old_log_probs}"
    )
    print(f"{'arm':24} {'step times (s)':40} " + " ".join(f"{p:>12}" for p in PHASES))
    for name, arm in arms.items():
        print(
            f"{name:24} {' '.join(f'{s:.0f}' for s in arm['steps']):40} "
            + " ".join(f"{arm['phases'][p]:12.1f}" for p in PHASES)
        )
    rates = {
        name: (3600 * len(arm["steps"]) / sum(arm["steps"]), 3600 * len(arm["steps"]) / arm["wall"])
        for name, arm in arms.items()
    }
    for name, (by_steps, by_wall) in rates.items():
        print(
            f"{name:24} {by_steps:6.1f} steps/hour by step times, {by_wall:6.1f} by wall time; "
            f"training success {arms[name]['success']}"
        )
    (a_steps, a_wall), (b_steps, b_wall) = rates.values()
    print(f"B/A: {b_steps / a_steps:.2f}x by step times, {b_wall / a_wall:.2f}x by wall time")


if __name__ == "__main__":
    main()
