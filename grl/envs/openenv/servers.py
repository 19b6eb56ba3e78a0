"""The local OpenEnv servers of the `openenv` env (grl/envs/openenv/env.py): an app started with uvicorn in a
child process on 127.0.0.1 and a free port (no Docker), and shared within this process.

`acquire(app, app_kwargs, shared=..., start_timeout_s=...)` gives a running server of that app and its kwargs
with room for one more session, starting one when none has room (or the one there died); `release(server)` is
each env's goodbye. The child reports how many sessions its OpenEnv app takes at once (`max_concurrent_envs`,
1 in `openenv init`'s template): a server that takes any number is shared by all envs and stopped by the last
one out; one that takes a few gets envs up to that number, and once empty waits, idle, in a pool for the next
episode's env (at most `POOL_IDLE` per app), so an app of one session runs one server per episode without a
start per episode. An unshared server belongs to one env. `stop_idle()` stops the pool's idle servers; a
process that outlives its envs is stopped when its `LocalServer` is collected or this interpreter exits.
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

SERVER_MODULE = (
    "grl.envs.openenv.servers"  # what the child runs (`python -m`), and how to find it among processes
)
POOL_IDLE = (
    64  # idle servers of one app kept for the next episodes (a rollout's worth of one-session servers)
)


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
        self.capacity: int | None = None  # sessions the app takes at once; None: any number

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def running(self) -> bool:
        return self.url is not None and self.process is not None and self.process.poll() is None

    def has_room(self) -> bool:
        return self.running() and (self.capacity is None or self.users < self.capacity)


_SHARED: dict[str, list[LocalServer]] = {}  # (app, app_kwargs) -> its servers, within this process
_CAPACITY: dict[str, int | None] = {}  # (app, app_kwargs) -> sessions a server takes, once one has started
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
        servers = _SHARED.setdefault(key, [])
        for server in servers:
            if not server.running() and server.users <= 0 and server.stop is not None:
                server.stop()  # died while idle in the pool; one that died in use stays until its envs let go
        servers[:] = [server for server in servers if server.running() or server.users > 0]
        server = next((server for server in servers if server.has_room()), None)
        if server is not None:
            server.users += 1
            return server
        server = LocalServer(key)
        server.users = 1
        if (
            key not in _CAPACITY
        ):  # the first server says how many sessions a server takes: the others wait for it
            _start(server, app, app_kwargs, start_timeout_s)
            _CAPACITY[key] = server.capacity
            servers.append(server)
            return server
        servers.append(server)  # in use while it starts, so no one else takes it or stops it
    try:  # servers of few sessions each start side by side, one per env
        _start(server, app, app_kwargs, start_timeout_s)
    except BaseException:
        with _SHARED_LOCK:
            servers.remove(server)
        raise
    return server


def release(server: LocalServer) -> None:
    """One env is done with `server`: the last one stops it, or leaves it idle in the pool."""
    with _SHARED_LOCK:
        server.users -= 1
        if server.users > 0 or server.stop is None:
            return
        pool = _SHARED.get(server.key, []) if server.key is not None else []
        idle = sum(1 for other in pool if other.users <= 0 and other.running())
        if server.capacity is not None and server in pool and server.running() and idle <= POOL_IDLE:
            return
        server.stop()
        if server in pool:
            pool.remove(server)


def stop_idle() -> None:
    """Stop the pool's idle servers (the envs of a finished run left them for the next episodes)."""
    with _SHARED_LOCK:
        for pool in _SHARED.values():
            for server in [server for server in pool if server.users <= 0]:
                if server.stop is not None:
                    server.stop()
                pool.remove(server)


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
    capacity_file = tempfile.NamedTemporaryFile(prefix="grl-openenv-capacity-", delete=False)
    capacity_file.close()
    # The child imports what this process can: the app's package may live on a path added at run time.
    child_env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    kwargs = "" if app_kwargs is None else json.dumps(app_kwargs)
    proc = subprocess.Popen(
        [sys.executable, "-m", SERVER_MODULE, app, kwargs, str(port), capacity_file.name],
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
                server.capacity = _read_capacity(capacity_file.name)
                return
        except OSError:
            time.sleep(0.1)
    os.unlink(capacity_file.name)
    rc = proc.poll()
    log.seek(0)
    lines = [line.strip() for line in log.read().decode(errors="replace").splitlines() if line.strip()]
    server.stop()
    why = f"exited with code {rc}" if rc is not None else f"did not answer within {start_timeout_s:g}s"
    raise OpenEnvError(f"openenv ({app}): the server at {url} {why}" + (f": {lines[-1]}" if lines else ""))


def _read_capacity(path: str) -> int | None:
    try:
        with open(path, encoding="utf-8") as file:
            sessions = json.load(file)
    except (OSError, ValueError):
        sessions = None
    finally:
        os.unlink(path)
    return sessions if isinstance(sessions, int) and not isinstance(sessions, bool) and sessions > 0 else None


def _app_capacity() -> int | None:
    """Sessions at once of the OpenEnv server the app was built with (the app does not say it over HTTP, so
    the child looks); None when it is no OpenEnv app, or when its limit is past what one process's envs
    reach, so that one server serves them all and stops with the last."""
    import gc

    from openenv.core.env_server.http_server import HTTPEnvServer

    limits = [server.max_concurrent_envs for server in gc.get_objects() if isinstance(server, HTTPEnvServer)]
    return min(limits) if limits and min(limits) < POOL_IDLE else None


def _serve(app: str, app_kwargs: str, port: str, capacity_path: str) -> None:
    """The child process of a local server: OpenEnv's FastAPI app under uvicorn."""
    import uvicorn
    from uvicorn.importer import import_from_string

    target = import_from_string(app)
    if app_kwargs:
        target = target(**json.loads(app_kwargs))
    with open(capacity_path, "w", encoding="utf-8") as file:
        json.dump(_app_capacity(), file)
    uvicorn.run(target, host="127.0.0.1", port=int(port), log_level="warning")


if __name__ == "__main__":
    _serve(*sys.argv[1:5])
