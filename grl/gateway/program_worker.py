"""The processes an agent program runs in. grl/gateway/program_pool.py starts one template process per pool
(`python -m grl.gateway.program_worker <fd> [program]`): it imports `openai` and the program's module once,
then forks the pool's workers from itself on request, so that a worker starts in milliseconds and none pays
for the imports again. A worker (`_fork_worker`) runs in a session (and process group) of its own and plays
one episode at a time for as long as its pool keeps it.

A worker reads a `ProgramCall` from its own connection, says `("started",)`, calls the program with a client
of the episode's URL (an `openai.AsyncOpenAI` under asyncio for an `async def` program, an `openai.OpenAI`
otherwise) and answers `("done", value, traceback, rss_bytes, leftover_pids, error_kind)` (or `("bad_program",
why)`
when the path names no program): `value` is `reward_of` the
result (or the `ProgramValueError` saying why it is none), and a returned function of the final messages
is evaluated here, after asking the pool for them with `("messages",)`. The worker is a child subreaper, so
a daemon its program started is still its descendant and can be named.

The template reads `("fork",)` followed by the new worker's socket (`send_handle`) and answers
`("forked", pid)`; it says `("ready",)` once its imports are done, and `("exited", pid, returncode)` when a
worker ended (it reaps them). It exits, ending its workers, when its pool's process does or closes its
connection; a worker exits when its template does, so that a trainer killed outright leaves nothing
waiting. The template runs no thread of its own so that forking it is safe; a program module that starts
threads at import is forked all the same (as by `multiprocessing`'s fork start method), its workers without
those threads.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import os
import select
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle

import psutil

from grl.envs.base import fault_kind
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


def kill_group_and_tree(group: int, tree: list[int]) -> None:
    """SIGKILL the process group `group` and every process of `tree` (which catches those that left the
    group)."""
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


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


def main(fd: int, program: str | None) -> None:
    """The template: imports what every worker needs once, then forks workers until its pool is gone."""
    import openai  # noqa: F401 - before the first call, so that a program's clock does not count it

    conn = Connection(fd)
    if program:
        try:
            load_program(program)
        except BaseException:  # noqa: BLE001 - each worker loads it again and reports why it failed (bad_program)
            pass
    conn.send(("ready",))
    pool = os.getppid()
    workers: dict[int, int] = {}  # pidfd -> pid of the workers alive
    try:
        while os.getppid() == pool:
            readable = select.select([conn.fileno(), *workers], [], [], 1.0)[0]
            for pidfd in set(readable) & set(workers):
                pid = workers.pop(pidfd)
                os.close(pidfd)
                conn.send(("exited", pid, _returncode(os.waitpid(pid, 0)[1])))
            if conn.fileno() in readable:
                conn.recv()  # ("fork",): the only request
                handle = recv_handle(conn)
                pid = _fork_worker(handle, conn, list(workers))
                os.close(handle)
                workers[os.pidfd_open(pid)] = pid
                conn.send(("forked", pid))
    except (EOFError, OSError):
        pass  # the pool closed its end, or its process ended
    for pid in workers.values():
        kill_group_and_tree(pid, [pid, *descendants(pid)])
    os._exit(0)


def _fork_worker(handle: int, template_conn: Connection, template_fds: list[int]) -> int:
    for stream in (sys.stdout, sys.stderr):  # what the template wrote is not written again by each worker
        stream.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 0
    try:
        template_conn.close()
        for fd in template_fds:
            os.close(fd)
        os.setsid()
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        if "numpy" in sys.modules:  # a forked worker would draw its template's numbers, not fresh ones
            sys.modules["numpy"].random.seed()
        _serve(Connection(handle))
    except BaseException:  # noqa: BLE001 - never return into the template's loop
        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def _serve(conn: Connection) -> None:
    threading.Thread(
        target=_exit_with_parent, args=(os.getppid(),), name="grl-orphan-watch", daemon=True
    ).start()
    while True:
        try:
            call = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(("started",))
        conn.send(_play(conn, call))


def _returncode(status: int) -> int:
    """As `subprocess` gives it: the exit code, or minus the signal that ended the process."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _play(conn: Connection, call: ProgramCall) -> tuple:
    try:
        program = load_program(call.program)
    except ValueError as err:
        return ("bad_program", str(err))
    value = error = kind = None
    try:
        result = _call(program, call)
        if callable(result):
            conn.send(("messages",))
            result = result(conn.recv())
        value = reward_of(result)
    except ProgramValueError as err:
        value = err
    except BaseException as err:  # noqa: BLE001 - a program may raise anything (SystemExit too); it ends only its episode
        error, kind = traceback.format_exc(), fault_kind(err)
    _reap_children()
    leftovers = descendants(os.getpid())
    return ("done", value, error, rss_bytes([os.getpid(), *leftovers]), leftovers, kind)


def _call(program, call: ProgramCall):
    import openai

    client_args = {
        "base_url": call.base_url,
        "api_key": "grl",
        "max_retries": 0,
        "timeout": call.client_timeout,
    }
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
    main(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
