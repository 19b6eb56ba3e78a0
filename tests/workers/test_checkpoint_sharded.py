"""Sharded state of 2 FSDP2 ranks (tiny model, gloo): each rank saves and reads only its own
checkpoint shards, and the weight sync hands the engine one gathered tensor at a time."""

import sys
import weakref

import pytest
import ray
import torch

pytestmark = pytest.mark.slow

from grl.config import compose
from grl.engines.weights import WeightMismatchError
from grl.run_plan import RunPlan
from grl.workers import ActorRolloutRefGroup
from grl.workers.sharded import SHARDS_DIR
from tests.workers.test_worker_groups import OVERRIDES, _full_weights, cfg, make_batch  # noqa: F401 (cfg: Ray)

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _full_optimizer_state(worker):
    from grl.workers.fsdp import full_optimizer_state

    return {
        name: {k: v.clone() for k, v in s.items()}
        for name, s in full_optimizer_state(worker.module, worker.optimizer).get("state", {}).items()
    }  # rank 0


def _load_and_count(worker, path):
    from grl.workers import sharded

    return sharded.load(path, worker.module, worker.optimizer, False, worker.world_size)[1]


def _stream_in(worker, dtype):
    """Every rank gathers; rank 0 checks each tensor as it comes: its dtype, its value, and that
    no tensor handed out before it is still alive (the stream holds one at a time)."""
    from grl.workers.fsdp import full_state_dict
    from grl.workers.worker import hf_names

    want = {k: v.clone() for k, v in hf_names(full_state_dict(worker.module, on_all_ranks=True)).items()}
    stream = worker._policy_tensors(hf_names(worker.module.state_dict()), dtype)
    handed, alive, names = [], 0, []
    for name, tensor in stream:
        alive = max(alive, sum(ref() is not None for ref in handed))
        assert tensor.dtype == dtype and torch.equal(tensor, want[name].to(dtype)), name
        handed.append(weakref.ref(tensor))
        names.append(name)
    return names, alive, sorted(want)


def _engine_weights(worker):
    return (
        None if worker.engine is None else {k: v.clone() for k, v in worker.engine.model.state_dict().items()}
    )


def _break_engine_spec(worker, broken):
    if worker.engine is not None:
        if broken:
            worker.saved_spec = worker.engine.spec
            shapes = dict(worker.saved_spec.shapes)
            shapes.pop(next(iter(shapes)))
            worker.engine.spec = type(worker.saved_spec)(shapes, worker.saved_spec.aliases)
        else:
            worker.engine.spec = worker.saved_spec


@pytest.fixture(scope="module")
def actor(cfg):  # noqa: F811 - the imported fixture, requested by name
    group = ActorRolloutRefGroup.from_config(compose(OVERRIDES), RunPlan.from_config(compose(OVERRIDES)))
    yield group
    group.shutdown()


@pytest.fixture(scope="module")
def batch(actor):
    b = make_batch()
    b["old_log_probs"], _ = actor.compute_log_probs(b)
    return b


def test_each_rank_writes_and_reads_only_its_shards_and_resumes_exactly(actor, batch, tmp_path):
    actor.update(batch, step=1)  # AdamW state exists: the checkpoint holds weights plus two moments each
    actor.save_checkpoint(tmp_path / "ckpt")
    weights, moments = actor.execute(_full_weights)[0], actor.execute(_full_optimizer_state)[0]
    full = sum(v.numel() * v.element_size() for v in weights.values())
    full += sum(v.numel() * v.element_size() for s in moments.values() for v in s.values())
    shards = tmp_path / "ckpt" / SHARDS_DIR
    assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        SHARDS_DIR,
        "rng_rank0.pt",
        "rng_rank1.pt",
        "state.pt",
    ]
    sizes = [(shards / f"__{rank}_0.distcp").stat().st_size for rank in (0, 1)]
    assert all(size < 0.6 * full for size in sizes), (sizes, full)  # neither rank wrote the whole state
    assert full <= sum(sizes) < 1.02 * full

    actor.update(batch, step=1)  # move away from the checkpoint, then come back
    read = actor.execute(_load_and_count, str(tmp_path / "ckpt"))
    assert all(r < 0.6 * full for r in read) and full <= sum(read) < 1.02 * full, (read, full)
    assert all(torch.equal(v, weights[k]) for k, v in actor.execute(_full_weights)[0].items())
    got = actor.execute(_full_optimizer_state)[0]
    assert all(torch.equal(got[p][k], moments[p][k]) for p in moments for k in moments[p])


def test_sync_streams_one_engine_dtype_tensor_at_a_time(actor, batch):
    names, alive, want = actor.execute(_stream_in, torch.bfloat16)[0]
    assert sorted(names) == [n for n in want if n != "lm_head.weight"]  # tiny ties its head to the embedding
    assert len(names) > 10 and alive == 0

    actor.update(batch, step=1)
    actor.sync_weights()
    trained = actor.execute(_full_weights)[0]
    synced = actor.execute(_engine_weights)[0]  # rank 0 holds the engine on CPU
    assert synced.keys() == trained.keys()
    assert all(torch.equal(synced[k], trained[k]) for k in trained)


def test_an_engine_error_leaves_no_rank_waiting_in_a_gather(actor, batch):
    actor.execute(_break_engine_spec, True)
    try:
        with pytest.raises(WeightMismatchError, match="unknown tensor name"):
            actor.sync_weights()
    finally:
        actor.execute(_break_engine_spec, False)
    actor.update(batch, step=1)
    actor.sync_weights()  # the next collectives line up: rank 1 ran every gather of the failed sync
    assert all(
        torch.equal(actor.execute(_engine_weights)[0][k], v)
        for k, v in actor.execute(_full_weights)[0].items()
    )
