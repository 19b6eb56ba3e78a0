"""LoRA against full fine-tuning: one CPU training step of the cpu preset each,
side by side in one process, with the same seed, batch size and model.

    .venv/bin/python bench/bench_lora.py [lora_rank=16] [hydra overrides ...]

Prints the time of each phase and the peak resident memory of the Ray workers for
both runs, and the LoRA/full ratios (below 1.0 = LoRA is cheaper).
"""

from __future__ import annotations

import os
import sys

from bench_train_step import PHASES, PeakRSS, one_step_trainer


def one_step(overrides: list[str]) -> tuple[dict[str, float], int, float]:
    """-> (the step's metrics, peak worker RSS in bytes, worker start-up seconds)."""
    _, trainer, startup = one_step_trainer(overrides)
    try:
        with PeakRSS() as memory:
            metrics, _ = trainer.train_step(1)
    finally:
        trainer.close()
    return metrics, memory.peak_workers, startup


def main(argv: list[str]) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    rank = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("lora_rank=")), 16)
    common = [a for a in argv if not a.startswith("lora_rank=")]
    full, full_mem, full_start = one_step(common)
    lora, lora_mem, lora_start = one_step(
        [
            *common,
            f"actor_rollout_ref.model.lora_rank={rank}",
            f"actor_rollout_ref.model.lora_alpha={2 * rank}",
        ]
    )
    print(f"cpu preset, one training step each; overrides: {' '.join(common) or '(none)'}")
    print(f"  {'phase':<14} {'full':>8} {'lora r' + str(rank):>9} {'ratio':>6}")
    for phase in PHASES:
        key = f"timing_s/{phase}"
        if key in full and key in lora:
            print(f"  {phase:<14} {full[key]:8.2f} {lora[key]:9.2f} {lora[key] / full[key]:6.2f}")
    print(f"  {'start-up':<14} {full_start:8.2f} {lora_start:9.2f} {lora_start / full_start:6.2f}")
    print(
        f"peak RSS of the Ray workers: full {full_mem / 2**30:.2f} GiB, LoRA {lora_mem / 2**30:.2f} GiB, "
        f"ratio {lora_mem / full_mem:.2f}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
