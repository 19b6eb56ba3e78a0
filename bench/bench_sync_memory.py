"""Peak host memory of one weight sync (FSDP2 actor -> rollout engine), streamed against the
full-state path it replaced, measured in the same worker processes.

    .venv/bin/python bench/bench_sync_memory.py [model_path=embedded] [ranks=2]

Two CPU ranks (gloo) shard the policy; rank 0 holds the hf engine. For each path every rank
reports its peak resident memory above what it held just before (Linux VmHWM, reset first).
The old path is the one GPU runs took: every rank gathers the full state dict in fp32, then
the engine rank hands it over whole. The streamed path is `Worker.sync_weights`. A first sync
(not counted) makes the engine write every weight once (pages it loaded but never wrote count
then); the streamed path runs before the full one, so memory the allocator kept from the full
path cannot hide its peak.
"""

from __future__ import annotations

import os
import sys
from grl.run_plan import RunPlan


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def _peak_above_start(worker, path: str) -> int:
    """Bytes of resident memory this rank peaked at above its level when `path` started."""
    import gc

    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # VmHWM := VmRSS
    start = _rss_kib("VmRSS")
    if path == "streamed":
        worker.sync_weights()
    else:
        _full_state_sync(worker)
    gc.collect()
    return (_rss_kib("VmHWM") - start) * 1024


def _full_state_sync(worker) -> None:
    """The sync before streaming: the whole state gathered on every rank, then one list."""
    from grl.workers import fsdp
    from grl.workers.worker import hf_names

    state = fsdp.full_state_dict(worker.module, on_all_ranks=True)
    if worker.engine is None:
        return
    weights = hf_names(state)
    if getattr(worker.module.model.config, "tie_word_embeddings", False):
        weights.pop("lm_head.weight", None)
    worker.engine.update_weights(list(weights.items()))


def _model_bytes(worker) -> tuple[int, int]:
    """(full, this rank's shard) bytes of the weights."""
    params = list(worker.module.parameters())
    return (
        sum(p.numel() * p.element_size() for p in params),
        sum(p.to_local().numel() * p.element_size() for p in params),
    )


def main(argv: list[str]) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import ray

    from grl.config import compose
    from grl.workers import ActorRolloutRefGroup, init_ray

    args = dict(a.split("=", 1) for a in argv)
    model, ranks = args.get("model_path", "embedded"), int(args.get("ranks", 2))
    init_ray(None, num_cpus=max(ranks, 2), include_dashboard=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cfg = compose(
        [
            f"model_path={model}",
            f"n_gpus_per_node={ranks}",
            "nnodes=1",
            "trainer.device=cpu",
            "actor_rollout_ref.rollout.name=hf",
        ]
    )
    actor = ActorRolloutRefGroup.from_config(cfg, RunPlan.from_config(cfg))
    try:
        full_bytes, shard_bytes = actor.execute(_model_bytes)[0]
        actor.sync_weights()
        streamed = actor.execute(_peak_above_start, "streamed")
        full = actor.execute(_peak_above_start, "full")
    finally:
        actor.shutdown()
        ray.shutdown()
    mib = 2**20
    print(
        f"weight sync, {model}, {ranks} CPU ranks, hf engine in rank 0; full fp32 weights "
        f"{full_bytes / mib:.0f} MiB (rank 0's shard: {shard_bytes / mib:.0f} MiB)"
    )
    print(f"  {'rank':<5} {'full-state MiB':>15} {'streamed MiB':>13} {'ratio':>6}")
    for rank, (old, new) in enumerate(zip(full, streamed)):
        print(f"  {rank:<5} {old / mib:15.0f} {new / mib:13.0f} {new / max(old, 1):6.2f}")
    print(
        f"peak above start, worst rank: full-state {max(full) / mib:.0f} MiB, streamed "
        f"{max(streamed) / mib:.0f} "
        f"MiB, ratio {max(streamed) / max(max(full), 1):.2f}"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
