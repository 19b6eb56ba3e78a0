"""The memory planner (grl.planner) and perf/mfu/actor: parameter counts against the models
transformers builds, FLOPs against verl's hand-written figure, the presets against their hardware."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grl.config import load_config, run_sections
from grl.run_plan import RunPlan
from grl.planner import GIB, KNOWN_MODELS, ModelShape, format_plan, model_shape, plan, plan_run, train_flops

GPU_PRESETS = sorted(
    p.stem
    for p in (Path(__file__).resolve().parents[1] / "configs" / "preset").glob("*.yaml")
    if "cpu" not in p.stem.split("_")
)


def _count_params(config, kind: str = "policy") -> int:
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    with torch.device("meta"):
        model = (AutoModelForCausalLM if kind == "policy" else AutoModelForTokenClassification).from_config(
            config
        )
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", ["tiny", "embedded"])
def test_parameter_counts_match_the_models_transformers_builds(name):
    from transformers import AutoConfig

    from grl.models import resolve_model_path

    config = AutoConfig.from_pretrained(resolve_model_path(name))
    shape = model_shape(name)
    assert shape.params == _count_params(config)
    config.num_labels = 1
    assert shape.value_params == _count_params(config, "value")


@pytest.mark.parametrize("name", sorted(KNOWN_MODELS))
def test_table_of_preset_models_matches_qwen2(name):
    from transformers import Qwen2Config

    known = KNOWN_MODELS[name]
    config = Qwen2Config(
        num_hidden_layers=known["layers"],
        hidden_size=known["hidden"],
        intermediate_size=known["intermediate"],
        num_attention_heads=known["heads"],
        num_key_value_heads=known["kv_heads"],
        vocab_size=known["vocab"],
        tie_word_embeddings=known["tied"],
    )
    assert ModelShape(**known).params == _count_params(config)


def test_train_flops_match_verls_hand_computation():
    # verl's tests/utils/test_flops_counter.py writes the Qwen2.5-7B figure out as this sum.
    expected = (
        6
        * (152064 * 3584 * 2 + 28 * (3584 * (3584 + 512 + 512 + 3584) + 3584 * 18944 * 3))
        * (512 + 1024 + 2048)
        + 12 * (512 * 512 + 1024 * 1024 + 2048 * 2048) * 28 * 3584
    )
    shape = ModelShape(**KNOWN_MODELS["Qwen2.5-7B-Instruct"])
    assert train_flops(shape, 512 + 1024 + 2048, 512**2 + 1024**2 + 2048**2) == expected


def test_mfu_is_the_computed_model_flops_per_device_over_the_update_time():
    from grl.rollout.types import Batch
    from grl.trainer.metrics import throughput_metrics

    shape = ModelShape(layers=2, hidden=8, intermediate=16, heads=2, kv_heads=1, vocab=32, tied=True)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    batch = Batch({"attention_mask": mask, "loss_mask": mask.float()})
    update = {
        "perf/actor/computed_tokens": 7.0,  # say a 1-token prompt the two episodes share
        "perf/actor/computed_attention_pairs": 1.0 + (9 - 1) + (25 - 1),
        "perf/actor/computed_head_tokens": 3.0,
    }
    # By hand: per layer MLP 3*8*16 = 384 and attention q, k, v, o 8*(8+4+4+8) = 192 weights, 6 FLOPs per
    # weight per token over 7 tokens; the head 32*8 = 256 over the 3 scored; attention 12*33*q(8)*layers(2).
    flops = 6 * (2 * (384 + 192) * 7 + 256 * 3) + 12 * 33 * 8 * 2
    metrics = throughput_metrics(
        batch,
        {"update_actor": 2.0, "step": 3.0},
        n_gpus=4,
        shape=shape,
        peak_flops=989e12,
        actor_update=update,
    )
    assert metrics["perf/mfu/actor"] == pytest.approx(flops / (2.0 * 989e12 * 4))
    assert "perf/mfu/actor" not in throughput_metrics(
        batch, {"update_actor": 2.0}, n_gpus=1, actor_update=update
    )
    assert "perf/mfu/actor" not in throughput_metrics(batch, {"update_actor": 2.0}, 1, shape, 989e12)


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_every_gpu_preset_fits_its_hardware(preset):
    cfg = load_config([f"preset={preset}"])
    assert cfg.trainer.gpu_memory_gb, f"{preset} names no trainer.gpu_memory_gb"
    memory = plan_run(run_sections(cfg))
    assert memory.overflow() is None, format_plan(memory)


def test_7b_full_fine_tune_on_one_48gb_gpu_exits_2_with_one_line(capsys):
    from grl.cli import main

    assert main(["plan", "preset=l40_1x_0.5b", "model_path=Qwen/Qwen2.5-7B-Instruct"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("grl plan: gen: needs") and "set actor_rollout_ref." in lines[0]


def test_preflight_stops_a_config_that_does_not_fit():
    from grl.preflight import PreflightError, check_memory
    from grl.run_plan import build_run

    too_big, fits = (
        load_config(["preset=l40_1x_0.5b", "model_path=Qwen/Qwen2.5-7B-Instruct"]),
        load_config(["preset=h200_4x_7b"]),
    )
    with pytest.raises(PreflightError, match=r"memory plan \(grl plan\): .* set "):
        check_memory(build_run(too_big))
    assert check_memory(build_run(fits)) == []


def _rows(memory, phase):
    return {name: row.get(phase, 0.0) for name, row in memory.device.items()}


def test_state_rows_are_the_sharded_bytes_and_offload_moves_them_to_host():
    cfg = load_config(["preset=h200_4x_7b"])
    shape = ModelShape(**KNOWN_MODELS["Qwen2.5-7B-Instruct"])
    on_gpu = _rows(plan(run_sections(cfg), gpu_memory_gib=139.8), "update_actor")
    # fp32 master shards over 4 ranks, AdamW's two moments, fp32 gradients; the ref in bf16.
    assert on_gpu["actor weights (master)"] == shape.params * 4 / 4
    assert on_gpu["actor optimizer (AdamW m, v)"] == 2 * shape.params * 4 / 4
    assert on_gpu["actor gradients"] == shape.params * 4 / 4
    assert on_gpu["ref weights"] == shape.params * 2 / 4
    offloaded = plan(
        run_sections(
            load_config(["preset=h200_4x_7b", "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"])
        ),
        gpu_memory_gib=139.8,
    )
    assert "actor optimizer (AdamW m, v)" not in offloaded.device
    # The host holds every rank's shards of the node: the whole optimizer state.
    assert offloaded.host["actor optimizer (AdamW m, v)"]["update_actor"] == 2 * shape.params * 4
    assert offloaded.device_total("update_actor") == pytest.approx(
        plan(run_sections(cfg), gpu_memory_gib=139.8).device_total("update_actor") - 4 * shape.params * 4 / 4
    )


def test_checkpointing_chunk_size_and_sleep_change_their_rows():
    base = ["preset=a100_1x_0.5b"]
    full = _rows(plan(run_sections(load_config(base)), gpu_memory_gib=79.2), "update_actor")
    no_ckpt = _rows(
        plan(
            run_sections(load_config(base + ["actor_rollout_ref.model.enable_gradient_checkpointing=false"])),
            gpu_memory_gib=79.2,
        ),
        "update_actor",
    )
    assert no_ckpt["activations"] > 5 * full["activations"]
    half = _rows(
        plan(
            run_sections(load_config(base + ["actor_rollout_ref.actor.logits_chunk_size=256"])),
            gpu_memory_gib=79.2,
        ),
        "update_actor",
    )
    assert half["log-prob chunk"] == pytest.approx(full["log-prob chunk"] / 4)  # 256 of 1024 rows
    awake = plan(
        run_sections(load_config(base + ["actor_rollout_ref.rollout.free_cache_engine=false"])),
        gpu_memory_gib=79.2,
    )
    assert _rows(awake, "update_actor")["engine (gpu_memory_utilization)"] == pytest.approx(0.5 * 79.2 * GIB)
    assert "engine (gpu_memory_utilization)" not in {k for k, v in full.items() if v}


def test_planner_imports_no_torch():
    code = "import sys, grl.planner, grl.config; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lora_parameter_count_matches_peft():
    from peft import LoraConfig, get_peft_model

    from grl.models import load_causal_lm

    model = get_peft_model(load_causal_lm("tiny", "float32"), LoraConfig(r=8, target_modules="all-linear"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert model_shape("tiny").lora_params(8) == trainable


def test_unsharded_root_gradients_are_charged_to_the_update():
    shape = ModelShape(**KNOWN_MODELS["Qwen2.5-7B-Instruct"])
    full = _rows(plan(run_sections(load_config(["preset=h200_4x_7b"])), gpu_memory_gib=139.8), "update_actor")
    # Embedding, final norm and untied head, bf16 gradients and their fp32 reduce-scatter copy: 6.1 GiB.
    assert full["unsharded root gradients"] == (2 * shape.vocab * shape.hidden + shape.hidden) * (2 + 4)
    lora = plan(
        run_sections(load_config(["preset=h200_4x_7b", "actor_rollout_ref.model.lora_rank=8"])),
        gpu_memory_gib=139.8,
    )
    assert not _rows(lora, "update_actor").get("unsharded root gradients")  # frozen under LoRA


def test_a_separate_engine_is_charged_to_its_own_gpu_not_the_actors():
    # The engine on a GPU of its own may take most of it; on the actor's GPU that would not fit.
    big = ["preset=h200_4x_7b", "gpu_memory_utilization=0.7"]
    colocated = plan(run_sections(load_config(big)), gpu_memory_gib=139.8)
    assert colocated.overflow().startswith("gen: ")
    separate = plan(
        run_sections(load_config(big + ["actor_rollout_ref.hybrid_engine=false"])), gpu_memory_gib=139.8
    )
    assert separate.overflow() is None, format_plan(separate)
    assert not any(name.startswith("engine") for name in separate.device)
    # Rank 0 alone collects the weights for the rollout worker, on the host.
    shape = ModelShape(**KNOWN_MODELS["Qwen2.5-7B-Instruct"])
    assert separate.host["weights for the rollout worker (rank 0)"] == {"sync_weights": shape.params * 2}


def test_ref_offload_follows_the_workers_rule():
    on = ["preset=h200_4x_7b", "actor_rollout_ref.ref.fsdp_config.optimizer_offload=true"]
    assert "ref weights" in plan(run_sections(load_config(on[:1])), gpu_memory_gib=139.8).device
    offloaded = plan(run_sections(load_config(on)), gpu_memory_gib=139.8)
    assert "ref weights" not in offloaded.device and "ref weights" in offloaded.host


def test_critic_runs_beside_what_the_actors_process_keeps_cached():
    memory = plan(run_sections(load_config(["preset=h200_4x_7b"])), gpu_memory_gib=139.8)
    actor_pass = sum(
        _rows(memory, "old_log_prob")[name] for name in ("gathered weights", "activations", "log-prob chunk")
    )
    for phase in ("values", "update_critic"):
        assert _rows(memory, phase)["cached by the actor's process"] == pytest.approx(actor_pass)
    assert not any(
        _rows(memory, phase).get("cached by the actor's process")
        for phase in ("gen", "old_log_prob", "ref", "update_actor", "sync_weights")
    )


@pytest.fixture
def process_group_env(monkeypatch):
    """A worker joins a process group in this process: its environment and threads are put back after."""
    for key in (
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "GLOO_SOCKET_IFNAME",
        "NCCL_SOCKET_IFNAME",
    ):
        monkeypatch.setenv(key, "")  # records the value before, which undoing the next line cannot
        monkeypatch.delenv(key)
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_planner_sizes_what_the_worker_builds(process_group_env, caplog):
    """One config through both paths: the master weights' dtype (fp16 on CPU is not mixed precision)
    and the reference's offload (optimizer_offload alone turns it on)."""
    import logging

    from grl.config import typed_section
    from grl.workers.policy import PolicyWorker

    overrides = [
        "model_path=tiny",
        "n_gpus_per_node=1",
        "actor_rollout_ref.model.dtype=float16",
        "algorithm.use_kl_in_reward=true",
        "actor_rollout_ref.ref.fsdp_config.optimizer_offload=true",
    ]
    cfg = load_config(overrides + ["trainer.device=cpu"])
    run = RunPlan.from_config(cfg)
    worker = PolicyWorker(0, run, typed_section(cfg, "actor_rollout_ref"), typed_section(cfg, "trainer"))
    try:
        with caplog.at_level(logging.INFO, logger="grl.workers"):
            worker.setup(*worker.listen(True))
        built = next(worker.module.parameters()).dtype.itemsize
        built_ref = worker.ref is not None
    finally:
        worker.teardown()
    # On CPU offload changes no placement; the worker says it would have offloaded (grl/workers/fsdp.py,
    # shard).
    ref_offloaded = any(
        r.getMessage().startswith("actor (ref): parameter/optimizer offload") for r in caplog.records
    )

    master = (
        plan(run_sections(cfg), run=run).device["actor weights (master)"]["update_actor"]
        / model_shape("tiny").params
    )
    assert master == built == 2
    planned_ref = any(name.startswith("ref weights") for name in plan(run_sections(cfg), run=run).device)
    assert planned_ref == built_ref == run.reference_model is True
    # Where offload shows in a plan: the same config on a GPU puts the reference in host memory.
    on_gpu = plan(run_sections(load_config(overrides + ["trainer.device=cuda"])), gpu_memory_gib=80.0)
    assert ref_offloaded and "ref weights" in on_gpu.host


# The GPU proof kit's three H100 runs (docs/PERFORMANCE.md, "GPU proof kit"): the hf run's config
# (scripts/gpu_kit/run.py), its longest episode and sampled tokens, and what NVML measured, GiB (train and
# resume of 2026-11-27, the train of the second run that day, train and resume of 2026-11-28).
KIT_NVML_GIB = {
    "actor": [4.97, 5.06, 4.75, 4.98, 5.01],
    "critic": [4.06, 4.63, 4.06, 4.06, 4.63],
    "device": [8.36, 9.23, 8.14, 8.37, 9.19],
}


def test_the_plan_of_the_kit_s_run_is_within_a_quarter_of_each_process_and_of_the_device():
    """Each process's whole footprint (its CUDA context and its allocator's reserve as well as what it
    allocates) is planned, so the plan's peak per process and per GPU is within 25% of what NVML saw."""
    from tests.test_gpu_kit import load

    kit_run = load("run").RUN_OVERRIDES
    memory = plan(run_sections(load_config(kit_run)), gpu_memory_gib=79.2, seq_len=729, sampled_tokens=300)
    planned = {name: max(share.values()) / GIB for name, share in memory.processes.items()}
    planned["device"] = max(memory.device_total(phase) for phase in memory.phases) / GIB
    for name, measured in KIT_NVML_GIB.items():
        assert all(abs(planned[name] / peak - 1) <= 0.25 for peak in measured), (
            name,
            planned[name],
            measured,
        )
    for phase in memory.phases:
        assert sum(share[phase] for share in memory.processes.values()) == pytest.approx(
            memory.device_total(phase)
        )


def test_the_hf_engines_kv_row_is_every_row_kept_and_a_chunk_at_work_within_its_budget():
    """preset=cpu's 64 agents of up to 2,064 tokens; `kv_cache_gb` caps the row (the rest of the rows wait,
    grl/rollout/multi_turn.py)."""
    from grl.engines.prefix_store import kv_token_bytes

    base = ["preset=cpu", "model_path=embedded", "actor_rollout_ref.model.dtype=bfloat16"]
    shape = model_shape("embedded")
    unbounded = _rows(plan(run_sections(load_config(base)), shape=shape), "gen")
    expected = (64 + 64) * (2048 + 16) * kv_token_bytes(shape.layers, shape.kv, 2)
    assert unbounded["engine KV cache (hf)"] == pytest.approx(expected)
    capped = plan(
        run_sections(load_config(base + ["actor_rollout_ref.rollout.kv_cache_gb=1.5"])), shape=shape
    )
    assert _rows(capped, "gen")["engine KV cache (hf)"] == pytest.approx(1.5 * GIB)
    assert _rows(capped, "update_actor")["engine KV cache (hf)"] == 0  # let go at the engine's sleep
