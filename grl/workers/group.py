"""Driver side of the workers: the worker groups and the dispatch of calls to their ranks.

A worker group is N Ray actors (ranks) of one role placed on the bundles of a
placement group (one bundle per GPU, or per rank on CPU) and joined into one
torch.distributed group. The driver splits a batch into equal shards, calls
the same method on every rank and stitches the results back in row order; with
`rollout.packing` the ranks get the rows packed (grl/workers/sharding.py) and the
results come back one row per episode all the same.
Actor and critic groups of the same size share one placement group, so on GPU
rank i of each role lives on GPU i (colocated, as in verl).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from grl.engines.base import Engine
from grl.engines.weights import SyncCheck, raise_on_mismatch
from grl.rollout.types import Batch
from grl.run_plan import RunPlan
from grl.schema import ActorRolloutRef, Critic, Rollout, Trainer
from grl.sections import typed_section
from grl.workers.dispatch import FaultAwareDispatch, stop_ranks
from grl.workers.engine_proxy import EngineProxy
from grl.workers.runtime import acquire_pool, check_device, init_ray, release_pool, worker_runtime_env
from grl.workers.sharding import (
    computed_work,
    equal_shards,
    minibatch_shards,
    pack,
    pad_rows,
    pick,
    row_capacity,
    unpack,
)

log = logging.getLogger("grl.workers")

# Ranks take a fraction of their bundle so that several groups (actor,
# critic, a second actor while a test compares two) can share one bundle.
GROUPS_PER_BUNDLE = 4
TEARDOWN_TIMEOUT_S = 10  # a rank stuck in a collective (a peer died) is killed after this
# A step's mini-batch shuffle is seeded by the run's seed and the step (step 1: offset 0), so a
# resumed run draws the same mini-batches without the driver restoring anything.
SHUFFLE_SEED_STRIDE = 1_000_003

CONSTRAINT_KEYS = ("constraint_size", "constraint_ids")  # present when replies were decoded under a grammar
ACTOR_KEYS = (
    "input_ids",
    "attention_mask",
    "position_ids",
    "context_ids",
    "loss_mask",
    "advantages",
    "old_log_probs",
    "ref_log_probs",
    "rollout_log_probs",
    *CONSTRAINT_KEYS,
)
CRITIC_KEYS = ("input_ids", "attention_mask", "position_ids", "context_ids", "loss_mask", "values", "returns")
# loss_mask: log-probs are needed where it is, and packing finds a prompt's end by it (rollout.share_prompts)
SCORE_KEYS = ("input_ids", "attention_mask", "position_ids", "context_ids", "loss_mask")
POLICY_SCORE_KEYS = SCORE_KEYS + CONSTRAINT_KEYS


# ---------------------------------------------------------------- groups


class _WorkerGroup(FaultAwareDispatch):
    """N ranks of one role; shared plumbing of the actor and critic groups."""

    def __init__(
        self, worker_class: type, plan: RunPlan, section, trainer: Trainer, rollout: Rollout, rank_args
    ):
        """`plan.world_size` ranks of `worker_class` (grl/workers/policy.py or critic.py) on trainer.nnodes
        nodes, each built with (rank, plan, section, trainer, *rank_args(rank)); `section` is the
        role's typed config section; `rollout` says whether packed rows share prompts
        (rollout.share_prompts)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        size = plan.world_size
        if size < 1:
            raise ValueError(f"a worker group needs at least one rank, got {size}")
        self.role, self.plan, self.section, self.size = worker_class.role, plan, section, size
        self.seed, self.share_prompts = trainer.seed, rollout.share_prompts
        self.device = check_device(plan.device)
        self.workers: list = []
        self.nodes: list[str] = []  # the Ray node id of each rank
        self._abandoned: list = []  # results of peers of a failed rank, collected at shutdown
        self._closed = False
        nnodes = trainer.nnodes
        pg = acquire_pool(size, self.device, nnodes)
        self._pool = (size, self.device, nnodes)
        bundle = pg.bundle_specs[0]
        options = {
            "num_cpus": bundle["CPU"] / GROUPS_PER_BUNDLE,
            "runtime_env": worker_runtime_env(),
        }
        if self.device == "cuda":
            options["num_gpus"] = 1.0 / GROUPS_PER_BUNDLE
        remote = ray.remote(worker_class)
        try:
            for rank in range(size):
                strategy = PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=rank
                )
                self.workers.append(
                    remote.options(scheduling_strategy=strategy, **options).remote(
                        rank, plan, section, trainer, *rank_args(rank)
                    )
                )
            self.nodes = self._gather([w.node_id.remote() for w in self.workers], list(range(size)))
            one_node = len(set(self.nodes)) == 1
            if not one_node:
                log.info(
                    "%s group: %d ranks on %d nodes %s", self.role, size, len(set(self.nodes)), self.nodes
                )
            master_addr, master_port = self._gather([self.workers[0].listen.remote(one_node)], [0])[0]
            self.call("setup", master_addr, master_port)
        except BaseException:
            self.shutdown()
            raise

    def call(self, method: str, *args) -> list:
        """`method(*args)` on every rank."""
        self._check_open()
        return self._gather([getattr(w, method).remote(*args) for w in self.workers], list(range(self.size)))

    def call_sharded(self, method: str, shards: list, *args) -> list:
        """`method(shards[i], *args)` on rank i."""
        self._check_open()
        refs = [getattr(w, method).remote(s, *args) for w, s in zip(self.workers, shards)]
        return self._gather(refs, list(range(self.size)))

    def call_ranks(self, ranks: list[int], method: str, per_rank_args: list[tuple]) -> list:
        self._check_open()
        refs = [getattr(self.workers[r], method).remote(*a) for r, a in zip(ranks, per_rank_args)]
        return self._gather(refs, ranks)

    def execute(self, fn, *args) -> list:
        """Run `fn(worker, *args)` on every rank (debugging and fault injection)."""
        return self.call("execute", fn, *args)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the {self.role} group has been shut down")

    def _score(self, method: str, tensors: dict[str, torch.Tensor], *args) -> list[torch.Tensor]:
        """The per-token results of `method` (a tensor or a tuple of them per rank), each `[B, T]`
        like the batch's rows, whether the ranks computed them on those rows or on packed ones."""
        if len(tensors["input_ids"]) == 0:
            raise ValueError(f"{self.role}.{method}: the batch has no rows")
        capacity = self.plan.packing_capacity
        sent, where = (
            pack(tensors, row_capacity(tensors, capacity), self.share_prompts)
            if capacity is not None
            else (tensors, None)
        )
        padded, rows = pad_rows(sent, self.size)
        results = [
            r if isinstance(r, tuple) else (r,)
            for r in self.call_sharded(method, equal_shards(padded, self.size), *args)
        ]
        outs = [torch.cat([r[j] for r in results])[:rows] for j in range(len(results[0]))]
        return outs if where is None else [unpack(o, where, tensors["input_ids"].shape[1]) for o in outs]

    def _update(self, batch: Batch, keys: tuple[str, ...], train_cfg, step: int) -> dict[str, float]:
        seed = self.seed * SHUFFLE_SEED_STRIDE + step - 1
        shards = minibatch_shards(
            pick(batch, keys), train_cfg, self.size, seed, self.plan.packing_capacity, self.share_prompts
        )
        work = computed_work(sum(shards, []))
        return {
            **self.call_sharded("update", shards)[0],
            **{f"perf/{self.role}/computed_{k}": float(v) for k, v in work.items()},
        }

    # -- checkpoints

    # Paths go to the ranks absolute: a rank's working directory need not be the driver's.

    def save_checkpoint(self, path: str) -> None:
        self.call("save_checkpoint", str(Path(path).resolve()))

    def load_checkpoint(self, path: str) -> None:
        self.call("load_checkpoint", str(Path(path).resolve()))

    # -- lifetime

    def shutdown(self, timeout: float = TEARDOWN_TIMEOUT_S) -> None:
        """Stop every rank (engines first), giving them `timeout` seconds to tear
        down before they are killed (0 on Ctrl-C/SIGTERM: a rank in the middle of
        an update would only answer after it). Works after a rank died and twice."""
        import ray

        if self._closed:
            return
        self._closed = True
        if self.workers and ray.is_initialized():
            stop_ranks(self.workers, self._abandoned, timeout)
        self.workers, self._abandoned = [], []
        if ray.is_initialized():
            release_pool(*self._pool)


class ActorRolloutRefGroup(_WorkerGroup):
    """Policy (trained), reference model (frozen, if the plan uses one) and the rollout
    engine: inside every rank on GPU, inside rank 0 on CPU (the vllm engine
    then runs in a process of its own that the engines package starts); or, with
    `actor_rollout_ref.hybrid_engine=false`, in a rollout worker of its own
    (grl/workers/rollout_worker.py), which waits `weight_sync_timeout` seconds (rollout.weight_sync_timeout)
    for the trained weights. `engines_in_setup=False` leaves the ranks' engines to `build_engines`."""

    @classmethod
    def from_config(cls, cfg, plan: RunPlan, engines_in_setup: bool = True) -> ActorRolloutRefGroup:
        """The group of a checked config's `actor_rollout_ref` section."""
        return cls(
            typed_section(cfg, "actor_rollout_ref"),
            plan,
            typed_section(cfg, "trainer"),
            typed_section(cfg, "rollout"),
            engines_in_setup,
            teacher_path=cfg.teacher.model_path,
        )

    def __init__(
        self,
        section: ActorRolloutRef,
        plan: RunPlan,
        trainer: Trainer,
        rollout: Rollout,
        engines_in_setup: bool = True,
        teacher_path: str | None = None,
    ):
        """`teacher_path`: the frozen teacher each rank loads beside the reference (the plan's local teacher:
        on-policy distillation), sharded like it."""
        from grl.workers.policy import PolicyWorker
        from grl.workers.rollout_worker import SeparateEngine

        self.use_ref, self.separate = plan.use_reference, plan.engine_apart
        self._last_check: SyncCheck | None = None
        init_ray()
        self.engine_name = plan.engine
        engine_ranks = plan.engine_ranks()
        self.engine_ranks = list(engine_ranks)
        super().__init__(
            PolicyWorker,
            plan,
            section,
            trainer,
            rollout,
            lambda rank: (self.engine_name if rank in engine_ranks else None, engines_in_setup, teacher_path),
        )
        try:
            self.engine: Engine = (
                SeparateEngine(section, plan, rollout.weight_sync_timeout, trainer.seed)
                if self.separate
                else EngineProxy(self, self.engine_ranks)
            )
        except BaseException:
            self.shutdown()
            raise
        log.info(
            "actor group: %d ranks on %s, rollout engine %s %s%s%s",
            plan.world_size,
            self.device,
            self.engine_name,
            "in a worker of its own" if self.separate else f"in rank(s) {list(engine_ranks)}",
            ", with reference model" if self.use_ref else "",
            f", with teacher {teacher_path}" if teacher_path else "",
        )

    def build_engines(self) -> None:
        """Build the rollout engines of the ranks that hold one, if the group was made with
        engines_in_setup=False. Collective: on GPU every rank holds an engine, and vLLM forms its groups
        over the ranks' process group (grl/engines/vllm_engine.py)."""
        self.call_ranks(self.engine_ranks, "build_engine", [()] * len(self.engine_ranks))

    def compute_log_probs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """(old_log_probs, entropy), `[B, T]`, aligned with `loss_mask`."""
        log_probs, entropy = self._score("compute_log_probs", pick(batch, POLICY_SCORE_KEYS), "policy")
        return log_probs, entropy

    def compute_ref_log_probs(self, batch: Batch) -> torch.Tensor:
        if not self.use_ref:
            raise RuntimeError(
                "compute_ref_log_probs: the run's plan has no reference (no KL loss or KL in reward)"
            )
        return self._score("compute_log_probs", pick(batch, POLICY_SCORE_KEYS), "ref")[0]

    def compute_teacher_log_probs(self, batch: Batch) -> torch.Tensor:
        """The local teacher's log-probs of the batch's tokens, `[B, T]`, scored as the reference's are: the
        student's sampling temperature and allowed sets, packing and context windows alike."""
        if self.plan.teacher != "local":
            raise RuntimeError(
                "compute_teacher_log_probs: the run's plan has no local teacher (teacher.model_path)"
            )
        return self._score("compute_log_probs", pick(batch, POLICY_SCORE_KEYS), "teacher")[0]

    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """PPO epochs over mini-batches (shuffled by the run's seed and `step`); needs advantages and
        loss_mask (ref_log_probs too when use_kl_loss), all finite, and old_log_probs unless the update
        is one epoch over one mini-batch (then its own log-probs are the old ones)."""
        for key in ("advantages", "loss_mask"):
            if key not in batch:
                raise KeyError(f"actor update: the batch has no {key!r}")
        return self._update(batch, ACTOR_KEYS, self.section.actor, step)

    def sync_weights(self) -> None:
        """Push the actor's current weights into the rollout engine(s), in memory, and check that each
        engine holds what was sent: WeightsMismatch (grl/engines/weights.py) where one does not."""
        if self.separate:
            self.engine.load_weights(self.weights_handle(), version=-1)
            return
        checks = self.call("sync_weights")
        for rank in self.engine_ranks:
            raise_on_mismatch(checks[rank], f"the engine of actor rank {rank}")
        self._last_check = SyncCheck(sum(checks[rank].tensors for rank in self.engine_ranks), ())

    @property
    def weights_check(self) -> SyncCheck | None:
        """The last sync's check of the engines' weights (None before the first)."""
        return self.engine.last_check if self.separate else self._last_check

    def weights_handle(self):
        """A handle to a copy of the actor's current weights (with their digests), for a rollout worker
        of its own: `engine.load_weights(handle, version)` loads and checks them, at any later time."""
        return self.call("engine_weights")[0][0]

    def shutdown(self, timeout: float = TEARDOWN_TIMEOUT_S) -> None:
        engine = getattr(self, "engine", None)
        if getattr(self, "separate", False) and engine is not None:
            engine.shutdown(timeout)
        super().shutdown(timeout)

    def export_hf(self, path: str) -> None:
        self.call("export_hf", str(Path(path).resolve()))


class CriticGroup(_WorkerGroup):
    """The value model: the policy's backbone with a scalar head."""

    @classmethod
    def from_config(cls, cfg, plan: RunPlan) -> CriticGroup:
        """The group of a checked config's `critic` section."""
        return cls(
            typed_section(cfg, "critic"),
            plan,
            typed_section(cfg, "trainer"),
            typed_section(cfg, "rollout"),
            cfg.actor_rollout_ref.actor.logits_chunk_size,
        )

    def __init__(
        self, section: Critic, plan: RunPlan, trainer: Trainer, rollout: Rollout, logits_chunk_size: int
    ):
        """`logits_chunk_size`: the actor's (actor_rollout_ref.actor.logits_chunk_size), for every role."""
        from grl.workers.critic import CriticWorker

        init_ray()
        super().__init__(CriticWorker, plan, section, trainer, rollout, lambda rank: (logits_chunk_size,))

    def compute_values(self, batch: Batch) -> torch.Tensor:
        return self._score("compute_values", pick(batch, SCORE_KEYS))[0]

    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """As the actor's; needs returns, values and loss_mask, all finite."""
        for key in ("returns", "values", "loss_mask"):
            if key not in batch:
                raise KeyError(f"critic update: the batch has no {key!r}")
        return self._update(batch, CRITIC_KEYS, self.section, step)
