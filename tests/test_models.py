"""Model resolution: embedded GGUF conversion, the tiny model, clear errors."""

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from grl import compute, models


def test_embedded_converts_once_and_generates_text():
    path = models.resolve_model_path("embedded")
    tokenizer = models.load_tokenizer("embedded")
    model = models.load_causal_lm("embedded")
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576  # SmolLM2-135M
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    reply = tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in reply
    assert models.resolve_model_path("embedded") == path


def test_tiny_model_is_small_seeded_and_shares_the_tokenizer():
    tiny = models.load_causal_lm("tiny")
    assert tiny.config.num_hidden_layers == 2 and tiny.config.hidden_size == 64
    assert len(models.load_tokenizer("tiny")) == len(models.load_tokenizer("embedded"))
    again = models.load_causal_lm("tiny")
    for a, b in zip(tiny.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)


def test_critic_has_a_zero_value_head_on_the_same_backbone(capfd):
    critic = models.load_critic("tiny")
    assert "score.weight" not in capfd.readouterr().err  # the expected new head is not reported as a problem
    ids = torch.tensor([[1, 2, 3, 4]])
    values = critic(input_ids=ids).logits
    assert values.shape == (1, 4, 1)
    assert torch.count_nonzero(values) == 0


def test_missing_path_names_it():
    with pytest.raises(models.ModelLoadError, match="/no/such/model"):
        models.resolve_model_path("/no/such/model")


def test_unreachable_hub_id_names_it(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(models.ModelLoadError, match="nobody-here/no-such-model"):
        models.load_tokenizer("nobody-here/no-such-model")


@pytest.mark.slow
def test_concurrent_conversions_leave_one_complete_folder(tmp_path):
    script = (
        "import sys; from grl import models; p = models.tiny_model_path(); "
        "from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained(p); print(p)"
    )
    env = {**__import__("os").environ, "GRL_CACHE_DIR": str(tmp_path)}
    # Both processes reuse the shared embedded tokenizer by pointing the embedded entry at the real cache.
    (tmp_path / "smollm2-135m-instruct").symlink_to(models.embedded_model_path())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outputs]
    entries = sorted(x.name for x in tmp_path.iterdir())
    assert entries == ["smollm2-135m-instruct", "tiny-llama-2x64-h32"], entries  # no temp folders left behind


@pytest.fixture
def cpu_reports(monkeypatch):
    """Make torch report a CPU of our choosing: its capability and which bf16 instructions it has."""

    def report(capability: str, amx: bool = False, avx512_bf16: bool = False) -> None:
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)

    return report


@pytest.mark.parametrize(
    "capability, amx, avx512_bf16, expected",
    [
        ("AVX2", False, False, torch.float32),  # most laptops, AMD before Zen 4
        ("AVX512", False, False, torch.float32),  # Skylake-X: AVX-512 without bf16 instructions
        ("AVX512", False, True, torch.bfloat16),  # Zen 4, Cooper Lake
        ("AVX512", True, True, torch.bfloat16),  # Sapphire Rapids (AMX)
        ("AVX2", True, True, torch.float32),  # ATEN_CPU_CAPABILITY=avx2 caps torch's kernels
        ("DEFAULT", False, False, torch.float32),  # ARM, or a build without vector kernels
    ],
)
def test_auto_dtype_follows_what_torch_reports(cpu_reports, capability, amx, avx512_bf16, expected):
    cpu_reports(capability, amx, avx512_bf16)
    assert compute.torch_dtype("auto", "cpu") == expected
    assert compute.torch_dtype("auto", "cuda") == torch.bfloat16
    assert (
        compute.torch_dtype("float32", "cpu") == torch.float32
        and compute.torch_dtype("bf16", "cpu") == torch.bfloat16
    )


def test_capping_onednn_below_bf16_makes_auto_fp32(cpu_reports, monkeypatch):
    cpu_reports("AVX512", amx=True, avx512_bf16=True)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert compute.torch_dtype("auto", "cpu") == torch.float32
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "avx512_core_amx")
    assert compute.torch_dtype("auto", "cpu") == torch.bfloat16


def test_banner_and_preflight_say_what_the_cpu_computes_in(cpu_reports, tmp_path):
    from grl import preflight
    from grl.config import load_config, run_sections
    from grl.run_plan import RunPlan
    from grl.trainer.report import start_report

    def banner_of(cfg):
        return start_report(run_sections(cfg), replace(RunPlan.from_config(cfg), device="cpu"))

    base = ["preset=cpu", "model_path=tiny", f"trainer.run_dir={tmp_path}/run"]
    cpu_reports("AVX2")
    banner = banner_of(load_config(base))
    assert "  compute      auto: AVX2 CPU, float32 (bf16 would be emulated" in banner
    bf16 = load_config([*base, "actor_rollout_ref.model.dtype=bfloat16"])
    notes = preflight.check_dtype(bf16, RunPlan.from_config(bf16))
    assert len(notes) == 1 and notes[0].startswith(
        "actor_rollout_ref.model.dtype: bfloat16 on an AVX2 CPU without"
    )
    assert "emulated" in banner_of(bf16)
    assert preflight.check_dtype(load_config(base), RunPlan.from_config(load_config(base))) == []

    cpu_reports("AVX512", amx=True, avx512_bf16=True)
    assert (
        "  compute      auto: AVX512 CPU, bfloat16 (the CPU computes bf16 natively (AMX and AVX512-BF16))"
        in banner_of(load_config(base))
    )
    assert preflight.check_dtype(bf16, RunPlan.from_config(bf16)) == []


def test_fetch_model_gives_a_local_folder_or_names_the_model(monkeypatch):
    from grl.errors import first_line
    from grl.models import ModelLoadError, fetch_model, resolve_model_path

    assert (
        fetch_model("tiny") == resolve_model_path("tiny")
        and (Path(fetch_model("tiny")) / "config.json").exists()
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="cannot fetch model 'nobody-here/no-such-model'"):
        fetch_model("nobody-here/no-such-model")
    assert first_line(ValueError("\x1b[31m****\n  the reason  \nmore")) == "the reason"
    assert first_line(KeyError(), with_type=True) == "KeyError"
