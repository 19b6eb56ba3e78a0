"""GPU-path choices of the FSDP2 workers, checked on CPU (issue #22): the process group's backends
under offload, the same number of micro-batches on every rank, building without a full model per
rank, and per-step memory peaks. Multi-rank checks run 2 real ranks (spawned processes, gloo,
FSDP2, the tiny model) under a time limit, so a hang in a collective fails instead of stalling."""

import copy
import io
import itertools
import math
import os
import queue
import socket
import time
import traceback
from dataclasses import replace
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.distributed_c10d import BackendConfig

from grl.config import compose, typed_section
from grl.models import load_causal_lm
from grl.run_plan import RunPlan
from grl.workers import fsdp
from grl.workers.update import memory_metrics, split_rows
from grl.workers.critic import CriticWorker
from grl.workers.policy import PolicyWorker

RANKS_TIME_LIMIT_S = 300
TIMEOUT_S = 77  # actor_rollout_ref.nccl_timeout in the ranks: odd, so it cannot be a default
LENGTHS = [7, 5, 9, 6, 8, 4]  # six episodes
PADDED = [[[0], [1], [2]], [[3], [4], [5]]]  # rank -> its rows -> episodes: one per row
PACKED = [[[0, 1], [2, 3]], [[4], [5]]]  # rank -> its rows -> episodes: 2 rows each, 4 vs 2 episodes
OVERRIDES = [
    "model_path=tiny",
    "n_gpus_per_node=2",
    "nnodes=1",
    "micro_batch_size_per_gpu=2",
    "trainer.device=cpu",
    "actor_rollout_ref.actor.logits_chunk_size=5",
    "actor_rollout_ref.actor.optim.lr=1e-3",
    "critic.optim.lr=1e-2",
    f"actor_rollout_ref.nccl_timeout={TIMEOUT_S}",
]


# ---------------------------------------------------------------- two spawned ranks


def _rank_main(fn, rank, ports, args, results):
    torch.set_num_threads(1)  # two ranks on a shared 2-core machine
    try:
        value = io.BytesIO()  # as bytes: a tensor sent as a shared-memory handle dies with its process
        torch.save(fn(rank, ports, *args), value)
        results.put((rank, None, value.getvalue()))
    except BaseException:  # noqa: BLE001 - reported to the test with its traceback
        results.put((rank, traceback.format_exc(), None))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((fsdp.LOOPBACK, 0))
        return s.getsockname()[1]


def run_two_ranks(fn, *args, ports: int = 1) -> tuple[list, list[str]]:
    """`fn(rank, ports, *args)` in 2 spawned processes -> (results, errors) in rank order (None
    where a rank raised / returned). Ranks still running after the time limit fail the test."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    free = [free_port() for _ in range(ports)]
    procs = [ctx.Process(target=_rank_main, args=(fn, rank, free, args, results)) for rank in range(2)]
    for p in procs:
        p.start()
    values, errors = [None, None], [None, None]
    deadline = time.monotonic() + RANKS_TIME_LIMIT_S
    try:
        for _ in procs:
            rank, error, value = results.get(timeout=max(deadline - time.monotonic(), 1))
            values[rank] = None if value is None else torch.load(io.BytesIO(value), weights_only=False)
            errors[rank] = error
            if error is not None:
                break  # its peer may now wait forever in a collective
    except queue.Empty:
        pytest.fail(
            f"the ranks did not finish within {RANKS_TIME_LIMIT_S} s (a collective that never matched?)"
        )
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return values, errors


def _join(rank, port, backend, timeout_s=60):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(backend, rank=rank, world_size=2, timeout=timedelta(seconds=timeout_s))


# ---------------------------------------------------------------- 1. backends under offload


def gloo_stand_in(backend: str) -> str:
    """The same device -> backend map with gloo for every device: NCCL is not built here."""
    return ",".join(f"{device}:gloo" for device in BackendConfig(backend).get_device_backend_map())


def _offloaded_fsdp_step(rank, ports, backend):
    """Real FSDP2 with CPUOffloadPolicy (shards, gradients, AdamW state in host memory): forward,
    backward, clip_grad_norm_, step -> (norm, the single-process norm). On GPU the all-gathers
    copy the shards to the device first, but the norm's all-reduce (and a checkpoint's gathers)
    run on the host tensors; here every collective does, so the bad group fails at the first."""
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    _join(rank, ports[0], backend)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    reference = copy.deepcopy(model)
    x = torch.randn(6, 8)
    for module in (model[0], model[2], model):
        fully_shard(module, offload_policy=CPUOffloadPolicy(pin_memory=False))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(x[3 * rank : 3 * rank + 3]).square().sum().backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).full_tensor()
    optimizer.step()
    reference(x).square().sum().backward()
    want = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0) / 2  # FSDP2 averages over 2 ranks
    return float(norm), float(want)


@pytest.mark.parametrize("device,offload", list(itertools.product(["cpu", "cuda"], [False, True])))
def test_process_group_serves_every_device_that_holds_training_state(device, offload):
    served = BackendConfig(fsdp.process_group_backend(device)).get_device_backend_map()
    assert device in served  # activations and the all-gathers of unsharded parameters
    assert fsdp.state_device(device, offload) in served  # shards, their gradients, the optimizer state


@pytest.mark.slow  # 4 spawned ranks: about 30 s on 2 cores
def test_offloaded_shards_need_a_cpu_backend_in_the_group():
    # An NCCL-only group (what "nccl" means) cannot reduce host tensors: pytorch/pytorch#148532.
    _, errors = run_two_ranks(_offloaded_fsdp_step, gloo_stand_in("nccl"))
    assert any(e and "No backend type associated with device type cpu" in e for e in errors), errors
    # The group the workers start on GPU serves the offloaded step, and its norm is the right one.
    values, errors = run_two_ranks(_offloaded_fsdp_step, gloo_stand_in(fsdp.process_group_backend("cuda")))
    assert errors == [None, None], errors
    for norm, want in values:
        assert norm == pytest.approx(want, rel=1e-5)


def test_gpu_rank_takes_its_share_of_the_cores():
    cfg = compose(OVERRIDES + ["n_gpus_per_node=1"])
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # what Ray's OMP_NUM_THREADS=1 gives a fractional-CPU actor
    try:
        PolicyWorker(
            0,
            replace(RunPlan.from_config(cfg), device="cuda"),
            typed_section(cfg, "actor_rollout_ref"),
            typed_section(cfg, "trainer"),
        )
        assert torch.get_num_threads() == len(os.sched_getaffinity(0))
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------- 2-3. building and micro-batches


def episodes(seed=0) -> dict[str, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return {
        "input_ids": [torch.randint(0, 2000, (n,), generator=g) for n in LENGTHS],
        "loss_mask": [(torch.arange(n) >= 2).float() for n in LENGTHS],
        "advantages": [torch.randn(n, generator=g) for n in LENGTHS],
        "returns": [torch.randn(n, generator=g) for n in LENGTHS],
        "values": [torch.zeros(n) for n in LENGTHS],
    }


def layout(rows: list[list[int]], per_token: dict[str, list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Rows of episodes side by side, positions restarting (grl.rollout's packed layout);
    segment ids where a row holds several."""
    width = max(sum(LENGTHS[i] for i in row) for row in rows)
    out = {
        k: torch.zeros(len(rows), width, dtype=torch.long)
        for k in ("attention_mask", "position_ids", "segment_ids")
    }
    out.update({k: torch.zeros(len(rows), width, dtype=v[0].dtype) for k, v in per_token.items()})
    for r, row in enumerate(rows):
        start = 0
        for s, i in enumerate(row, start=1):
            n = LENGTHS[i]
            out["attention_mask"][r, start : start + n] = 1
            out["position_ids"][r, start : start + n] = torch.arange(n)
            out["segment_ids"][r, start : start + n] = s
            for key, values in per_token.items():
                out[key][r, start : start + n] = values[i]
            start += n
    if all(len(row) == 1 for row in rows):
        del out["segment_ids"]
    return out


def by_episode(rows: list[list[int]], tensor: torch.Tensor) -> dict[int, torch.Tensor]:
    out = {}
    for r, row in enumerate(rows):
        start = 0
        for i in row:
            out[i] = tensor[r, start : start + LENGTHS[i]]
            start += LENGTHS[i]
    return out


def all_episodes(mine: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    """Every rank's episodes, in episode order (collective)."""
    everyone = [None, None]
    dist.all_gather_object(everyone, mine)
    merged = {**everyone[0], **everyone[1]}
    return [merged[i] for i in range(len(LENGTHS))]


def _spy_on_loading() -> dict:
    """Record what this rank reads from disk and the devices of what it hands to fully_shard."""
    import torch.distributed.fsdp as fsdp_api
    from transformers import PreTrainedModel

    seen = {"loads": [], "sharded_devices": set()}
    load, shard = PreTrainedModel.from_pretrained.__func__, fsdp_api.fully_shard

    def counting_load(cls, *args, **kwargs):
        seen["loads"].append(cls.__name__)
        return load(cls, *args, **kwargs)

    def recording_shard(module, **kwargs):
        seen["sharded_devices"] |= {p.device.type for p in module.parameters()}
        return shard(module, **kwargs)

    PreTrainedModel.from_pretrained = classmethod(counting_load)
    fsdp_api.fully_shard = recording_shard
    return seen


def group_timeout_s() -> float:
    group = dist.distributed_c10d._get_default_group()
    return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()


def _build_score_and_train(rank, ports, cfg):
    from grl.workers.fsdp import (
        full_optimizer_state,
        full_state_dict,
        load_full_state,
        make_optimizer,
        make_scheduler,
    )
    from grl.workers.worker import hf_names

    seen = _spy_on_loading()
    data, out = episodes(), {}
    policy_keys = ("input_ids", "loss_mask", "advantages")
    padded = layout(PADDED[rank], {k: data[k] for k in policy_keys})
    packed = layout(PACKED[rank], {k: data[k] for k in policy_keys})

    with_ref = replace(RunPlan.from_config(cfg), use_reference=True, reference_model=True)
    actor = PolicyWorker(
        rank, with_ref, typed_section(cfg, "actor_rollout_ref"), typed_section(cfg, "trainer")
    )
    actor.setup("127.0.0.1", ports[0])
    out["timeouts_s"] = [group_timeout_s()]
    out["buffers"] = {k: v.clone() for k, v in actor.module.named_buffers()}
    start = {k: v.clone() for k, v in full_state_dict(actor.module, on_all_ranks=True).items()}
    out["weights"] = hf_names(start) if rank == 0 else None
    ref_weights = hf_names(full_state_dict(actor.ref))  # collective; rank 0 gets them
    out["ref_weights"] = ref_weights if rank == 0 else None

    # Scoring: the packed rows make 2 micro-batches on rank 0 and 1 on rank 1.
    out["padded_log_probs"] = actor.compute_log_probs(padded)[0]
    out["packed_log_probs"] = actor.compute_log_probs(packed)[0]
    out["packed_ref_log_probs"] = actor.compute_log_probs(packed, model="ref")[0]

    # One optimizer step on all six episodes, padded then packed, from the same weights.
    g = torch.Generator().manual_seed(1)
    scored = all_episodes(by_episode(PADDED[rank], out["padded_log_probs"]))
    old = [lp + 0.3 * torch.randn(lp.shape, generator=g) for lp in scored]
    for name, rows, part in (("padded", PADDED[rank], padded), ("packed", PACKED[rank], packed)):
        part["old_log_probs"] = layout(rows, {"old_log_probs": old})["old_log_probs"]
        load_full_state(actor.module, None, start, None)
        actor.optimizer = make_optimizer(actor.module.parameters(), actor.train_cfg.optim)
        actor.scheduler = make_scheduler(actor.optimizer, 0)
        metrics = actor.update([part])
        moments = full_optimizer_state(actor.module, actor.optimizer).get("state", {})  # rank 0 only
        out[f"{name}_update"] = (metrics, {k: s["exp_avg"].clone() for k, s in moments.items()})
    actor.teardown()

    critic = CriticWorker(
        rank,
        RunPlan.from_config(cfg),
        typed_section(cfg, "critic"),
        typed_section(cfg, "trainer"),
        cfg.actor_rollout_ref.actor.logits_chunk_size,
    )
    critic.setup("127.0.0.1", ports[1])
    out["timeouts_s"].append(group_timeout_s())
    critic.update(
        [layout(PADDED[rank], {k: data[k] for k in ("input_ids", "loss_mask", "returns", "values")})]
    )
    # (The value head starts at 0; after one step it scores something.)
    out["padded_values"] = critic.compute_values(layout(PADDED[rank], {"input_ids": data["input_ids"]}))
    out["packed_values"] = critic.compute_values(layout(PACKED[rank], {"input_ids": data["input_ids"]}))
    critic.teardown()
    out["built"] = seen  # policy, reference and critic
    return out


def test_split_rows_reaches_the_busiest_ranks_count_in_order():
    packed = layout(
        PACKED[1], {"input_ids": episodes()["input_ids"]}
    )  # 2 one-episode rows: 1 micro-batch of 2
    assert [len(p["input_ids"]) for p in split_rows(packed, 2)] == [2]
    parts = split_rows(packed, 2, count=2)
    assert [len(p["input_ids"]) for p in parts] == [1, 1]
    assert all(torch.equal(torch.cat([p[k] for p in parts]), v) for k, v in packed.items())
    padded = layout([[i] for i in range(5)], {"input_ids": episodes()["input_ids"]})
    assert [len(p["input_ids"]) for p in split_rows(padded, 4, count=4)] == [
        1,
        1,
        2,
        1,
    ]  # the widest halved first
    with pytest.raises(ValueError, match="5 rows cannot make 6 micro-batches"):
        split_rows(padded, 4, count=6)


@pytest.fixture(scope="module")
def ranks():
    """One 2-rank run (about a minute on 2 cores) that the tests below read."""
    values, errors = run_two_ranks(_build_score_and_train, compose(OVERRIDES), ports=2)
    assert errors == [None, None], next(e for e in errors if e)
    return values


@pytest.mark.slow
def test_only_rank0_reads_the_weights_and_every_rank_shards_an_empty_model(ranks):
    assert ranks[0]["built"]["loads"] == [
        "LlamaForCausalLM",
        "LlamaForCausalLM",
        "LlamaForTokenClassification",
    ]
    assert ranks[1]["built"]["loads"] == []
    for rank in ranks:
        assert rank["built"]["sharded_devices"] == {"meta"}


@pytest.mark.slow
def test_the_timeout_from_the_config_reaches_the_process_group(ranks):
    assert [rank["timeouts_s"] for rank in ranks] == [[TIMEOUT_S, TIMEOUT_S]] * 2  # actor, critic


@pytest.mark.slow
def test_sharded_model_equals_the_single_process_model(ranks):
    model = load_causal_lm("tiny", dtype="float32")
    want = model.state_dict()
    for weights in (ranks[0]["weights"], ranks[0]["ref_weights"]):
        assert weights.keys() == want.keys()
        assert all(torch.equal(weights[k], want[k]) for k in want)
    buffers = {f"model.{k}": v for k, v in model.named_buffers()}  # rotary frequencies: not in the state dict
    for rank in ranks:
        assert rank["buffers"].keys() == buffers.keys()
        assert all(torch.equal(rank["buffers"][k], buffers[k]) for k in buffers)


def single_process_log_probs(i: int) -> torch.Tensor:
    ids = episodes()["input_ids"][i][None]
    with torch.no_grad():
        logits = load_causal_lm("tiny", dtype="float32")(input_ids=ids).logits
    picked = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    return torch.cat([torch.zeros(1), picked])


@pytest.mark.slow
def test_asymmetric_packed_scoring_finishes_and_matches_padded(ranks):
    padded = {i: lp for r in (0, 1) for i, lp in by_episode(PADDED[r], ranks[r]["padded_log_probs"]).items()}
    packed = {i: lp for r in (0, 1) for i, lp in by_episode(PACKED[r], ranks[r]["packed_log_probs"]).items()}
    ref = {i: lp for r in (0, 1) for i, lp in by_episode(PACKED[r], ranks[r]["packed_ref_log_probs"]).items()}
    for i, mask in enumerate(episodes()["loss_mask"]):
        want = single_process_log_probs(i) * mask  # policy scores exist where the loss needs them
        assert (padded[i] - want).abs().max() < 1e-5, i
        assert (packed[i] - want).abs().max() < 1e-5, i
        assert (ref[i] - want).abs().max() < 1e-5, i
    padded_v = {i: v for r in (0, 1) for i, v in by_episode(PADDED[r], ranks[r]["padded_values"]).items()}
    packed_v = {i: v for r in (0, 1) for i, v in by_episode(PACKED[r], ranks[r]["packed_values"]).items()}
    assert any(v.abs().max() > 1e-4 for v in padded_v.values())  # the trained head scores something
    assert all((packed_v[i] - padded_v[i]).abs().max() < 1e-5 for i in padded_v)


@pytest.mark.slow
def test_asymmetric_packed_update_finishes_and_matches_padded(ranks):
    (padded_m, padded_g), (packed_m, packed_g) = ranks[0]["padded_update"], ranks[0]["packed_update"]
    assert padded_m["actor/skipped_steps"] == packed_m["actor/skipped_steps"] == 0
    for key in ("actor/pg_loss", "actor/entropy", "actor/ppo_kl", "actor/grad_norm"):
        assert packed_m[key] == pytest.approx(padded_m[key], abs=1e-5), key
    assert padded_g.keys() == packed_g.keys() and padded_g
    assert max(float((padded_g[k] - packed_g[k]).abs().max()) for k in padded_g) / 0.1 < 1e-5
    assert max(float(g.abs().max()) for g in padded_g.values()) > 1e-4  # a real gradient


# ---------------------------------------------------------------- 4. per-step memory peak


def test_memory_peak_is_the_steps_own():
    memory_metrics("cpu")  # the previous step ends here
    big = torch.ones(64 * 2**20)  # 256 MiB, written
    del big
    first = memory_metrics("cpu")["perf/max_memory_allocated_gb"]
    small = torch.ones(2**20)  # 4 MiB
    del small
    second = memory_metrics("cpu")["perf/max_memory_allocated_gb"]
    assert first - second > 0.2
    assert math.isfinite(second) and second > 0
