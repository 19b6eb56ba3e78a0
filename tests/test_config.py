"""The config is composed, typed and checked before anything starts."""

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grl.config import ConfigError, load_config


def test_default_config_is_valid():
    cfg = load_config()
    assert cfg.actor_rollout_ref.model.path == cfg.model_path
    assert cfg.trainer.project_name == cfg.project_name
    assert list(cfg.rollout.training) == ["simpleSokobanAgent"]
    assert cfg.simpleSokobanAgent.agent_config.max_turns == 6


def test_shorthands_flow_into_nested_keys():
    cfg = load_config(["model_path=tiny", "micro_batch_size_per_gpu=3", "max_response_length=77"])
    assert cfg.actor_rollout_ref.model.path == "tiny"
    assert cfg.critic.model.path == "tiny"
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu == 3
    assert cfg.actor_rollout_ref.rollout.response_length == 77


@pytest.mark.parametrize(
    "override, key",
    [
        ("rollout.agent_group_nmu=[2]", "rollout.agent_group_nmu"),
        ("algorithm.gamma=high", "algorithm.gamma"),
        ("rollout.validation_agent_group_num=[1,2]", "rollout.validation_agent_group_num"),
        ("rollout.agent_group_size=[4,4]", "rollout.agent_group_size"),
        ("rollout.training=[noSuchAgent]", "rollout.training"),
        ("rollout.truncation=middle", "rollout.truncation"),
        ("algorithm.adv_estimator=ppo2", "algorithm.adv_estimator"),
        ("trainer.logger=[console,mlflow]", "trainer.logger"),
        ("+simpleSokobanAgent.env_config.not_a_key=1", "simpleSokobanAgent.env_config.not_a_key"),
        ("simpleSokobanAgent.agent_config.max_turns=many", "simpleSokobanAgent.agent_config.max_turns"),
        ("+nonsense=1", "nonsense"),
        ("rollout.rollout_filter_ratio=1.5", "rollout.rollout_filter_ratio"),
        ("trainer.resume_mode=/no/such/checkpoint", "trainer.resume_mode"),
    ],
)
def test_mistakes_name_the_key_in_one_line(override, key):
    with pytest.raises(ConfigError) as info:
        load_config([override])
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(key + ":"), message


def test_rollouts_ahead_need_a_correction_and_without_the_old_pass_no_importance_weight_is_left():
    ahead = ["actor_rollout_ref.hybrid_engine=false", "rollout.max_staleness=1"]
    with pytest.raises(
        ConfigError, match=r"^rollout.max_staleness=1: .*tis_imp_ratio_cap .*recompute_old_log_probs"
    ):
        load_config(ahead)
    load_config([*ahead, "actor_rollout_ref.actor.tis_imp_ratio_cap=2"])
    load_config([*ahead, "actor_rollout_ref.actor.recompute_old_log_probs=false"])
    with pytest.raises(ConfigError, match=r"^actor_rollout_ref.actor.tis_imp_ratio_cap: .* is 1 when"):
        load_config(
            [
                "actor_rollout_ref.actor.recompute_old_log_probs=false",
                "actor_rollout_ref.actor.tis_imp_ratio_cap=2",
            ]
        )


def test_typo_suggests_the_known_key():
    with pytest.raises(ConfigError, match=r"did you mean rollout\.agent_group_num"):
        load_config(["rollout.agent_group_nmu=[2]"])


def test_cli_config_error_exits_fast_with_one_line():
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "grl.train", "rollout.agent_group_nmu=[2]"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.monotonic() - start
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "rollout.agent_group_nmu" in lines[0], result.stderr
    assert elapsed < 15
    # the check happens before any heavy import
    assert "torch" not in result.stdout


def test_cli_help():
    result = subprocess.run(
        [sys.executable, "-m", "grl.train", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert "rollout.agent_group_num" in result.stdout


def test_light_imports_stay_light():
    code = (
        "import sys, grl, grl.envs, grl.agents, grl.config; "
        "heavy = [m for m in ('torch', 'ray', 'vllm') if m in sys.modules]; print(heavy)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_an_agent_config_key_the_task_block_leaves_out_is_added_with_plus():
    with pytest.raises(ConfigError, match=r"does not list max_context_window .*\+tetrisAgent_gap_dim_4"):
        load_config(["tetrisAgent_gap_dim_4.agent_config.max_context_window=0"])
    cfg = load_config(["+tetrisAgent_gap_dim_4.agent_config.max_context_window=0"])
    assert cfg.tetrisAgent_gap_dim_4.agent_config.max_context_window == 0
    with pytest.raises(ConfigError, match="tetrisAgent_gap_dim_4.agent_config.max_context_window"):
        load_config(["+tetrisAgent_gap_dim_4.agent_config.max_context_window=-3"])


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["+prog.agent_type=program"], "prog: a task played by an agent program has agent_type: program"),
        (
            ["+prog.agent_type=tetris", "+prog.agent_config.program=tests.gateway.programs:one_call"],
            "prog: a task played by an agent program has agent_type: program",
        ),
    ],
)
def test_a_program_task_names_its_program(overrides, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(overrides)
    good = [
        "+prog.agent_type=program",
        "+prog.agent_config.program=tests.gateway.programs:one_call",
        "rollout.training=[prog]",
        "+prog.env_config.anything=1",
    ]
    assert load_config(good).prog.agent_config.program == "tests.gateway.programs:one_call"


PRESETS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "configs" / "preset").glob("*.yaml"))


@pytest.mark.parametrize(
    "override, says",
    [
        (
            "rollout.training=simpleSokobanAgent",
            "rollout.training: takes a list, not the single value 'simpleSokobanAgent'; use "
            "[simpleSokobanAgent]",
        ),
        (
            "trainer.logger=console",
            "trainer.logger: takes a list, not the single value 'console'; use [console]",
        ),
        (
            "rollout.agent_group_num=8",
            "rollout.agent_group_num: takes a list, not the single value 8; use [8]",
        ),
        (
            "+simpleSokobanAgent.agent_config.tools=python",
            "simpleSokobanAgent.agent_config.tools: takes a list, not the single value 'python'; use "
            "[python]",
        ),
        (
            "preset=cpuu",
            f"preset: no preset named 'cpuu' (did you mean cpu?); the presets are {', '.join(PRESETS)}",
        ),
        (
            "hydra.run.dir=/tmp/elsewhere",
            "hydra.run.dir: GRL composes its config with Hydra but runs no Hydra job",
        ),
        (
            "hydra/job_logging=disabled",
            "hydra/job_logging: GRL composes its config with Hydra but runs no Hydra job",
        ),
        (
            "rollout.training=simpleSokobanAgent,largeSokobanAgent",
            "rollout.training: 'simpleSokobanAgent,largeSokobanAgent' is a Hydra sweep",
        ),
    ],
)
def test_hydra_shaped_mistakes_get_one_line_naming_the_fix(override, says):
    with pytest.raises(ConfigError) as info:
        load_config([override])
    message = str(info.value)
    assert "\n" not in message and message.startswith(says), message


def test_a_hydra_sweep_names_the_list_it_may_have_meant():
    with pytest.raises(
        ConfigError, match=re.escape("rollout.training=[simpleSokobanAgent,largeSokobanAgent]")
    ):
        load_config(["rollout.training=simpleSokobanAgent,largeSokobanAgent"])
    with pytest.raises(
        ConfigError,
        match=r"^algorithm.gamma: 'range\(1,3\)' is a Hydra sweep.*; run each value as its own command$",
    ):
        load_config(["algorithm.gamma=range(1,3)"])


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--cfg", "hydra"], "grl-train: --cfg hydra: GRL runs no Hydra job"),
        (["--cfg=all"], "grl-train: --cfg all: GRL runs no Hydra job"),
        (
            ["-m", "actor_rollout_ref.actor.optim.lr=1e-6,3e-6"],
            "grl-train: -m/--multirun: GRL runs one config per command",
        ),
        (["--multirun"], "grl-train: -m/--multirun: GRL runs one config per command"),
    ],
)
def test_hydra_flags_grl_does_not_offer_say_what_it_offers_in_one_line(flags, says, capsys):
    from grl import train

    assert train.main(flags) == 2
    out = capsys.readouterr()
    assert out.out == "" and len(out.err.strip().splitlines()) == 1 and out.err.startswith(says), out.err


def test_cfg_job_prints_what_cfg_prints_wherever_the_flag_stands(capsys):
    import yaml

    from grl import train

    printed = []
    for flags in (["--cfg", "preset=cpu"], ["preset=cpu", "--cfg", "job"], ["-c", "job", "preset=cpu"]):
        assert train.main(flags) == 0, capsys.readouterr().err
        printed.append(capsys.readouterr().out)
    assert printed[1:] == printed[:1] * 2
    preset = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "configs" / "preset" / "cpu.yaml").read_text()
    )
    assert yaml.safe_load(printed[0])["trainer"]["experiment_name"] == preset["experiment_name"]
