"""GRL's own launch commands and tutorial knobs run unchanged: each exact override list
(as GRL's scripts hand it to Hydra) passes `grl-train --cfg` and means what it means in GRL."""

import os
import subprocess
import sys

import pytest
import yaml

from omegaconf import OmegaConf

from grl.config import notes as config_notes
from grl.config import ALIASES, NO_EFFECT, ConfigError, load_config

TASKS_13 = (
    "simpleSokobanAgent,largeSokobanAgent,gsm8kAgent_single_turn,gsm8kAgent_5_turn,blocksworldAgent_text,"
    "blocksworldAgent_1d,blocksworldAgent_2d_sparse,tetrisAgent_type_1_dim_4,tetrisAgent_type_2_dim_3,"
    "tetrisAgent_type_2_dim_4,webshopAgent,birdAgent,birdAgent_5_turns"
).split(",")


def quoted(names):
    return "[" + ",".join(f'"{n}"' for n in names) + "]"


# The argv that lmgame-org/GRL's scripts build with their default arguments (model_path -> tiny: no hub here).
VERL_QUICK = [
    "system.CUDA_VISIBLE_DEVICES=0",
    "rollout.agent_group_num=[8]",
    "rollout.agent_group_size=[16]",
    "rollout.validation_agent_group_num=[64,64,64,64,64]",
    "rollout.validation_agent_group_size=[1,1,1,1,1]",
    'rollout.training=["simpleSokobanAgent"]',
    'rollout.validation=["simpleSokobanAgent","largeSokobanAgent","gsm8kAgent_single_turn",'
    '"blocksworldAgent_2d_sparse","tetrisAgent_type_1_dim_4"]',
    "trainer.n_gpus_per_node=1",
    "trainer.project_name=lmgame_train",
    "trainer.experiment_name=quick_train_qwen_halfb_20250101_000000",
    "trainer.total_training_steps=200",
    "model_path=tiny",
]
SOKOBAN_7B = [
    "system.CUDA_VISIBLE_DEVICES='0,1,2,3'",
    "rollout.agent_group_num=[8]",
    "rollout.agent_group_size=[16]",
    "rollout.validation_agent_group_num=[" + ",".join(["256"] * 13) + "]",
    "rollout.validation_agent_group_size=[" + ",".join(["1"] * 13) + "]",
    'rollout.training=["simpleSokobanAgent"]',
    f"rollout.validation={quoted(TASKS_13)}",
    "gpu_memory_utilization=0.5",
    "trainer.n_gpus_per_node=4",
    "trainer.project_name=lmgame_train",
    "trainer.experiment_name=sokoban_qwen_7b_20250101_000000",
    "trainer.total_training_steps=200",
    "model_path=tiny",
]
TUTORIAL = [
    "rollout.show_tqdm=True",
    "rollout.num_prompt_threads=0",
    "rollout.num_env_threads=0",
    "rollout.num_init_threads=0",
]
GRL_BASE_KEYS = [
    "actor_rollout_ref.rollout.rollout_filter_ratio=0.25",
    "actor_rollout_ref.rollout.rollout_filter_type=std",
    "data.max_prompt_length=4096",
    "data.max_response_length=400",
    "trainer.validation_steps=1",
    "trainer.val_only=False",
    "actor_rollout_ref.model.lora_rank=0",
    "actor_rollout_ref.model.lora_alpha=16",
    "actor_rollout_ref.model.target_modules=all-linear",
]


@pytest.mark.parametrize(
    "overrides",
    [VERL_QUICK, SOKOBAN_7B, TUTORIAL, GRL_BASE_KEYS],
    ids=["verl_quick_training_example", "sokoban_qwen_7b", "tutorial", "grl_base_keys"],
)
def test_grl_override_lists_pass_grl_train_cfg(overrides):
    out = subprocess.run(
        [sys.executable, "-m", "grl.train", "--config-name", "base", "--cfg", *overrides],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load(out.stdout)["trainer"]["total_training_steps"] > 0


# What GRL reads each override as, where it is not the key itself: (the key read here, its value).
SPECIAL_MEANINGS = {
    "rollout.num_env_threads=0": ("rollout.env_workers", min(32, os.cpu_count() or 1)),  # 0: every core
    "rollout.num_init_threads=0": ("rollout.env_workers", min(32, os.cpu_count() or 1)),
    "model_path=tiny": ("actor_rollout_ref.model.path", "tiny"),
    "system.CUDA_VISIBLE_DEVICES='0,1,2,3'": ("system.CUDA_VISIBLE_DEVICES", "0,1,2,3"),
    "system.CUDA_VISIBLE_DEVICES=0": ("system.CUDA_VISIBLE_DEVICES", "0"),  # a device list, kept as text
}


@pytest.mark.parametrize(
    "overrides,override",
    [(group, o) for group in (VERL_QUICK, SOKOBAN_7B, TUTORIAL, GRL_BASE_KEYS) for o in group],
)
def test_each_grl_override_reaches_the_key_that_is_read(overrides, override):
    """Every override of GRL's scripts, given with the rest of its command line, lands where this
    trainer reads it (through an alias where it has a second spelling), or is named by preflight as
    having no effect."""
    key, _, text = override.partition("=")
    read_key, want = SPECIAL_MEANINGS.get(override, (ALIASES.get(key, key), yaml.safe_load(text)))
    cfg = load_config(overrides)
    got = OmegaConf.select(cfg, read_key)
    got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
    if key in NO_EFFECT:
        notes = config_notes(cfg)
        assert (want == NO_EFFECT[key][0]) != any(n.startswith(f"{key}:") and "no effect" in n for n in notes)
    else:
        assert got == want, (override, read_key, got)


def test_grl_script_keys_mean_the_same():
    cfg = load_config(SOKOBAN_7B)
    assert cfg.system.CUDA_VISIBLE_DEVICES == "0,1,2,3"
    assert list(cfg.rollout.validation) == TASKS_13
    assert cfg.trainer.n_gpus_per_node == 4
    assert cfg.trainer.default_local_dir == "checkpoints/lmgame_train/sokoban_qwen_7b_20250101_000000"
    assert cfg.trainer.run_dir == "outputs/lmgame_train/sokoban_qwen_7b_20250101_000000"


def test_different_experiment_names_get_different_folders():
    a = load_config(["trainer.experiment_name=run_a"]).trainer
    b = load_config(["trainer.experiment_name=run_b"]).trainer
    assert a.default_local_dir != b.default_local_dir and a.run_dir != b.run_dir
    assert load_config(["experiment_name=run_c"]).trainer.run_dir.endswith("/run_c")


def test_grl_second_spellings_replace_the_keys_that_are_read():
    cfg = load_config(
        [
            "data.max_prompt_length=300",
            "data.max_response_length=50",
            "actor_rollout_ref.rollout.rollout_filter_ratio=0.25",
            "actor_rollout_ref.rollout.rollout_filter_type=std_rev",
            "rollout.num_env_threads=3",
        ]
    )
    assert cfg.max_prompt_length == cfg.actor_rollout_ref.rollout.prompt_length == 300
    assert cfg.actor_rollout_ref.rollout.response_length == 50
    assert cfg.rollout.rollout_filter_ratio == 0.25 and cfg.rollout.rollout_filter_type == "std_rev"
    assert cfg.rollout.env_workers == 3
    assert load_config(["rollout.num_env_threads=0"]).rollout.env_workers >= 1


def test_resume_from_path_replaces_resume_mode(tmp_path):
    assert load_config([f"trainer.resume_from_path={tmp_path}"]).trainer.resume_mode == str(tmp_path)


@pytest.mark.parametrize("key", ["rollout.training", "rollout.validation"])
def test_a_task_named_twice_is_rejected(key):
    sizes = (
        "rollout.agent_group_num=[1,1]"
        if key == "rollout.training"
        else "rollout.validation_agent_group_num=[1,1]"
    )
    other = sizes.replace("group_num", "group_size")
    with pytest.raises(ConfigError, match=rf"^{key}: simpleSokobanAgent named twice"):
        load_config([f"{key}=[simpleSokobanAgent,simpleSokobanAgent]", sizes, other])


def test_train_batch_size_must_be_the_episodes_per_step():
    assert load_config(["train_batch_size=128"]).train_batch_size == 128  # 8 groups x 16 agents
    assert load_config(["data.train_batch_size=128"]).train_batch_size == 128
    with pytest.raises(ConfigError, match=r"^train_batch_size: 100 episodes per step.* gives 128"):
        load_config(["train_batch_size=100"])
