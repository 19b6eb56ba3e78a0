"""Two Ray nodes for real, on this machine: a head and a second node, each a `ray start --block` process
with its own temporary folder and ports, token authentication on as a user's cluster would have it. A
worker group with trainer.nnodes=2 puts one rank on each node and trains over gloo between them (more
nodes than the cluster has is one line); its checkpoint resumes exactly; closing it, a `grl-train` run that
joins through $RAY_ADDRESS and one stopped by SIGTERM each leave both nodes running and clean; killing the
second node's raylet mid-call ends the call with one line that names that node. The nodes are ended by
their process ids, never `ray stop` (other runs on the machine)."""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
import ray
import torch

pytestmark = pytest.mark.multinode  # two Ray nodes, two worker groups and two short runs: 90-135 s on 2 cores

from grl.config import compose
from grl.run_plan import RunPlan
from grl.workers import ActorRolloutRefGroup, WorkerDiedError, init_ray
from grl.workers.runtime import node_death_wait_s
from grl.workers.sharded import SHARDS_DIR
from tests.workers.test_checkpoint_sharded import _full_optimizer_state
from tests.workers.test_worker_groups import (
    _full_weights,
    make_batch,
    max_diff,
    policy_with,
    reference_scores,
)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROOT = Path(__file__).resolve().parents[2]
RAY_CLI = str(Path(sys.executable).with_name("ray"))
GRL_TRAIN = str(Path(sys.executable).with_name("grl-train"))
# Room for both ranks' bundles (2 CPUs each) on either node: the ranks are on two nodes because the
# placement puts them there, not because one node is too small for both.
CPUS_PER_NODE = 4
START_TIMEOUT_S = 120
OVERRIDES = [
    "model_path=tiny",
    "n_gpus_per_node=1",
    "nnodes=2",
    "ppo_mini_batch_size=6",
    "micro_batch_size_per_gpu=1",
    "trainer.device=cpu",
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.actor.optim.lr=1e-3",
]


# ---------------------------------------------------------------- the cluster


class Node:
    def __init__(self, name: str, proc: subprocess.Popen, log: Path):
        self.name, self.proc, self.log = name, proc, log

    def raylet(self) -> psutil.Process:
        return next(p for p in psutil.Process(self.proc.pid).children(recursive=True) if p.name() == "raylet")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_node(name: str, args: list[str], temp: Path, env: dict) -> Node:
    """`ray start --block`: the process stays in the foreground as the parent of the node's processes, so
    its pid ends them all (SIGTERM: it stops the raylet, GCS and agents it started, then exits)."""
    log = temp.parent / f"{name}.log"
    cmd = [
        RAY_CLI,
        "start",
        *args,
        f"--num-cpus={CPUS_PER_NODE}",
        "--num-gpus=0",
        f"--temp-dir={temp}",
        "--object-store-memory=100000000",
        "--disable-usage-stats",
        "--block",
    ]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    node = Node(name, proc, log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while "Ray runtime started" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop_node(node)
            raise RuntimeError(f"ray start ({name}) did not come up:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return node


def _stop_node(node: Node) -> None:
    try:
        family = psutil.Process(node.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    if node.proc.poll() is None:
        node.proc.send_signal(signal.SIGTERM)
        try:
            node.proc.wait(30)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            node.proc.wait(10)
    _, alive = psutil.wait_procs(family, timeout=10)
    for proc in alive:  # psutil checks each pid still names the process it found (start time)
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


class Cluster:
    def __init__(self, address: str, head: Node, second: Node, head_id: str, second_id: str):
        self.address, self.head, self.second = address, head, second
        self.head_id, self.second_id = head_id, second_id


def _alive_nodes() -> dict[str, dict]:
    return {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}


def _wait_for(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(0.5)
    return result


@pytest.fixture(scope="module")
def cluster():
    saved = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}
    if ray.is_initialized():
        ray.shutdown()  # a runtime another module left behind must not become this test's driver
    # A short folder: Ray's unix sockets live under --temp-dir, and a socket path has at most 107 bytes.
    temp = Path(tempfile.mkdtemp(prefix="grl2n-", dir="/tmp"))
    port = _free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    env.pop("RAY_ADDRESS", None)
    nodes: list[Node] = []
    try:
        nodes.append(
            _start_node("head", ["--head", f"--port={port}", "--include-dashboard=false"], temp / "head", env)
        )
        nodes.append(_start_node("second", [f"--address=127.0.0.1:{port}"], temp / "second", env))
        # The driver holds the cluster's token like its nodes; Ray reads the mode when first imported.
        os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=env["RAY_AUTH_TOKEN"])
        ray._raylet.Config.initialize("")
        # an earlier runtime's token was cached
        ray._raylet.AuthenticationTokenLoader.instance().reset_cache()
        address = f"127.0.0.1:{port}"
        init_ray(address, log_to_driver=False)
        head_id = ray.get_runtime_context().get_node_id()
        alive = _wait_for(
            lambda: len(_alive_nodes()) == 2 and _alive_nodes(), START_TIMEOUT_S, "two live nodes"
        )
        yield Cluster(address, *nodes, head_id, next(n for n in alive if n != head_id))
    finally:
        if ray.is_initialized():
            ray.shutdown()
        for node in reversed(nodes):
            _stop_node(node)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        ray._raylet.Config.initialize("")
        ray._raylet.AuthenticationTokenLoader.instance().reset_cache()
        shutil.rmtree(temp, ignore_errors=True)


def _clean(nodes: int) -> bool:
    """`nodes` live nodes, no placement group but removed ones, no actor alive, every CPU free again."""
    from ray._private.state import actors

    groups = ray.util.placement_group_table().values()
    total, free = ray.cluster_resources(), ray.available_resources()
    return (
        len(_alive_nodes()) == nodes
        and all(g["state"] == "REMOVED" for g in groups)
        and all(a["State"] == "DEAD" for a in actors().values())
        and not any("_group_" in k for k in total)
        and free.get("CPU") == total["CPU"] == nodes * CPUS_PER_NODE
    )


# ---------------------------------------------------------------- a group over both nodes


def _master_addr(worker):
    return os.environ["MASTER_ADDR"]


@pytest.fixture(scope="module")
def cfg(cluster):
    return compose(OVERRIDES)


# The module's group, once a test started it: the node-death test needs the cluster to itself.
_module_groups: list[ActorRolloutRefGroup] = []


@pytest.fixture(scope="module")
def group(cfg):
    started = time.perf_counter()
    group = ActorRolloutRefGroup.from_config(cfg, RunPlan.from_config(cfg))
    _module_groups.append(group)
    print(f"\n[two nodes] group of 2 ranks formed in {time.perf_counter() - started:.1f} s")
    yield group
    group.shutdown()


def scored_batch(group):
    """A training batch whose old log-probs are `group`'s."""
    b = make_batch()
    b["old_log_probs"], _ = group.compute_log_probs(b)
    return b


@pytest.fixture(scope="module")
def batch(group):
    return scored_batch(group)


def test_one_rank_per_node_scores_and_trains_over_gloo(cluster, group, batch):
    assert group.nodes == [cluster.head_id, cluster.second_id]  # rank = node index x 1 + local rank 0
    head_ip = _alive_nodes()[cluster.head_id]["NodeManagerAddress"]
    assert (
        group.execute(_master_addr) == [head_ip] * 2
    )  # the rendezvous is on the node's address, not loopback
    weights = group.execute(_full_weights)[0]
    with torch.no_grad():
        want, _ = reference_scores(policy_with(weights), batch)
    sampled = batch["loss_mask"] > 0
    started = time.perf_counter()
    log_probs, _ = group.compute_log_probs(batch)
    scored = time.perf_counter() - started
    assert (log_probs - want.where(sampled, 0.0)).abs().max() < 1e-5
    started = time.perf_counter()
    metrics = group.update(batch, step=1)
    updated = time.perf_counter() - started
    assert metrics["actor/grad_norm"] > 0 and max_diff(group.execute(_full_weights)[0], weights) > 5e-4
    print(f"[two nodes] log-probs {scored:.2f} s, update {updated:.2f} s (6 rows, 2 ranks)")


def test_more_nodes_than_the_cluster_has_is_one_line(cluster):
    three = compose([*OVERRIDES, "nnodes=3"])
    with pytest.raises(RuntimeError) as err:
        ActorRolloutRefGroup.from_config(three, RunPlan.from_config(three))
    assert str(err.value) == (
        "trainer.nnodes=3 needs 3 Ray nodes with some CPU each, but the cluster has 2 of 2 live node(s) that "
        "do; start more nodes (`ray start --address=...`) or lower trainer.nnodes"
    )


def test_a_checkpoint_written_on_both_nodes_resumes_exactly(group, batch, tmp_path):
    group.save_checkpoint(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt" / SHARDS_DIR).iterdir()) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]  # each node's rank wrote its own shards
    weights, moments = group.execute(_full_weights)[0], group.execute(_full_optimizer_state)[0]
    assert moments  # the first test's update left AdamW state to restore
    log_probs, _ = group.compute_log_probs(batch)
    metrics = group.update(batch, step=2)
    after = group.execute(_full_weights)[0]

    group.load_checkpoint(tmp_path / "ckpt")
    assert all(torch.equal(v, weights[k]) for k, v in group.execute(_full_weights)[0].items())
    got = group.execute(_full_optimizer_state)[0]
    assert all(torch.equal(got[p][k], moments[p][k]) for p in moments for k in moments[p])
    assert torch.equal(group.compute_log_probs(batch)[0], log_probs)
    learned = {k: v for k, v in metrics.items() if not k.startswith("perf/")}  # memory readings vary
    assert {k: v for k, v in group.update(batch, step=2).items() if not k.startswith("perf/")} == learned
    assert max_diff(group.execute(_full_weights)[0], after) == 0


def test_closing_the_group_leaves_both_nodes_up_and_clean(cluster, group):
    group.shutdown()
    _wait_for(lambda: _clean(nodes=2), 30, "the cluster clean after the group closed")


# ---------------------------------------------------------------- a whole run that joins the cluster


def _run_overrides(tmp_path: Path, steps: int) -> list[str]:
    """A `grl-train` run of the tiny model on both nodes: one Sokoban group of 2 agents a step, no critic."""
    return [
        *OVERRIDES,
        "max_response_length=12",
        "algorithm.adv_estimator=grpo",
        "rollout.training=[simpleSokobanAgent]",
        "rollout.validation=[simpleSokobanAgent]",
        "rollout.agent_group_num=[1]",
        "rollout.agent_group_size=[2]",
        "ppo_mini_batch_size=2",
        "simpleSokobanAgent.agent_config.max_turns=1",
        f"total_training_steps={steps}",
        "test_freq=0",
        "save_freq=0",
        "trainer.val_before_train=false",
        "trainer.logger=[jsonl]",
        f"trainer.run_dir={tmp_path / 'run'}",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ]


def test_a_run_joining_through_ray_address_leaves_the_cluster_running_and_clean(cluster, tmp_path):
    env = {**os.environ, "RAY_ADDRESS": cluster.address}
    started = time.perf_counter()
    out = subprocess.run(
        [GRL_TRAIN, *_run_overrides(tmp_path, steps=3)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    wall = time.perf_counter() - started
    assert out.returncode == 0, out.stderr[-3000:]
    assert "device       cpu x 2 rank(s)" in out.stdout
    assert (tmp_path / "ckpt" / "global_step_3").is_dir()
    steps = sorted(
        json.loads(line)["perf/time_per_step"]
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    )
    print(f"\n[two nodes] grl-train, 3 steps: {wall:.1f} s in all, perf/time_per_step {steps}")
    _wait_for(lambda: _clean(nodes=2), 30, "the cluster clean after the run")


def test_a_run_stopped_with_sigterm_leaves_the_cluster_running_and_clean(cluster, tmp_path):
    env = {**os.environ, "RAY_ADDRESS": cluster.address}
    with open(tmp_path / "stderr", "w") as err:
        run = subprocess.Popen(
            [GRL_TRAIN, *_run_overrides(tmp_path, steps=1000)],
            env=env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
    try:
        for line in run.stdout:  # the start report: both groups are up and the first step begins
            if line.startswith("  run folder"):
                break
        run.send_signal(signal.SIGTERM)
        assert run.wait(60) == 130, (tmp_path / "stderr").read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        run.stdout.close()
    assert "grl-train: stopped; every worker was shut down" in (tmp_path / "stderr").read_text()
    _wait_for(lambda: _clean(nodes=2), 30, "the cluster clean after the stopped run")


# ---------------------------------------------------------------- a node that dies mid-call


def test_a_node_dying_mid_call_ends_it_with_one_line_naming_the_node(cluster, cfg):
    for earlier in _module_groups:
        earlier.shutdown()  # idempotent
    group = ActorRolloutRefGroup.from_config(cfg, RunPlan.from_config(cfg))
    batch = scored_batch(group)
    raylet = cluster.second.raylet()
    killer = threading.Timer(1.0, raylet.kill)
    try:
        killer.start()
        calls, started = 0, time.monotonic()
        with pytest.raises(WorkerDiedError) as err:
            while time.monotonic() - started < 60:  # a step's calls, again and again, until the node is gone
                group.compute_log_probs(batch)
                group.update(batch, step=1)
                calls += 2
        died = time.monotonic() - started - 1.0
    finally:
        killer.cancel()
        group.shutdown()
    message = str(err.value)
    assert "\n" not in message and err.value.worker == "actor rank 1"
    assert err.value.node == (_alive_nodes()[cluster.head_id]["NodeManagerAddress"], cluster.second_id)
    assert message.startswith(
        f"actor rank 1 died: its node {err.value.node[0]} (node id {cluster.second_id}) died"
    )
    assert died < node_death_wait_s() + 10, died
    print(f"\n[two nodes] {message!r} {died:.1f} s after the kill ({calls} calls before it)")
    _wait_for(lambda: _clean(nodes=1), 30, "the head node clean after the failed call")
    assert cluster.second.proc.wait(30) != 0  # `ray start --block` ended the dead node's other processes
