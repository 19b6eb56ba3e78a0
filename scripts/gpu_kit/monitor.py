"""Peak memory of each process of a training run, sampled from outside it while it runs.

On a GPU (NVML, nvidia-ml-py in the GPU image): the device's used memory and each process's, as the
driver accounts them (CUDA context and allocator cache included, which `perf/max_memory_allocated_gb`
leaves out). On CPU (psutil): the resident memory of the run's process tree. A process is named by its Ray
title (`ray::PolicyWorker.update` is the actor rank, `ray::CriticWorker...` the critic's), else `driver`
for the run's own process, else its executable. Samples every `interval` seconds until stop().
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

GIB = 2**30
RAY_TITLE = re.compile(r"ray::([A-Za-z_]\w*)")


def role_rank(role: str) -> int:
    """How much a name says: a worker class (2) over Ray's idle title (1) over an executable's name (0)."""
    return 1 if role == "IDLE" else 2 if role[:1].isupper() else 0


def process_role(cmdline: str, pid: int, driver_pid: int) -> str:
    if pid == driver_pid:
        return "driver"
    found = RAY_TITLE.search(cmdline)
    if found:
        return found.group(1)
    return Path(cmdline.split("\0", 1)[0].split(" ", 1)[0]).name or f"pid {pid}"


def read_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


class MemoryMonitor:
    """Starts sampling on construction; stop() returns {"source", "device_peak_gib", "processes":
    [{"role", "pid", "peak_gib"}], "samples"}."""

    def __init__(self, driver_pid: int, device: str, interval: float = 0.2):
        self.driver_pid, self.interval = driver_pid, interval
        self.peaks: dict[int, float] = {}
        self.roles: dict[int, str] = {}
        self.device_peak = 0.0
        self.samples = 0
        self.error = ""
        self._stop = threading.Event()
        self._sample = self._nvml_sampler() if device == "cuda" else self._psutil_sampler()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _note(self, pid: int, nbytes: float, cmdline: str) -> None:
        self.peaks[pid] = max(self.peaks.get(pid, 0.0), nbytes)
        # A Ray worker starts as `python .../default_worker.py`, idles as `ray::IDLE`, then takes its class's
        # title.
        role = process_role(cmdline, pid, self.driver_pid)
        if pid not in self.roles or role_rank(role) > role_rank(self.roles[pid]):
            self.roles[pid] = role

    def _nvml_sampler(self):
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.source = "nvml"

        def sample() -> None:
            self.device_peak = max(self.device_peak, float(pynvml.nvmlDeviceGetMemoryInfo(handle).used))
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.usedGpuMemory is not None:
                    self._note(proc.pid, float(proc.usedGpuMemory), read_cmdline(proc.pid))

        return sample

    def _psutil_sampler(self):
        import psutil

        self.source = "psutil"
        driver = psutil.Process(self.driver_pid)

        def sample() -> None:
            total = 0.0
            for proc in [driver, *driver.children(recursive=True)]:
                try:
                    rss, cmdline = float(proc.memory_info().rss), " ".join(proc.cmdline())
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                total += rss
                self._note(proc.pid, rss, cmdline)
            self.device_peak = max(self.device_peak, total)

        return sample

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._sample()
                self.samples += 1
            except Exception as err:  # noqa: BLE001 - a process that ends between listing and reading it
                self.error = f"{err.__class__.__name__}: {err}"
            self._stop.wait(self.interval)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(timeout=5)
        processes = [
            {"role": self.roles[pid], "pid": pid, "peak_gib": peak / GIB} for pid, peak in self.peaks.items()
        ]
        processes.sort(key=lambda p: -p["peak_gib"])
        return {
            "source": self.source,
            "device_peak_gib": self.device_peak / GIB,
            "processes": processes,
            "samples": self.samples,
            "error": self.error,
        }
