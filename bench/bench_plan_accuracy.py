"""The memory planner (grl/planner/) against the measured peak memory of one CPU training step.

    .venv/bin/python bench/bench_plan_accuracy.py [hydra overrides ...]

One step of the cpu preset runs through the real stack (Ray workers, FSDP2, the engine). Around
each phase the actor rank resets its peak resident memory (writing 5 to /proc/self/clear_refs)
and reads it back afterwards (VmHWM in /proc/self/status). The planner is then given the shapes
the step actually had (the longest episode and its sampled tokens, the agents in the rollout) and
its per-phase prediction for the worker is printed beside the measurement, with the ratio. The
step's shapes are inputs, not fitted values: every other number comes from the config and the
model's config.json. Exits 1 when a phase is off by more than 25%.

The first step runs unmeasured: AdamW creates its state in the first update, and the plan is of a
run's later steps. On a loaded 2-core machine `rollout.agent_group_num=[2] rollout.rollout_filter_ratio=1.0`
(8 episodes, all trained: one mini-batch of 8, as the preset's) keeps both steps to minutes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

TOLERANCE = 0.25


def measure_phases(trainer, step: int):
    """Run one training step, wrapping the group calls of each phase with a peak reset and read.
    -> (peak bytes by phase, the step's batch)."""
    peaks: dict[str, int] = {}

    # Defined here so that Ray ships them by value (the ranks cannot import this script).
    def reset_peak(worker) -> None:
        # glibc keeps freed heap pages resident, so without a trim the peak of one phase would be the
        # high-water mark of the update before it; trimmed, resident memory is live memory, the CPU
        # counterpart of torch.cuda.empty_cache() before reset_peak_memory_stats().
        import gc

        from grl.engines.host_memory import release_freed_host_memory

        gc.collect()
        release_freed_host_memory()
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")

    def read_peak_bytes(worker) -> int:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) * 1024

    def measured(phase: str, call):
        def run(*args, **kwargs):
            trainer.actor.execute(reset_peak)
            try:
                return call(*args, **kwargs)
            finally:
                peaks[phase] = max(peaks.get(phase, 0), max(trainer.actor.execute(read_peak_bytes)))

        return run

    engine = trainer.rollout.engine
    engine.generate = measured("rollout", engine.generate)
    for phase, method in (
        ("old_log_prob", "compute_log_probs"),
        ("ref", "compute_ref_log_probs"),
        ("update_actor", "update"),
        ("weight_sync", "sync_weights"),
    ):
        setattr(trainer.actor, method, measured(phase, getattr(trainer.actor, method)))
    _, batch = trainer.train_step(step)
    return peaks, batch


def step_shapes(trainer, batch) -> dict[str, int]:
    """The shapes the planner needs, as this step had them."""
    lengths = batch["attention_mask"].sum(-1)
    sampled = (batch["loss_mask"] > 0).sum(-1)
    rollout = trainer.sections.rollout
    agents = sum(n * s for n, s in zip(rollout.agent_group_num, rollout.agent_group_size))
    return {"seq_len": int(lengths.max()), "sampled_tokens": int(sampled.max()), "rollout_agents": agents}


def main(argv: list[str]) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from bench_train_step import one_step_trainer

    from grl import planner as plan

    cfg, trainer, _ = one_step_trainer(argv)
    try:
        trainer.train_step(1)  # the optimizer state exists from the first update on: measure the second step
        measured, batch = measure_phases(trainer, 2)
        shapes = step_shapes(trainer, batch)
    finally:
        trainer.close()
    predicted = plan.plan(trainer.sections, run=trainer.plan, **shapes)
    print(f"cpu preset, one step; shapes of the step: {shapes}")
    print(plan.format_plan(predicted))
    print(f"\n{'phase':<12} {'predicted GiB':>14} {'measured GiB':>13} {'ratio':>7}")
    worst = 0.0
    for phase, peak in measured.items():
        guess = predicted.device_total(phase) / plan.GIB
        ratio = guess / (peak / plan.GIB)
        worst = max(worst, abs(ratio - 1))
        print(f"{phase:<12} {guess:14.2f} {peak / plan.GIB:13.2f} {ratio:7.2f}")
    print(f"largest error {worst:.0%} (tolerance {TOLERANCE:.0%})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
