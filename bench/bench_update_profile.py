"""Where the actor update's time goes, against the rank's matmul peak: the CPU preset's second training
step with torch.profiler around the actor rank's update loop, its operators' own time grouped by kind.

    .venv/bin/python bench/bench_update_profile.py [--first-step] [hydra overrides ...]

The first step warms the kernels and the optimizer's state; the second is profiled (`--first-step`: the
first). The profiled step's update runs twice on the same mini-batches, the first time unprofiled, so the
profiler's own cost shows as the difference. The dense matmuls' FLOPs are the profiler's own count
(aten::mm, addmm, bmm), the work actually done, so their rate is measured where they ran and set against
the peak `perf/mfu/actor` divides by (grl/workers/peak.py: `F.linear` forward + backward at the model's MLP
shape, in the update's dtype and threads). What the operators do not account for is the update's Python and
dispatch: the loop, the loss's small tensors, autograd's bookkeeping."""

from __future__ import annotations

import os
import sys
import time

# Each operator's own time goes to the first kind whose names it contains; the rest is "elementwise".
KINDS = {
    "dense matmuls (forward and backward)": ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear"),
    "attention": ("attention", "aten::_softmax", "aten::_softmax_backward"),
    "optimizer (AdamW, clipping)": ("_foreach", "aten::_fused_adam", "adam", "clip_grad"),
    "dtype casts and copies": (
        "aten::copy_",
        "aten::_to_copy",
        "aten::to",
        "aten::clone",
        "aten::contiguous",
    ),
    "log-softmax and gathers (the head's scoring)": (
        "log_softmax",
        "aten::gather",
        "aten::scatter",
        "logsumexp",
        "aten::index",
    ),
    "FSDP collectives and sharding": ("c10d", "all_gather", "reduce_scatter", "fsdp", "split_with_sizes"),
}
MATMULS = ("aten::mm", "aten::addmm", "aten::bmm")


def kind_of(name: str) -> str:
    lowered = name.lower()
    for kind, names in KINDS.items():
        if any(n.lower() in lowered for n in names):
            return kind
    return "elementwise and the rest"


def profile_updates(worker) -> None:
    """Replaces this rank's update loop by one that profiles it and keeps the summary on the worker (Ray
    binds an actor's own methods when it starts; the role's `update` reaches the loop through `super()`)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from grl.workers.update import UpdateLoop

    update = UpdateLoop.update

    def profiled(self, minibatches):
        # The same mini-batches twice, the first time unprofiled: the profiler's own cost (a record per
        # operator, its shapes, its FLOPs) is the difference. It is two updates' worth of training.
        start = time.perf_counter()
        update(self, minibatches)
        unprofiled = time.perf_counter() - start
        with profile(activities=[ProfilerActivity.CPU], with_flops=True, record_shapes=True) as prof:
            start = time.perf_counter()
            metrics = update(self, minibatches)
            wall = time.perf_counter() - start
        averages = prof.key_averages()  # aggregated once: the kinds and the top list read it
        by_kind: dict[str, float] = {}
        matmul_flops = matmul_s = 0.0
        for event in averages:
            seconds = event.self_cpu_time_total / 1e6
            kind = kind_of(event.key)
            by_kind[kind] = by_kind.get(kind, 0.0) + seconds
            if event.key in MATMULS:
                matmul_flops += event.flops
                matmul_s += seconds
        self.update_profile = {
            "wall_s": wall,
            "unprofiled_s": unprofiled,
            "by_kind": by_kind,
            "matmul_flops": matmul_flops,
            "matmul_s": matmul_s,
            "threads": torch.get_num_threads(),
            "copies_by_shape": [
                (e.input_shapes, e.self_cpu_time_total / 1e6, e.count)
                for e in sorted(
                    (e for e in prof.key_averages(group_by_input_shape=True) if e.key == "aten::copy_"),
                    key=lambda e: -e.self_cpu_time_total,
                )[:12]
            ],
            "top": [
                (e.key, e.self_cpu_time_total / 1e6, e.count)
                for e in sorted(averages, key=lambda e: -e.self_cpu_time_total)[:15]
            ],
        }
        return metrics

    UpdateLoop.update = profiled


def main(argv: list[str]) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from bench_train_step import one_step_trainer

    profiled_step = 1 if "--first-step" in argv else 2
    cfg, trainer, _ = one_step_trainer(["total_training_steps=2", *(a for a in argv if a != "--first-step")])
    try:
        steps = []
        for step in range(1, profiled_step + 1):
            if step == profiled_step:
                trainer.actor.execute(profile_updates)
            steps.append(trainer.train_step(step))
        metrics, batch = steps[-1]
        found = trainer.actor.execute(lambda worker: worker.update_profile)
        peak = trainer.peak_flops
    finally:
        trainer.close()

    import torch

    tokens = int(batch["attention_mask"].sum())
    capability = torch.backends.cpu.get_cpu_capability()
    print(
        f"cpu preset, step {profiled_step}'s actor update ({len(batch)} episodes, {tokens} tokens, "
        f"{cfg.actor_rollout_ref.model.dtype} -> torch capability {capability}); perf/mfu/actor "
        f"{metrics['perf/mfu/actor']:.2f} of {peak / 1e9:.0f} GFLOP/s a rank (over both of its updates)"
        + "".join(
            f"; step {i}: update {m['timing_s/update_actor']:.1f} s, perf/mfu/actor {m['perf/mfu/actor']:.2f}"
            for i, (m, _) in enumerate(steps[:-1], 1)
        )
    )
    for rank, summary in enumerate(found):
        wall, by_kind = summary["wall_s"], summary["by_kind"]
        unprofiled = summary["unprofiled_s"]
        print(
            f"rank {rank}: the same update {unprofiled:.1f} s unprofiled, {wall:.1f} s under the profiler "
            f"({summary['threads']} threads); the own times below are the profiled run's"
        )
        for kind, seconds in sorted(by_kind.items(), key=lambda kv: -kv[1]):
            print(f"  {kind:<46} {seconds:7.2f} s  {seconds / wall:6.1%}")
        rest = wall - sum(by_kind.values())
        print(f"  {'outside any operator (Python, autograd)':<46} {rest:7.2f} s  {rest / wall:6.1%}")
        flops = summary["matmul_flops"]
        rate = flops / max(summary["matmul_s"], 1e-9)
        print(
            f"  dense matmuls: {flops / 1e12:.2f} TFLOP in {summary['matmul_s']:.1f} s, "
            f"{rate / 1e9:.0f} GFLOP/s = {rate / peak:.2f} of the peak; at the peak they would take "
            f"{flops / peak:.1f} s, {flops / peak / unprofiled:.2f} of the "
            f"unprofiled update"
        )
        print("  aten::copy_ by its tensors' shapes:")
        for shapes, seconds, count in summary["copies_by_shape"]:
            print(f"    {str(shapes):<52} {seconds:7.2f} s  x{count}")
        print("  the operators with the most own time:")
        for name, seconds, count in summary["top"]:
            print(f"    {name:<52} {seconds:7.2f} s  x{count}")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main(sys.argv[1:])
