"""Run untrusted Python in a contained child process (the walls are built by grl/tools/launcher.py).

`run_python(code, limits)` starts a launcher process in a new session, which builds namespaces and
rlimits and starts the code as PID 1 of a new PID namespace (see the launcher's docstring). This
side enforces what a child cannot enforce on itself:

- wall clock: past `wall_s` the code's process (and with it its whole PID namespace) and the
  launcher's process group get SIGKILL, and the launcher is reaped;
- output: stdout and stderr share one pipe read with a cap; past `max_output_bytes` the code is
  killed the same way, so a 100 MB print costs the parent at most the cap;
- the working folder: created here as the mount point of the child's private tmpfs and removed
  afterwards (what the code wrote there lived in that tmpfs and is gone with its namespace).

Nothing here raises for what the code does: every outcome is a `SandboxResult`. `SandboxUnavailable`
is raised only when the walls cannot be built on this machine (checked once by `check_isolation`).
"""

from __future__ import annotations

import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from grl.schema import PythonSandbox as SandboxLimits  # tools.python: the limits of one call

LAUNCHER = str(Path(__file__).with_name("launcher.py"))
# Sandbox uids: one per concurrent call of this process, so RLIMIT_NPROC (counted per uid) is the
# call's own; offset by the pid so that two GRL processes rarely share one.
UID_BASE, UID_SLOTS = 200_000, 256


class SandboxUnavailable(RuntimeError):
    """The machine cannot build the sandbox's walls (no namespaces)."""


@dataclass
class SandboxResult:
    output: str  # stdout and stderr interleaved, cut at the cap
    exit_code: int | None  # None when killed by a signal
    signal: int | None
    timed_out: bool  # killed at the wall-clock limit
    output_truncated: bool  # the output passed the cap (and the code was killed for it)
    seconds: float
    setup_error: str | None = None  # the walls could not be built; the code did not run

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_truncated


class _UidSlots:
    def __init__(self):
        self._free = list(range(UID_SLOTS))
        self._lock = threading.Lock()
        self._available = threading.Semaphore(UID_SLOTS)

    def take(self) -> int:
        self._available.acquire()
        with self._lock:
            return self._free.pop()

    def give(self, slot: int) -> None:
        with self._lock:
            self._free.append(slot)
        self._available.release()

    @staticmethod
    def uid(slot: int) -> int:
        return UID_BASE + (os.getpid() % 4096) * UID_SLOTS + slot


_slots = _UidSlots()


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Run `code` with `python -I` in the sandbox; never raises for anything the code does."""
    started = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="grl-tool-")
    slot = _slots.take()
    status_read, status_write = os.pipe()
    settings = {
        "workdir": workdir,
        "uid": _UidSlots.uid(slot),
        "python": sys.executable,
        "python_dirs": sorted({os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)}),
        "status_fd": status_write,
        "isolate_network": limits.isolate_network,
        "max_dir_mb": int(limits.max_dir_mb),
        "limits": {
            "cpu_s": int(limits.cpu_s),
            "memory_mb": int(limits.memory_mb),
            "max_processes": int(limits.max_processes),
            "max_file_mb": int(limits.max_file_mb),
            "max_open_files": int(limits.max_open_files),
        },
    }
    status = _Status(status_read)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", LAUNCHER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd="/",
            env={},
            start_new_session=True,
            close_fds=True,
            pass_fds=(status_write,),
        )
    except BaseException:
        os.close(status_write)
        status.close()
        _slots.give(slot)
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    os.close(status_write)
    try:
        try:
            proc.stdin.write(json.dumps(settings).encode() + b"\n" + code.encode("utf-8", "replace"))
            proc.stdin.close()
        except BrokenPipeError:  # the launcher failed before reading; its status says why
            pass
        deadline = started + limits.wall_s
        output, timed_out, truncated = _read_capped(proc, status, deadline, limits.max_output_bytes)
        try:  # the output ends when every process of the code has ended, or when the code closed it
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        _kill(proc, status)
        proc.wait()
        status.read_all()
        status.close()
        proc.stdout.close()
        _slots.give(slot)
        shutil.rmtree(workdir, ignore_errors=True)
    return SandboxResult(
        output.decode("utf-8", "replace"),
        status.exit_code,
        status.signal,
        timed_out,
        truncated,
        time.monotonic() - started,
        status.setup_error,
    )


class _Status:
    """The launcher's status lines: the code's host pid, then how it ended (or why setup failed)."""

    def __init__(self, fd: int):
        self.fd = fd
        self.pid: int | None = None
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.setup_error: str | None = None
        self._buffer = b""

    def _parse(self, data: bytes) -> None:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            kind, _, value = line.decode(errors="replace").partition(" ")
            if kind == "pid":
                self.pid = int(value)
            elif kind == "exit":
                self.exit_code = int(value)
            elif kind == "signal":
                self.signal = int(value)
            elif kind == "setup":
                self.setup_error = value

    def read_available(self, wait: float = 0.0) -> None:
        """Read what the launcher has written; wait up to `wait` s for something."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.fd, selectors.EVENT_READ)
            while selector.select(timeout=wait):
                data = os.read(self.fd, 4096)
                if not data:
                    return
                self._parse(data)
                wait = 0.0

    def read_all(self) -> None:
        """After the launcher has exited: the rest, to EOF."""
        while data := os.read(self.fd, 4096):
            self._parse(data)

    def close(self) -> None:
        os.close(self.fd)


def _read_capped(
    proc: subprocess.Popen, status: _Status, deadline: float, cap: int
) -> tuple[bytes, bool, bool]:
    """The child's output up to `cap` bytes, until EOF, the deadline or the cap (then it is killed)."""
    chunks, size = [], 0
    fd = proc.stdout.fileno()
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                _kill(proc, status)
                return b"".join(chunks), True, False
            if not selector.select(timeout=left):
                continue
            data = os.read(fd, 65536)
            if not data:
                return b"".join(chunks), False, False
            chunks.append(data)
            size += len(data)
            if size > cap:
                _kill(proc, status)
                return b"".join(chunks)[:cap], False, True


def _kill(proc: subprocess.Popen, status: _Status) -> None:
    """SIGKILL the code's process, PID 1 of its namespace: the kernel then kills every process in it,
    and the launcher's wait for it returns once they are all reaped. The launcher reaps the code only
    after it died, so while the launcher runs the code's pid cannot have been reused. The launcher's
    process group is killed only if it has not finished two seconds later."""
    if proc.poll() is not None:
        return
    if status.pid is None:
        status.read_available(wait=1.0)  # the launcher writes the pid right after its fork
    if status.pid is not None:
        try:
            os.kill(status.pid, signal.SIGKILL)
            proc.wait(timeout=2.0)
            return
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@functools.lru_cache(maxsize=None)
def check_isolation(limits: SandboxLimits = SandboxLimits()) -> None:
    """Raise SandboxUnavailable (one line, with the way out) when this machine cannot build the walls."""
    result = run_python("pass", limits)
    if result.setup_error is not None or result.exit_code != 0:
        why = (
            result.setup_error
            or (result.output.strip().splitlines() or [f"exit code {result.exit_code}"])[-1]
        )
        raise SandboxUnavailable(
            f"the Python tool's sandbox cannot start here ({why}); it needs "
            "root or unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1). Without a "
            "network "
            "namespace only tools.python.isolate_network=false runs the tool, with the host's network"
        )
