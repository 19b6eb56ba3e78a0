"""The local OpenEnv servers of the `openenv` env (grl/envs/openenv_env.py): an app started with uvicorn in a
child process on 127.0.0.1 and a free port (no Docker), and shared within this process.

`acquire(app, app_kwargs, shared=..., start_timeout_s=...)` gives the running server of that app and its
kwargs, starting it for the first env to ask (or again, if it died); `release(server)` is each env's goodbye,
and the last one out stops the process. An unshared server belongs to one env. A process that outlives its
envs (never released) is stopped when its `LocalServer` is collected or this interpreter exits.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import weakref

SERVER_MODULE = "grl.envs.openenv_servers"  # what the child runs (`python -m`), and how to find it among processes


class OpenEnvError(RuntimeError):
    """A failed exchange with an OpenEnv server, or a local one that did not start."""


class LocalServer:
    """A server process and the number of GRL envs using it."""

    def __init__(self, key: str | None):
        self.key = key  # its place among the shared servers; None: one env's own
        self.url: str | None = None
        self.stop = None  # the finalizer that stops the process
        self.process: subprocess.Popen | None = None
        self.users = 0

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def running(self) -> bool:
        return self.url is not None and self.process is not None and self.process.poll() is None


_SHARED: dict[str, LocalServer] = {}  # (app, app_kwargs) -> its server, within this process
_SHARED_LOCK = threading.Lock()


def acquire(app: str, app_kwargs: dict | None, *, shared: bool, start_timeout_s: float) -> LocalServer:
    """A running server of `app` for one more env; OpenEnvError when it does not start."""
    if not shared:
        server = LocalServer(None)
        _start(server, app, app_kwargs, start_timeout_s)
        server.users = 1
        return server
    key = json.dumps([app, app_kwargs], sort_keys=True)
    with _SHARED_LOCK:
        server = _SHARED.setdefault(key, LocalServer(key))
        if not server.running():  # never started, or died: the envs still on it fail on their own
            server.users = 0
            _start(server, app, app_kwargs, start_timeout_s)
        server.users += 1
        return server


def release(server: LocalServer) -> None:
    """One env is done with `server`; the last one stops it."""
    with _SHARED_LOCK:
        server.users -= 1
        if server.users <= 0 and server.stop is not None:
            server.stop()
            if server.key is not None and _SHARED.get(server.key) is server:
                del _SHARED[server.key]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(proc: subprocess.Popen, log) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:  # a frozen server takes no SIGTERM
            proc.kill()
            proc.wait()
    log.close()


def _start(server: LocalServer, app: str, app_kwargs: dict | None, start_timeout_s: float) -> None:
    port = _free_port()
    log = tempfile.TemporaryFile()
    # The child imports what this process can: the app's package may live on a path added at run time.
    child_env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    kwargs = "" if app_kwargs is None else json.dumps(app_kwargs)
    proc = subprocess.Popen(
        [sys.executable, "-m", SERVER_MODULE, app, kwargs, str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=log,
        env=child_env,
    )
    server.stop, server.process, server.url = weakref.finalize(server, _stop, proc, log), proc, None
    url = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # a proxy must not see 127.0.0.1
    deadline = time.monotonic() + start_timeout_s
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            with opener.open(f"{url}/health", timeout=1):
                server.url = url
                return
        except OSError:
            time.sleep(0.1)
    rc = proc.poll()
    log.seek(0)
    lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    server.stop()
    why = f"exited with code {rc}" if rc is not None else f"did not answer within {start_timeout_s:g}s"
    raise OpenEnvError(f"openenv ({app}): the server at {url} {why}" + (f": {lines[-1]}" if lines else ""))


def _serve(app: str, app_kwargs: str, port: str) -> None:
    """The child process of a local server: OpenEnv's FastAPI app under uvicorn."""
    import uvicorn
    from uvicorn.importer import import_from_string

    target = import_from_string(app)
    if app_kwargs:
        target = target(**json.loads(app_kwargs))
    uvicorn.run(target, host="127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    _serve(*sys.argv[1:4])
