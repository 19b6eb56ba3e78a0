"""Engine choice and config mapping: no model involved."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from grl import engines
from grl.engines import (
    SamplingParams,
    make_engine,
    pick_engine_name,
    sampling_from_config,
)

REPO = Path(__file__).resolve().parents[2]


def test_import_is_cheap():
    code = "import sys, grl.engines; print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_explicit_names_pass_through_and_are_logged(caplog):
    with caplog.at_level(logging.INFO, logger="grl.engines"):
        assert pick_engine_name("hf") == "hf"
        assert pick_engine_name("vllm") == "vllm"
    assert "rollout engine: hf" in caplog.text and "rollout engine: vllm" in caplog.text


def test_unknown_name_names_the_key():
    with pytest.raises(ValueError, match=r"actor_rollout_ref\.rollout\.name: unknown engine 'sglang'"):
        pick_engine_name("sglang")
    with pytest.raises(ValueError, match="unknown engine"):
        make_engine("sglang", "tiny")


def test_auto_follows_the_vllm_probe(caplog):
    engines.vllm_status.cache_clear()
    usable, why = engines.vllm_status()
    with caplog.at_level(logging.INFO, logger="grl.engines"):
        assert pick_engine_name("auto") == ("vllm" if usable else "hf")
    assert f"(auto: {why})" in caplog.text


def test_auto_falls_back_to_hf_without_vllm(monkeypatch, caplog):
    real_find_spec = engines.importlib.util.find_spec
    monkeypatch.setattr(engines.importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real_find_spec(name, *a))
    engines.vllm_status.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="grl.engines"):
            assert pick_engine_name("auto") == "hf"
    finally:
        engines.vllm_status.cache_clear()
    assert "vllm is not installed" in caplog.text


def rollout_block():
    cfg = OmegaConf.load(REPO / "configs" / "ppo_trainer.yaml")
    return cfg.actor_rollout_ref.rollout


def test_sampling_from_the_shipped_config():
    train = sampling_from_config(rollout_block(), validate=False, max_new_tokens=100)
    assert train == SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=100)
    assert not train.is_greedy
    val = sampling_from_config(rollout_block(), validate=True, max_new_tokens=50)
    assert val.is_greedy and val.greedy and val.max_new_tokens == 50


def test_sampling_training_and_validation_overrides():
    cfg = {"temperature": 0.7, "top_p": 0.9, "top_k": 20,
           "val_kwargs": {"do_sample": True, "temperature": 0.5, "top_p": 0.8, "top_k": 5}}
    train = sampling_from_config(cfg, validate=False, max_new_tokens=8)
    assert (train.temperature, train.top_p, train.top_k, train.greedy) == (0.7, 0.9, 20, False)
    val = sampling_from_config(cfg, validate=True, max_new_tokens=8)
    assert (val.temperature, val.top_p, val.top_k, val.greedy) == (0.5, 0.8, 5, False)
    assert sampling_from_config({"temperature": 0}, validate=False, max_new_tokens=8).greedy
    assert sampling_from_config({}, validate=True, max_new_tokens=8).greedy  # no val_kwargs: greedy


@pytest.mark.parametrize("cfg, validate, message", [
    ({"temperature": -1}, False, r"actor_rollout_ref\.rollout\.temperature: must be >= 0"),
    ({"top_p": 0}, False, r"actor_rollout_ref\.rollout\.top_p: must be in \(0, 1\]"),
    ({"top_k": -5}, False, r"actor_rollout_ref\.rollout\.top_k"),
    ({"top_k": 2.5}, False, r"top_k: expected an integer"),
    ({"temperature": "hot"}, False, r"temperature: expected a number"),
    ({"val_kwargs": {"do_sample": True, "top_p": 1.5}}, True, r"rollout\.val_kwargs\.top_p"),
])
def test_bad_sampling_values_name_the_key(cfg, validate, message):
    with pytest.raises((ValueError, TypeError), match=message):
        sampling_from_config(cfg, validate=validate, max_new_tokens=8)


@pytest.mark.parametrize("overrides, constrained", [
    ([], False),
    (["simpleSokobanAgent.agent_config.action_decoding=constrained"], True),  # a training and validation task
    (["rollout.training=[tetrisAgent_type_1_dim_4]", "rollout.validation=[simpleSokobanAgent]",
      "simpleSokobanAgent.agent_config.action_decoding=constrained"], True),  # validation only
    (["rollout.training=[tetrisAgent_type_1_dim_4]", "rollout.validation=[tetrisAgent_type_1_dim_4]",
      "simpleSokobanAgent.agent_config.action_decoding=constrained"], False),  # a constrained task the run skips
])
def test_the_engine_takes_grammars_when_a_task_of_the_run_decodes_constrained(overrides, constrained):
    from grl.config import load_config
    from grl.rollout import decodes_constrained

    assert decodes_constrained(load_config(overrides)) is constrained
