"""LoRA on the policy: 2 FSDP2 ranks over the adapted tiny model, checked against
peft's own merge, the base model (the reference), the exported folders and a
fresh group resumed from the adapter-only checkpoint."""

from dataclasses import replace

import peft
import pytest
import torch

pytestmark = pytest.mark.slow

from grl.config import compose
from grl.engines import make_engine
from grl.engines.base import SamplingParams
from grl.models import load_causal_lm
from grl.run_plan import RunPlan
from grl.workers import ActorRolloutRefGroup
from grl.workers.lora import add_adapter, merged_weights
from grl.workers.sharded import saved_names
from tests.workers.test_worker_groups import OVERRIDES, _full_weights, cfg, make_batch, reference_scores  # noqa: F401 (cfg: Ray)

RANK, ALPHA = 4, 8
LORA = [
    f"actor_rollout_ref.model.lora_rank={RANK}",
    f"actor_rollout_ref.model.lora_alpha={ALPHA}",
    "actor_rollout_ref.actor.optim.lr=0.05",
]


@pytest.fixture(scope="module")
def lora_cfg(cfg):  # noqa: F811 - the imported fixture, requested by name
    return compose(OVERRIDES + LORA)


@pytest.fixture(scope="module")
def actor(lora_cfg):
    group = ActorRolloutRefGroup.from_config(lora_cfg, RunPlan.from_config(lora_cfg))
    yield group
    group.shutdown()


@pytest.fixture(scope="module")
def batch(actor):
    b = make_batch()
    b["old_log_probs"], _ = actor.compute_log_probs(b)
    b["ref_log_probs"] = actor.compute_ref_log_probs(b)
    return b


def test_merge_equals_peft_merge_and_unload(lora_cfg):
    model = load_causal_lm("tiny", dtype="float32")
    adapted = add_adapter(model, lora_cfg.actor_rollout_ref.model)
    with torch.no_grad():
        for name, p in adapted.named_parameters():
            if "lora_B" in name:
                p.normal_(generator=torch.Generator().manual_seed(len(name)))
    ours = merged_weights(adapted.base_model.model.state_dict(), ALPHA / RANK)
    theirs = adapted.merge_and_unload().state_dict()
    assert ours.keys() == theirs.keys()
    assert max(float((ours[k] - theirs[k]).abs().max()) for k in ours) < 1e-6


def test_only_the_adapter_trains_and_the_reference_is_the_base(actor, batch):
    before = actor.execute(_full_weights)[0]
    assert any(".lora_A." in k for k in before) and any(".base_layer." in k for k in before)
    with torch.no_grad():
        base_lp, _ = reference_scores(load_causal_lm("tiny", dtype="float32"), batch)
    actor.update(batch, step=1)
    after = actor.execute(_full_weights)[0]
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_" in k for k in changed)
    base_lp = base_lp.where(batch["loss_mask"] > 0, 0.0)  # policy scores exist where the loss needs them
    assert (actor.compute_ref_log_probs(batch) - base_lp).abs().max() < 1e-5  # adapter off = base model
    assert (actor.compute_log_probs(batch)[0] - base_lp).abs().max() > 1e-3


def test_sync_gives_the_engine_the_merged_model(actor, batch, tmp_path, vllm_cpu):
    from transformers import AutoModelForCausalLM

    prompts = [[1, 42, 7, 99], [5, 6, 7, 8, 9, 10]]
    greedy = SamplingParams(temperature=0.0, greedy=True, max_new_tokens=6)
    actor.update(batch, step=1)
    actor.sync_weights()
    synced = actor.engine.generate(prompts, greedy)
    actor.export_hf(tmp_path / "hf")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    with_adapter = peft.PeftModel.from_pretrained(
        load_causal_lm("tiny", dtype="float32"), tmp_path / "hf" / "adapter"
    )
    ids = torch.tensor([prompts[1]])
    with torch.no_grad():
        assert (merged(ids).logits - with_adapter(ids).logits).abs().max() < 1e-4
    exported = make_engine("hf", str(tmp_path / "hf"), dtype="float32", device="cpu")
    try:
        want = exported.generate(prompts, greedy)
    finally:
        exported.shutdown()
    assert [o.token_ids for o in synced] == [o.token_ids for o in want]
    for got, ref in zip(synced, want):
        assert max(abs(a - b) for a, b in zip(got.log_probs, ref.log_probs)) < 1e-5
    if vllm_cpu:  # the GPU engine: tests/gpu
        in_vllm = make_engine("vllm", str(tmp_path / "hf"))
        try:
            assert [o.token_ids for o in in_vllm.generate(prompts, greedy)] == [o.token_ids for o in want]
        finally:
            in_vllm.shutdown()


def test_the_sync_check_covers_the_merged_adapter(actor, batch):
    """The digests compared at each sync are of the merged weights: an engine that never gets the adapter
    (verl#7495) stops the sync with one line naming an adapted Linear, and the real sync passes."""
    from grl.engines.weights import WeightsMismatch

    def _keep_adapted_layers(worker, keep: bool) -> list[str]:
        """Rank 0's engine takes every tensor but the adapted Linears', whose values it keeps: the merged
        adapter never reaches it. -> the adapted Linears' names."""
        from grl.workers import lora
        from grl.workers.worker import hf_names

        adapted = sorted(
            lora.plain_name(n)
            for n in hf_names(worker.module.state_dict())
            if n.endswith(lora.BASE + "weight")
        )
        if worker.engine is None:
            return adapted
        engine = worker.engine
        if not keep:
            vars(engine).pop("update_weights", None)
            return adapted
        load, current = engine.update_weights, engine.model.state_dict()

        def without_adapter(named_tensors):
            load(
                [
                    (name, current[name].clone() if name in adapted else tensor)
                    for name, tensor in named_tensors
                ]
            )

        engine.update_weights = without_adapter
        return adapted

    actor.update(batch, step=1)  # B moves off zero: merged != base
    adapted = actor.execute(_keep_adapted_layers, True)[0]
    try:
        with pytest.raises(WeightsMismatch) as info:
            actor.sync_weights()
    finally:
        actor.execute(_keep_adapted_layers, False)
    message = str(info.value)
    assert f"in {len(adapted)} of " in message and message.split("e.g. ")[1].split("'")[1] in adapted
    actor.sync_weights()
    assert actor.weights_check.tensors > len(adapted) and not actor.weights_check.mismatched


def test_checkpoint_holds_the_adapter_and_resumes_exactly(lora_cfg, actor, batch, tmp_path):
    actor.save_checkpoint(tmp_path / "ckpt")
    saved = saved_names(tmp_path / "ckpt")["model"]  # the sharded checkpoint's weight names
    assert saved and all(".lora_" in k for k in saved)
    log_probs, _ = actor.compute_log_probs(batch)
    metrics = actor.update(batch, step=1)
    after = actor.execute(_full_weights)[0]
    fresh = ActorRolloutRefGroup.from_config(
        lora_cfg, replace(RunPlan.from_config(lora_cfg), use_reference=False)
    )
    try:
        fresh.load_checkpoint(tmp_path / "ckpt")
        assert torch.equal(fresh.compute_log_probs(batch)[0], log_probs)
        learned = {k: v for k, v in metrics.items() if not k.startswith("perf/")}  # memory readings vary
        assert {k: v for k, v in fresh.update(batch, step=1).items() if not k.startswith("perf/")} == learned
        got = fresh.execute(_full_weights)[0]
        assert all(torch.equal(got[k], after[k]) for k in after)
    finally:
        fresh.shutdown()
