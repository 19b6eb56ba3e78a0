"""Ray worker groups: FSDP2 actor (+ reference model, + rollout engine) and critic.

The trainer uses only what is exported here (docs/CONTRACTS.md, Workers).

- `init_ray(address)`: `address`, else $RAY_ADDRESS, else a local runtime.
- A group is the run plan's `world_size` = n_gpus_per_node x nnodes Ray actors placed on
  one placement group (a bundle per GPU, or per rank on CPU) and joined into a
  torch.distributed group (nccl on GPU, gloo on CPU); rank 0 gives
  MASTER_ADDR/MASTER_PORT. Batches are split into equal row shards (filler rows
  with an empty loss mask even them out) and results come back in row order.
- `update(batch, step)`: `ppo_epochs` passes over mini-batches of
  `ppo_mini_batch_size` rows (global, shuffled per epoch with a permutation
  seeded by the run's seed and `step`), one optimizer step each; every rank
  splits its share into micro-batches of `ppo_micro_batch_size_per_gpu` rows,
  and each micro-batch's loss is weighted by its share of the mini-batch's loss
  tokens (or rows, for the seq-mean modes), counted over all ranks. AdamW,
  linear warmup over `lr_warmup_steps` optimizer steps, gradient clipping.
- Ranks by role: `PolicyWorker` (grl/workers/policy.py: the policy, the
  reference as the policy without updates, the engine, the PPO loss) and
  `CriticWorker` (grl/workers/critic.py: the value model and its loss), both a
  `Worker` (grl/workers/worker.py) with its update loop (update.py).
- Non-finite data never reaches a rank: the trainer drops it once, on the
  driver (grl/trainer/transforms.py); a non-finite gradient norm skips the step
  (`*/skipped_steps`, a log line); checkpoints and exports refuse NaN/inf.
- `save_checkpoint(dir)` writes dcp/ (each rank's shards of the weights and
  optimizer state, torch.distributed.checkpoint; grl/workers/sharded.py),
  state.pt (the learning-rate scheduler) and rng_rank<r>.pt;
  `load_checkpoint(dir)` restores all of them, each rank reading only its own
  shards, so a resumed CPU run continues
  bit for bit. The rollout engine's own sampling RNG is not part of it: give
  `SamplingParams.seed` for reproducible rollouts.
- `actor_rollout_ref.hybrid_engine=false` puts the engine in a rollout worker of its own
  (grl/workers/rollout_worker.py); `weights_handle()` hands the actor's weights over for it to load
  later (`engine.load_weights(handle, version)`), or raise `WeightSyncTimeout`.
- A rank that dies raises `WorkerDiedError` ("actor rank 1 died: ...") from
  the call that noticed; `shutdown()` always works, also twice.
"""

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

from grl.workers.engine_proxy import EngineProxy
from grl.workers.group import ActorRolloutRefGroup, CriticGroup
from grl.workers.rollout_worker import WeightSyncTimeout
from grl.workers.runtime import WorkerDiedError, init_ray
from grl.workers.sharding import plan_minibatches

log = logging.getLogger("grl.workers")


def start_groups(
    run, plan, engines_last: bool | None = None
) -> tuple[ActorRolloutRefGroup, CriticGroup | None]:
    """The actor group and, where the plan has a critic, the critic group, started side by side: each
    group's ranks start their processes and load their model while the other's do, each from its typed
    section of `run` (grl.schema.RunSections). A group that started is shut down when the other fails
    (or the start is interrupted).

    `engines_last` (default: on GPU) builds the colocated rollout engines only once every group has
    loaded. vLLM sizes its KV cache from the free memory it profiles while it is built and charges any
    drop in the device's memory meanwhile to itself; a critic loading on the same GPU would shrink the
    cache by its own size, differently from run to run, and memory freed during the profile trips vLLM's
    own check (vllm/v1/worker/gpu_worker.py, determine_available_memory). On CPU the engine profiles no
    device and keeps building beside the critic's load."""
    init_ray(run.trainer.ray_address)
    engines_last = plan.device == "cuda" if engines_last is None else engines_last
    started = time.time()
    pool = ThreadPoolExecutor(2, thread_name_prefix="grl-start")
    starts = [
        pool.submit(
            ActorRolloutRefGroup,
            run.actor_rollout_ref,
            plan,
            run.trainer,
            run.rollout,
            not engines_last,
            run.teacher.model_path,
        ),
        *(
            [
                pool.submit(
                    CriticGroup,
                    run.critic,
                    plan,
                    run.trainer,
                    run.rollout,
                    run.actor_rollout_ref.actor.logits_chunk_size,
                )
            ]
            if plan.use_critic
            else []
        ),
    ]
    try:
        groups = [start.result() for start in starts]
        if engines_last:
            groups[0].build_engines()
        log.info("start-up: %s", startup_summary(groups, started))
    except BaseException:
        for start in starts:
            start.add_done_callback(_shut_down_if_started)
        raise
    finally:
        pool.shutdown(wait=False)
    return groups[0], (groups[1] if len(groups) > 1 else None)


def startup_summary(groups: list, started: float) -> str:
    """Seconds after `started` at which each group's ranks had loaded and its engines were built."""
    parts = []
    for group in groups:
        times = group.call("startup_times")
        loaded = max(t["loaded"] for t in times)
        parts.append(f"{group.role} loaded at {loaded - started:.1f} s")
        built = [t["engine_ready"] for t in times if "engine_ready" in t]
        if built:
            parts.append(f"its engines built at {max(built) - started:.1f} s")
    return ", ".join(parts)


def _shut_down_if_started(start: Future) -> None:
    if start.exception() is None:
        start.result().shutdown()


__all__ = [
    "ActorRolloutRefGroup",
    "CriticGroup",
    "EngineProxy",
    "WeightSyncTimeout",
    "WorkerDiedError",
    "init_ray",
    "plan_minibatches",
    "start_groups",
]
