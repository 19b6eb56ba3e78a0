"""The process an agent program runs in: started by grl/gateway/program_pool.py as
`python -m grl.gateway.program_worker <fd>`, in a session (and process group) of its own, it plays one
episode at a time for as long as its pool keeps it.

It reads a `ProgramCall` from the connection on `fd`, says `("started",)`, calls the program with a client
of the episode's URL (an `openai.AsyncOpenAI` under asyncio for an `async def` program, an `openai.OpenAI`
otherwise) and answers `("done", value, traceback, rss_bytes, leftover_pids)` (or `("bad_program", why)`
when the path names no program): `value` is `reward_of` the
result (or the `ProgramValueError` saying why it is none), and a returned function of the final messages
is evaluated here, after asking the pool for them with `("messages",)`. The worker is a child subreaper, so
a daemon its program started is still its descendant and can be named; it exits when its pool's process
does, so that a trainer killed outright leaves no worker waiting.

This module imports only the standard library, psutil and grl.gateway.contract, so that a worker starts in
about the time `import openai` takes.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection

import psutil

from grl.gateway.contract import ProgramTask, ProgramValueError, load_program, reward_of

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


@dataclass(frozen=True)
class ProgramCall:
    """What a worker is sent to play one episode."""

    program: str  # "package.module:function"
    base_url: str  # the episode's URL on the gateway
    task: ProgramTask
    client_timeout: float  # seconds the client waits for one answer


def descendants(pid: int) -> list[int]:
    """The live (not zombie) processes below `pid`; [] once it is gone."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    return [child.pid for child in children if is_running(child.pid)]


def is_running(pid: int) -> bool:
    """Whether `pid` is a process that has not ended (a zombie has: it only waits to be reaped)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def rss_bytes(pids: list[int]) -> int:
    """Resident memory of the processes `pids`, summed (those already gone count 0)."""
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            pass
    return total


def main(fd: int) -> None:
    import openai  # noqa: F401 - before the first call, so that a program's clock does not count it

    conn = Connection(fd)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), name="grl-orphan-watch", daemon=True).start()
    while True:
        try:
            call = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(("started",))
        conn.send(_play(conn, call))


def _play(conn: Connection, call: ProgramCall) -> tuple:
    try:
        program = load_program(call.program)
    except ValueError as err:
        return ("bad_program", str(err))
    value = error = None
    try:
        result = _call(program, call)
        if callable(result):
            conn.send(("messages",))
            result = result(conn.recv())
        value = reward_of(result)
    except ProgramValueError as err:
        value = err
    except BaseException:  # noqa: BLE001 - a program may raise anything (SystemExit too); it ends only its episode
        error = traceback.format_exc()
    _reap_children()
    leftovers = descendants(os.getpid())
    return ("done", value, error, rss_bytes([os.getpid(), *leftovers]), leftovers)


def _call(program, call: ProgramCall):
    import openai

    client_args = {"base_url": call.base_url, "api_key": "grl", "max_retries": 0, "timeout": call.client_timeout}
    if inspect.iscoroutinefunction(program):

        async def play():
            async with openai.AsyncOpenAI(**client_args) as client:
                return await program(client, call.task)

        return asyncio.run(play())
    with openai.OpenAI(**client_args) as client:
        return program(client, call.task)


def _reap_children() -> None:
    """Collects children that ended (and orphans handed to this subreaper), so that they are not counted."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(1)


if __name__ == "__main__":
    main(int(sys.argv[1]))
