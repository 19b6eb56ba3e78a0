"""A CPU rank's matmul peak, the denominator of `perf/mfu/actor` where no datasheet gives one.

A GPU's bf16 peak is a table entry (grl/planner/shapes.py); a CPU's depends on its kind (AMX, AVX512-BF16,
AVX2), the dtype and the threads a rank is given, so the rank measures it: `F.linear` forward and backward
at the model's MLP shape, in the dtype the update computes in, with the rank's own threads. The figure is
cached per CPU kind, dtype, threads and shape (a second run on the machine reads it instead of spending the
second again)."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROWS = 1024  # tokens per call: the update's micro-batches hold about this many (the CPU preset's 2 episodes)
MIN_SECONDS = 0.5
BURSTS = 5


def cache_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grl" / "matmul_peak.json"


def cpu_kind() -> str:
    name = next(
        (line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")),
        platform.machine(),
    )
    return f"{name} / {torch.backends.cpu.get_cpu_capability()}"


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def linear_pass(hidden: int, intermediate: int, dtype: torch.dtype):
    """One forward + backward of `F.linear` over ROWS tokens, and its FLOPs: 2 per weight per row forward,
    4 backward (the input's and the weight's gradients)."""
    x = torch.randn(ROWS, hidden, dtype=dtype, requires_grad=True)
    weight = torch.randn(intermediate, hidden, dtype=dtype, requires_grad=True)

    def once() -> None:
        F.linear(x, weight).sum().backward()

    return once, 6 * ROWS * hidden * intermediate


def measure(hidden: int, intermediate: int, dtype: torch.dtype, seconds: float = MIN_SECONDS) -> float:
    """FLOP/s of `linear_pass`: the fastest of BURSTS bursts that take `seconds` together. A neighbour on
    the cores (a rank starting beside this one, another VM's threads) only slows a burst, and two threads'
    rate at this shape varies by 2x from one half-second to the next on a shared 2-core VM, so the fastest
    burst, not the mean, is the peak."""
    once, flops = linear_pass(hidden, intermediate, dtype)
    once()  # the first call picks and caches the kernels
    rates = []
    for _ in range(BURSTS):
        calls, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / BURSTS or calls < 3:
            once()
            calls += 1
        rates.append(flops * calls / elapsed)
    return max(rates)


def cached_peak(hidden: int, intermediate: int, dtype: torch.dtype) -> float:
    """This process's peak at that shape and dtype, measured once per CPU kind and thread count."""
    # The estimator is part of the key: a figure an earlier way of measuring cached is not read back.
    shape = f"{hidden}x{intermediate}"
    key = f"{cpu_kind()} | {dtype} | {torch.get_num_threads()} threads | {shape} | fastest of {BURSTS}"
    path = cache_path()
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known, dict) or not isinstance(known.get(key), (int, float)) or known[key] <= 0:
        known = known if isinstance(known, dict) else {}
        known[key] = measure(hidden, intermediate, dtype)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
            tmp.replace(path)
        except OSError:
            pass  # an unwritable cache costs the next run half a second, nothing else
    return float(known[key])


def rank_peak(worker, hidden: int, intermediate: int) -> float:
    """Run on a policy rank (`group.execute`): its peak in the dtype its update computes in; 0 off CPU."""
    if worker.device != "cpu":
        return 0.0
    return cached_peak(hidden, intermediate, worker.module.compute_dtype)
