"""The Ray runtime and the placement of worker ranks, as the driver starts and ends them."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
from pathlib import Path

log = logging.getLogger("grl.workers")

PRODUCT_ENV = {"TOKENIZERS_PARALLELISM": "false"}
REPO_ROOT = str(Path(__file__).resolve().parents[2])
PLACEMENT_TIMEOUT_S = 600


def init_ray(address: str | None = None, **ray_kwargs) -> None:
    """Start (or join) Ray: `address`, else $RAY_ADDRESS, else a local runtime."""
    for key, value in PRODUCT_ENV.items():
        os.environ.setdefault(key, value)
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    on_sigterm = signal.getsignal(signal.SIGTERM)
    if address:
        ray.init(address=address, **ray_kwargs)  # the user's cluster, with its own authentication
    else:
        require_token_locally()
        # "local" starts a fresh runtime; a bare ray.init() would join whatever cluster a leftover
        # session file in /tmp/ray names, and retry for minutes when that cluster is gone.
        ray_kwargs.setdefault("include_dashboard", False)
        ray.init(address="local", **ray_kwargs)
    if callable(on_sigterm) and threading.current_thread() is threading.main_thread():
        # ray.init installs a crash handler for SIGTERM that ends the driver mid-teardown; the caller's
        # handler (grl-train's: unwind like Ctrl-C and shut every worker down) must stay in charge.
        signal.signal(signal.SIGTERM, on_sigterm)


def require_token_locally() -> None:
    """A runtime this process starts takes only clients that hold its token.

    Ray 2.60 cannot be confined to the loopback address: its gRPC servers (GCS, raylet, every
    worker's) listen on all interfaces, and ray.init swaps a loopback node address for the machine's
    (ray/_private/services.py resolve_ip_for_localhost, called at ray/_private/worker.py:1844). What
    keeps the network out is Ray's token authentication: a fresh random token per run, passed to the
    runtime's processes in their environment (no token file is written), unless the user chose a
    mode or a token. GRL's own sockets (the process group's) listen on the loopback address."""
    import ray._raylet

    os.environ.setdefault("RAY_AUTH_MODE", "token")
    if os.environ["RAY_AUTH_MODE"] == "token" and not (os.environ.get("RAY_AUTH_TOKEN")
                                                        or os.environ.get("RAY_AUTH_TOKEN_PATH")):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    ray._raylet.Config.initialize("")  # Ray read its mode when first imported: read it again


def shutdown_local_ray(grace_s: float = 5.0) -> None:
    """End a runtime this process started, and every process it spawned.

    ray.shutdown() stops the raylet and GCS, but the raylet's agents (DashboardAgent, RuntimeEnvAgent)
    can outlive it by a minute on a loaded machine; a run must leave nothing behind when it ends.
    """
    import psutil
    import ray

    ray_home = os.path.dirname(ray.__file__)
    spawned = []
    for child in psutil.Process().children():  # the GCS, raylet and monitors run programs from Ray's package
        try:
            if any(ray_home in arg for arg in child.cmdline()):
                spawned += [child, *child.children(recursive=True)]
        except psutil.Error:
            continue
    ray.shutdown()
    _, alive = psutil.wait_procs(spawned, timeout=grace_s)
    for proc in alive:
        try:
            proc.kill()  # psutil checks the pid still names the same process (start time)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)


def world_size(cfg) -> int:
    """Ranks per role: trainer.n_gpus_per_node x trainer.nnodes (processes on CPU too)."""
    return int(cfg.trainer.n_gpus_per_node) * int(cfg.trainer.nnodes)


def resolve_device(requested: str) -> str:
    import ray

    gpus = ray.cluster_resources().get("GPU", 0)
    if requested == "auto":
        return "cuda" if gpus >= 1 else "cpu"
    if requested == "cuda" and gpus < 1:
        raise RuntimeError("trainer.device: cuda requested but the Ray cluster has no GPU")
    return requested


# ---------------------------------------------------------------- placement

# (Ray job, world size, device) -> [placement group, users]; the job id keeps
# a pool from outliving the Ray runtime it was made in.
_pools: dict[tuple[str, int, str], list] = {}


def _pool_key(size: int, device: str) -> tuple[str, int, str]:
    import ray

    return ray.get_runtime_context().get_job_id(), size, device


def acquire_pool(size: int, device: str):
    import ray
    from ray.util.placement_group import placement_group

    key = _pool_key(size, device)
    if key in _pools and _pools[key][1] > 0:
        _pools[key][1] += 1
        return _pools[key][0]
    total_cpu = ray.cluster_resources().get("CPU", 1)
    bundle = {"CPU": min(2.0, total_cpu / size)}
    if device == "cuda":
        bundle["GPU"] = 1.0
    pg = placement_group([dict(bundle) for _ in range(size)], strategy="PACK")
    ready, _ = ray.wait([pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise RuntimeError(f"cannot place {size} worker ranks with {bundle} each; the cluster has "
                           f"{ray.cluster_resources()}")
    _pools[key] = [pg, 1]
    return pg


def release_pool(size: int, device: str) -> None:
    import ray

    key = _pool_key(size, device)
    entry = _pools.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] <= 0:
        del _pools[key]
        try:
            ray.util.remove_placement_group(entry[0])
        except Exception as err:  # noqa: BLE001 - Ray already gone (ray.shutdown came first)
            log.debug("remove_placement_group: %s", err)
