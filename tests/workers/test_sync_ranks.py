"""The weight hand-over to a rollout worker of its own (`actor_rollout_ref.hybrid_engine=false`):
only rank 0 sends the weights, so only rank 0 may hold them whole on the host. Two real ranks
(spawned processes, gloo), as in tests/workers/test_gpu_readiness.py."""

import gc

import pytest
import torch

from grl.config import compose, typed_section
from grl.engines.host_memory import release_freed_host_memory
from grl.run_plan import RunPlan
from tests.workers.test_gpu_readiness import run_two_ranks


def _model_folder(path) -> int:
    """A Llama of many equal-sized weights (the largest about 1/60 of the whole, where the tiny
    model's embedding is nearly all of it), so that holding one gathered tensor at a time and
    holding them all differ by far more than the allocator's noise. Returns its bytes in fp32."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=256,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=16,
        num_attention_heads=4,
        num_key_value_heads=4,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    return sum(p.numel() for p in model.parameters()) * 4


def _resident_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def _hand_over(rank, ports, cfg):
    from grl.workers.policy import PolicyWorker

    actor = PolicyWorker(
        rank,
        RunPlan.from_config(cfg),
        typed_section(cfg, "actor_rollout_ref"),
        typed_section(cfg, "trainer"),
    )
    actor.setup("127.0.0.1", ports[0])
    actor.host_weights()  # the first gathers set up gloo's buffers: not what is measured
    # Live memory only (freed heap returned), then the peak from here (as bench/bench_plan_accuracy.py).
    gc.collect()
    release_freed_host_memory()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    start = _resident_kib("VmRSS")
    weights = actor.host_weights()
    rise = (_resident_kib("VmHWM") - start) * 1024
    actor.teardown()
    return {"weights": None if weights is None else dict(weights), "rise": rise}


@pytest.mark.slow  # two spawned ranks build a model: about 30 s on 2 cores
def test_only_rank0_holds_the_weights_it_hands_to_the_rollout_worker(tmp_path):
    from transformers import AutoModelForCausalLM

    full = _model_folder(tmp_path / "model")
    cfg = compose(
        [
            f"model_path={tmp_path / 'model'}",
            "n_gpus_per_node=2",
            "nnodes=1",
            "trainer.device=cpu",
            "actor_rollout_ref.model.dtype=float32",
        ]
    )
    (rank0, rank1), errors = run_two_ranks(_hand_over, cfg)
    assert errors == [None, None], next(e for e in errors if e)

    want = AutoModelForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    want.pop("lm_head.weight")  # tied: the receiver ties it
    assert rank0["weights"].keys() == want.keys()
    assert all(torch.equal(rank0["weights"][k], want[k]) for k in want)
    assert rank1["weights"] is None
    # Rank 0 holds the whole model at once; rank 1 one gathered tensor at a time.
    assert rank0["rise"] > full / 2, rank0["rise"]
    assert rank1["rise"] < full / 4, rank1["rise"]
