"""The rollout engine in a worker of its own (`actor_rollout_ref.hybrid_engine=false`).

Colocated (the default), the engine lives in the actor's ranks and generation and training take
turns on the same cores or GPUs. Apart, it is one Ray actor beside the actor group: generation can
run while the actor trains (`rollout.max_staleness` > 0, grl/trainer/pipeline.py). It holds one
engine and no torch.distributed group; new weights reach it as a handle to a copy the actor's rank 0
put in Ray's object store (`ActorRolloutRefGroup.weights_handle`), which the trainer passes on
between rollouts, so an episode is never sampled by two versions of the policy.

On CPU, while rollouts run ahead, the engine takes its share of the node's cores and the actor's
ranks the rest (`RunPlan.cpu_threads`); on GPU it asks Ray for a GPU of its own.
"""

from __future__ import annotations

import logging

import torch

from grl.engines.base import (
    Engine,
    EngineOptions,
    GenerationOutput,
    NamedTensors,
    SamplingParams,
    usable_cores,
)
from grl.engines.weights import SyncCheck, check_sync, raise_on_mismatch, tensor_digest
from grl.errors import first_line
from grl.run_plan import RunPlan
from grl.workers.runtime import WorkerDiedError, worker_runtime_env

log = logging.getLogger("grl.workers")

ENGINE_START_TIMEOUT_S = 900  # a vLLM engine compiles and profiles memory before it answers


class WeightSyncTimeout(RuntimeError):
    """The rollout engine did not take new weights within `rollout.weight_sync_timeout`."""


def engine_options(rollout, dtype: str, plan: RunPlan, seed: int) -> EngineOptions:
    """The options of the engine `rollout` (the typed actor_rollout_ref.rollout) describes, for the model in
    `dtype`, built on the plan's device with sampling seed `seed` (the run's plus the rank that builds it)."""
    return EngineOptions(
        dtype=dtype,
        device=plan.device,
        seed=seed,
        grammar=plan.reply_grammars,  # some task's requests carry a reply grammar
        max_model_len=rollout.max_model_len or rollout.prompt_length + rollout.response_length,
        gpu_memory_utilization=rollout.gpu_memory_utilization,
        enforce_eager=rollout.enforce_eager,
        tensor_model_parallel_size=rollout.tensor_model_parallel_size,
        free_cache_engine=rollout.free_cache_engine,
        kv_cache_gb=plan.kv_cache_gib,
    )


def build_engine(section, plan: RunPlan, name: str, seed: int) -> Engine:
    """The engine `name` (the plan's) for the typed actor_rollout_ref `section`, built where it will run."""
    from grl.engines import make_engine

    options = engine_options(section.rollout, section.model.dtype, plan, seed)
    return make_engine(name, section.model.path, options)


class RolloutWorker:
    """The Ray actor: one engine, called one request at a time."""

    def __init__(self, section, plan: RunPlan, seed: int):
        logging.basicConfig(level=logging.INFO, format="%(asctime)s rollout %(message)s")
        if plan.device == "cpu":
            torch.set_num_threads(plan.cpu_threads(usable_cores(), engine=True))
        # The plan's engine, as the colocated ranks build it (not rollout.name's `auto` resolved again here,
        # on a node that may differ from the driver's), and the seed of the colocated engine in rank 0, so
        # that a run with the engine apart samples as one with it in.
        self.engine = build_engine(section, plan, plan.engine, seed)

    def ready(self) -> bool:
        return True

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, constraints=None
    ) -> list[GenerationOutput]:
        return self.engine.generate(prompts, sampling, constraints)

    def rows_within(self, row_tokens: int) -> int | None:
        return self.engine.rows_within(row_tokens)

    def update_weights(self, named_tensors: NamedTensors) -> dict:
        """Load them; -> the engine's digest of what it then holds (`Engine.weights_digest`)."""
        self.engine.update_weights(named_tensors)
        return self.engine.weights_digest()

    def execute(self, fn, *args):
        """Run `fn(self, *args)` here (fault injection in tests)."""
        return fn(self, *args)

    def teardown(self) -> None:
        self.engine.shutdown()


class SeparateEngine(Engine):
    """The rollout worker as the driver sees it: an Engine, plus `load_weights(handle)`."""

    def __init__(self, section, plan: RunPlan, weight_sync_timeout: float, seed: int):
        """`section`: the typed actor_rollout_ref the engine is built from."""
        import ray

        options = {
            "num_cpus": 0,
            "runtime_env": worker_runtime_env(),
        }
        device = plan.device
        if device == "cuda":
            if ray.available_resources().get("GPU", 0) < 1:  # the actor's placement group holds the rest
                raise RuntimeError(
                    "actor_rollout_ref.hybrid_engine=false: the rollout engine needs a GPU of its own "
                    f"and the Ray cluster has none free ({ray.cluster_resources().get('GPU', 0):g} in "
                    "all); lower trainer.n_gpus_per_node by one"
                )
            options["num_gpus"] = 1
        self._worker = None
        self.timeout = weight_sync_timeout
        self._stuck = False
        self.last_check: SyncCheck | None = (
            None  # the engine's weights against the trainer's, at the last load
        )
        self._worker = ray.remote(RolloutWorker).options(**options).remote(section, plan, seed)
        ready, _ = ray.wait([self._worker.ready.remote()], timeout=ENGINE_START_TIMEOUT_S)
        if not ready:
            self.shutdown()
            raise RuntimeError(
                f"the rollout worker did not start in {ENGINE_START_TIMEOUT_S} s"
                + (" (on GPU it needs a GPU beside the actor's n_gpus_per_node)" if device == "cuda" else "")
            )
        self._get(ready[0])

    def _get(self, ref, timeout: float | None = None):
        import ray
        from ray.exceptions import RayActorError

        try:
            return ray.get(ref, timeout=timeout)
        except RayActorError as err:
            raise WorkerDiedError(f"rollout worker died: {first_line(err)}", worker="rollout worker") from err

    def generate(
        self, prompt_token_ids: list[list[int]], sampling: SamplingParams, constraints: list | None = None
    ) -> list[GenerationOutput]:
        return self._get(
            self._worker.generate.remote([list(p) for p in prompt_token_ids], sampling, constraints)
        )

    def rows_within(self, row_tokens: int) -> int | None:
        return self._get(self._worker.rows_within.remote(row_tokens))

    def load_weights(self, handle, version: int) -> None:
        """The weights `handle` names (`ActorRolloutRefGroup.weights_handle`: the weights' reference and
        their digests as they left the trainer) into the engine, checked against what it then holds
        (WeightsMismatch where they differ); a transfer that takes longer than
        `rollout.weight_sync_timeout` raises WeightSyncTimeout."""
        from ray.exceptions import GetTimeoutError

        weights, sent = handle
        try:
            held = self._get(self._worker.update_weights.remote(weights), timeout=self.timeout)
        except GetTimeoutError:
            self._stuck = True
            raise WeightSyncTimeout(
                f"the rollout engine did not load the weights of policy version {version} within "
                f"{self.timeout:g} s (rollout.weight_sync_timeout)"
            ) from None
        where = "the rollout worker" + (f" (policy version {version})" if version >= 0 else "")
        self.last_check = raise_on_mismatch(check_sync(sent, held), where)

    def update_weights(self, named_tensors: NamedTensors) -> None:
        import ray

        items = list(named_tensors.items()) if hasattr(named_tensors, "items") else list(named_tensors)
        sent = {name: tensor_digest(tensor) for name, tensor in items}
        self.load_weights(
            (ray.put([(name, tensor.detach().cpu()) for name, tensor in items]), sent), version=-1
        )

    def execute(self, fn, *args):
        return self._get(self._worker.execute.remote(fn, *args))

    def shutdown(self, timeout: float = 10.0) -> None:
        import ray

        if self._worker is None or not ray.is_initialized():
            return
        worker, self._worker = self._worker, None
        try:
            # A worker past its weight-sync deadline is still in the transfer: it would answer only after.
            ray.wait([worker.teardown.remote()], timeout=0 if self._stuck else timeout)
        except Exception as err:  # noqa: BLE001 - the actor may be gone already
            log.debug("rollout worker teardown: %s", err)
        try:
            ray.kill(worker)
        except Exception as err:  # noqa: BLE001
            log.debug("rollout worker kill: %s", err)
