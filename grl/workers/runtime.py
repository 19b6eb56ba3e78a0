"""The Ray runtime and the placement of worker ranks, as the driver starts and ends them."""

from __future__ import annotations

import logging
import os
import secrets
import signal
import threading
from pathlib import Path

from grl.machine import ray_address

log = logging.getLogger("grl.workers")

PRODUCT_ENV = {"TOKENIZERS_PARALLELISM": "false"}
REPO_ROOT = str(Path(__file__).resolve().parents[2])
PLACEMENT_TIMEOUT_S = 600
NO_IDLE_WORKERS = {"prestart_worker_first_driver": False, "enable_worker_prestart": False}
# Every Ray node carries its id under this label (ray/util/placement_group.py NODE_ID_LABEL_KEY); a
# bundle whose label selector names it can only be placed on that node.
NODE_ID_LABEL = "ray.io/node-id"

_started: set[str] = set()  # GCS addresses of the runtimes init_ray started (not joined) in this process


class WorkerDiedError(RuntimeError):
    """A worker process died (Ray reported its actor dead); `worker` names it, e.g. "actor rank 1";
    `node` is (IP, node id) of the node it ran on, when that node died with it."""

    def __init__(self, message: str, worker: str, node: tuple[str, str] | None = None):
        super().__init__(message)
        self.worker = worker
        self.node = node


def init_ray(address: str | None = None, **ray_kwargs) -> None:
    """Start (or join) Ray: `address`, else $RAY_ADDRESS, else a local runtime."""
    for key, value in PRODUCT_ENV.items():
        os.environ.setdefault(key, value)
    import ray

    if ray.is_initialized():
        return
    address = ray_address(address)
    on_sigterm = signal.getsignal(signal.SIGTERM)
    if address:
        ray.init(address=address, **ray_kwargs)  # the user's cluster, with its own authentication
    else:
        require_token_locally()
        # "local" starts a fresh runtime; a bare ray.init() would join whatever cluster a leftover
        # session file in /tmp/ray names, and retry for minutes when that cluster is gone.
        ray_kwargs.setdefault("include_dashboard", False)
        # Ray starts an idle Python worker per CPU for tasks without a runtime_env; every worker GRL starts
        # has one (worker_runtime_env), so those would only spend a second of CPU each and their memory.
        ray_kwargs["_system_config"] = {**NO_IDLE_WORKERS, **ray_kwargs.get("_system_config", {})}
        ray.init(address="local", **ray_kwargs)
        _started.add(ray.get_runtime_context().gcs_address)
    if callable(on_sigterm) and threading.current_thread() is threading.main_thread():
        # ray.init installs a crash handler for SIGTERM that ends the driver mid-teardown; the caller's
        # handler (grl-train's: unwind like Ctrl-C and shut every worker down) must stay in charge.
        signal.signal(signal.SIGTERM, on_sigterm)


def worker_runtime_env() -> dict:
    """The Ray runtime_env of every worker process GRL starts: the product's environment, and this checkout
    first on the import path, so that a worker imports the grl the driver runs."""
    pythonpath = os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)
    return {"env_vars": dict(PRODUCT_ENV, PYTHONPATH=pythonpath)}


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
    if os.environ["RAY_AUTH_MODE"] == "token" and not (
        os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")
    ):
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    ray._raylet.Config.initialize("")  # Ray read its mode when first imported: read it again
    ray._raylet.AuthenticationTokenLoader.instance().reset_cache()  # and keeps the first token it loaded


def leave_ray() -> None:
    """End this process's part in Ray: a runtime init_ray started ends with every process it spawned
    (shutdown_local_ray); a cluster it joined is only disconnected from and keeps running. The groups
    have removed their actors and placement groups by then, and Ray removes whatever a driver that
    disconnects leaves of its job (actors and placement groups are not detached)."""
    import ray

    if not ray.is_initialized():
        return
    if ray.get_runtime_context().gcs_address in _started:
        shutdown_local_ray()
    else:
        ray.shutdown()


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


def node_death_wait_s() -> float:
    """The longest Ray takes to mark a node dead once it stops answering: its health check fails
    `health_check_failure_threshold` times in a row, each a period plus at most a timeout (65 s with
    Ray's defaults; about 15 s when the node's raylet is gone and its port refuses at once)."""
    from ray._raylet import Config

    per_check_ms = Config.health_check_period_ms() + Config.health_check_timeout_ms()
    return Config.health_check_failure_threshold() * per_check_ms / 1000 + 5.0


def check_device(device: str) -> str:
    """The run plan's device (`auto` resolved there, grl/machine.py), refused where the Ray cluster
    cannot give the ranks a GPU."""
    import ray

    if device == "cuda" and ray.cluster_resources().get("GPU", 0) < 1:
        raise RuntimeError("trainer.device: cuda, but the Ray cluster has no GPU")
    return device


def cluster_gpus(address: str) -> int:
    """The GPUs of the Ray cluster at `address`, which a run joining it counts as its machine's
    (grl/machine.py); it stays joined, as the trainer's init_ray finds it."""
    import ray

    init_ray(address, log_to_driver=False)
    return int(ray.cluster_resources().get("GPU", 0))


# ---------------------------------------------------------------- placement

# (Ray job, world size, device, nodes) -> [placement group, users]; the job id keeps
# a pool from outliving the Ray runtime it was made in.
_pools: dict[tuple[str, int, str, int], list] = {}
_pools_lock = threading.Lock()  # the actor and critic groups start side by side and share a pool


def _pool_key(size: int, device: str, nnodes: int) -> tuple[str, int, str, int]:
    import ray

    return ray.get_runtime_context().get_job_id(), size, device, nnodes


def acquire_pool(size: int, device: str, nnodes: int = 1):
    """The placement group of `size` ranks: bundle r holds rank r. On one node (nnodes=1) Ray packs the
    bundles where they fit; on nnodes > 1 bundle r is pinned to node r // (size / nnodes) of
    `nodes_for`, so each node holds size / nnodes ranks in rank order."""
    with _pools_lock:
        return _acquire_pool(size, device, nnodes)


def _acquire_pool(size: int, device: str, nnodes: int):
    import ray
    from ray.util.placement_group import placement_group

    key = _pool_key(size, device, nnodes)
    if key in _pools and _pools[key][1] > 0:
        _pools[key][1] += 1
        return _pools[key][0]
    if nnodes > 1:
        if size % nnodes:
            raise ValueError(f"{size} ranks do not divide evenly over trainer.nnodes={nnodes} nodes")
        per_node = size // nnodes
        nodes = nodes_for(nnodes, per_node, device)
        bundle = _bundle(min(n["Resources"]["CPU"] for n in nodes) / per_node, device)
        where = [{NODE_ID_LABEL: n["NodeID"]} for n in nodes for _ in range(per_node)]
        # Each bundle's selector is a hard constraint that names its node, which leaves PACK no choice to
        # make.
        pg = placement_group(
            [dict(bundle) for _ in range(size)], strategy="PACK", bundle_label_selector=where
        )
        wanted = f"{per_node} worker rank(s) with {bundle} each on each of the nodes " + ", ".join(
            f"{n['NodeManagerAddress']} ({n['NodeID']})" for n in nodes
        )
    else:
        bundle = _bundle(ray.cluster_resources().get("CPU", 1) / size, device)
        pg = placement_group([dict(bundle) for _ in range(size)], strategy="PACK")
        wanted = f"{size} worker ranks with {bundle} each"
    ready, _ = ray.wait([pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise RuntimeError(f"cannot place {wanted}; the cluster has {ray.cluster_resources()}")
    _pools[key] = [pg, 1]
    return pg


def _bundle(cpus: float, device: str) -> dict[str, float]:
    bundle = {"CPU": min(2.0, cpus)}
    if device == "cuda":
        bundle["GPU"] = 1.0
    return bundle


def nodes_for(nnodes: int, per_node: int, device: str) -> list[dict]:
    """`nnodes` live nodes (ray.nodes() entries) that can each hold `per_node` ranks: `per_node` GPUs on
    cuda, some CPU on cpu (a head node started with --num-cpus=0 takes no ranks). The driver's node comes
    first when it qualifies (rank 0 opens the rendezvous, and on CPU hosts the rollout engine the driver
    talks to most), then the others by address and id, so the same cluster gives the same placement."""
    import ray

    here = ray.get_runtime_context().get_node_id()

    def fits(node: dict) -> bool:
        res = node["Resources"]
        return res.get("CPU", 0) > 0 and (device != "cuda" or res.get("GPU", 0) >= per_node)

    alive = [n for n in ray.nodes() if n["Alive"]]
    fit = sorted(
        (n for n in alive if fits(n)),
        key=lambda n: (n["NodeID"] != here, n["NodeManagerAddress"], n["NodeID"]),
    )
    if len(fit) < nnodes:
        need = f"{per_node} GPU(s) and some CPU" if device == "cuda" else "some CPU"
        raise RuntimeError(
            f"trainer.nnodes={nnodes} needs {nnodes} Ray nodes with {need} each, but the cluster "
            f"has {len(fit)} of {len(alive)} live node(s) that do; start more nodes "
            f"(`ray start --address=...`) or lower trainer.nnodes"
        )
    return fit[:nnodes]


def release_pool(size: int, device: str, nnodes: int = 1) -> None:
    import ray

    key = _pool_key(size, device, nnodes)
    with _pools_lock:
        entry = _pools.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] > 0:
            return
        del _pools[key]
    try:
        ray.util.remove_placement_group(entry[0])
    except Exception as err:  # noqa: BLE001 - Ray already gone (ray.shutdown came first)
        log.debug("remove_placement_group: %s", err)
