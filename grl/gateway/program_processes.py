"""The pool's handles on its processes: the template process each worker is forked from (it reaps them and
says how each ended), and the forked workers, killed with their process group and every process below them.
grl/gateway/program_pool.py drives them; grl/gateway/program_worker.py is what runs inside."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle

from grl.gateway.program_worker import descendants, is_running, kill_group_and_tree


class TemplateProcess:
    """The process the pool's workers are forked from; it reaps them and says how each ended."""

    def __init__(self, program: str | None):
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the trainer's imports
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "grl.gateway.program_worker",
                str(theirs.fileno()),
                *([program] if program else []),
            ],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C meant for the trainer does not reach it; it ends with its pool
            env=env,
        )
        theirs.close()
        self.conn = Connection(ours.detach())
        self.imports_program = bool(program)
        self.launched = time.monotonic()
        self.ready = False
        self.returncodes: dict[int, int] = {}  # pid -> how each of its workers ended

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def read(self, until_forked: bool = False) -> int | None:
        """Takes in what the template said; with `until_forked`, waits for the pid of the worker it forks."""
        try:
            while until_forked or self.conn.poll(0):
                message = self.conn.recv()
                if message[0] == "ready":
                    self.ready = True
                elif message[0] == "exited":
                    self.returncodes[message[1]] = message[2]
                else:
                    return message[1]
        except (EOFError, OSError):
            pass  # it ended: `alive` says so
        return None

    def wait_ready(self, grace: float) -> None:
        while not self.ready and self.alive and time.monotonic() - self.launched < grace:
            if self.conn.poll(0.05):
                self.read()

    def fork(self) -> WorkerProcess | None:
        """A new worker, or None when the template ended."""
        ours, theirs = socket.socketpair()
        try:
            self.conn.send(("fork",))
            send_handle(self.conn, theirs.fileno(), self.process.pid)
        except OSError:
            return None
        finally:
            theirs.close()
        pid = self.read(until_forked=True)
        return None if pid is None else WorkerProcess(self, pid, Connection(ours.detach()))

    def ended(self, pid: int) -> str | None:
        """How worker `pid` ended, None while it runs."""
        if pid in self.returncodes:
            return _exit_status(self.returncodes[pid])
        if not self.alive and not is_running(pid):
            return "with its template process"
        return None

    def close(self) -> None:
        self.conn.close()  # it ends its workers and exits
        try:
            self.process.wait(5.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class WorkerProcess:
    """A worker forked from `template`: the episode it plays (`key`, None when idle) and since when."""

    def __init__(self, template: TemplateProcess, pid: int, conn: Connection):
        self.template, self.pid, self.conn = template, pid, conn
        self.key = None  # the episode it plays, None when idle
        self.messages: Callable[[], list[dict]] | None = None
        self.sent = self.started = 0.0

    def tree(self) -> list[int]:
        return [self.pid, *descendants(self.pid)]

    def kill(self) -> None:
        """Ends the worker, its process group and every process below it (one that left the group too)."""
        tree = (
            self.tree() if self.template.ended(self.pid) is None else []
        )  # a reaped pid may be another's now
        kill_group_and_tree(self.pid, tree)
        while self.template.ended(self.pid) is None:  # until its template reaped it (or ended itself)
            if self.template.conn.poll(0.01):
                self.template.read()
        self.conn.close()


def _exit_status(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
