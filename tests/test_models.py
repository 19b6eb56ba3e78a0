"""Model resolution: embedded GGUF conversion, the tiny model, clear errors."""

import subprocess
import sys

import pytest
import torch

from grl import models


def test_embedded_converts_once_and_generates_text():
    path = models.resolve_model_path("embedded")
    tokenizer = models.load_tokenizer("embedded")
    model = models.load_causal_lm("embedded")
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576  # SmolLM2-135M
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    reply = tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
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


def test_concurrent_conversions_leave_one_complete_folder(tmp_path):
    script = ("import sys; from grl import models; p = models.tiny_model_path(); "
              "from transformers import AutoModelForCausalLM; AutoModelForCausalLM.from_pretrained(p); print(p)")
    env = {**__import__("os").environ, "GRL_CACHE_DIR": str(tmp_path)}
    # Both processes reuse the shared embedded tokenizer by pointing the embedded entry at the real cache.
    (tmp_path / "smollm2-135m-instruct").symlink_to(models.embedded_model_path())
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outputs]
    entries = sorted(x.name for x in tmp_path.iterdir())
    assert entries == ["smollm2-135m-instruct", "tiny-llama-2x64-h32"], entries  # no temp folders left behind
