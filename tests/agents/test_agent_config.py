"""configs/agents.yaml: every block passes the config validator, and the named instances hold the
values the task list promises."""

import pytest

import grl.agents
import grl.envs
from grl.agents import make_agent
from grl.config import ConfigError, load_config, run_sections, task_instance
from grl.schema import PROGRAM, AgentConfig

from agent_text import GSM8K_TEST

OURS = [
    "simpleSokobanAgent",
    "largeSokobanAgent",
    "tetrisAgent_type_1_dim_4",
    "tetrisAgent_type_2_dim_3",
    "tetrisAgent_type_2_dim_4",
    "blocksworldAgent_text",
    "blocksworldAgent_1d",
    "blocksworldAgent_2d_sparse",
    "gsm8kAgent_single_turn",
    "gsm8kAgent_5_turn",
]
MATH = [
    f"{name}Agent_{turns}"
    for name in ("aime24", "aime25", "amc23", "math500", "minervamath")
    for turns in ("single_turn", "5_turn")
]


def every_task_overrides(names):
    listed = ",".join(names)
    ones = ",".join("1" for _ in names)
    return [
        f"rollout.training=[{listed}]",
        f"rollout.validation=[{listed}]",
        f"rollout.agent_group_num=[{ones}]",
        f"rollout.agent_group_size=[{ones}]",
        f"rollout.validation_agent_group_num=[{ones}]",
        f"rollout.validation_agent_group_size=[{ones}]",
    ]


@pytest.fixture(scope="module")
def validated(agents_yaml):
    """The composed config with every task instance in the rollout lists, so every env key is checked."""
    usable = [
        name
        for name, block in agents_yaml.items()
        if block["agent_type"] == PROGRAM  # a program has no env to be missing
        or grl.envs.available().get(grl.agents.env_name(block["agent_type"])) is None
    ]
    return load_config(every_task_overrides(usable)), usable


def test_every_env_imports():
    """Every env's dependency is part of the environment env_setup.sh builds (TextWorld, GEM, OpenEnv,
    ...): a missing one fails here, with the env's own reason, instead of leaving its tasks untested."""
    assert {name: why for name, why in grl.envs.available().items() if why is not None} == {}


def test_every_block_validates(validated, agents_yaml):
    cfg, usable = validated
    assert set(OURS + MATH) <= set(usable)
    for name in usable:
        block = task_instance(cfg, name)
        assert set(block["agent_config"]) == {f.name for f in AgentConfig.__dataclass_fields__.values()}


def test_a_runs_tasks_are_typed_as_a_block_given_by_hand_is(validated):
    """grl.config types a run's task blocks once (RunSections.tasks); grl.agents.task_from_block, the path of
    a block given by hand that checks it itself, makes the same Task of every block."""
    cfg, usable = validated
    tasks = run_sections(cfg).tasks
    assert set(tasks) == set(usable)
    for name in usable:
        assert repr(tasks[name]) == repr(grl.agents.task_from_block(name, task_instance(cfg, name))), name


def test_promised_values(validated):
    cfg, _ = validated

    def get(name):
        block = task_instance(cfg, name)
        return block["agent_config"], block["env_config"]

    agent, env = get("simpleSokobanAgent")
    assert env["dim_room"] == [6, 6] and env["num_boxes"] == 1
    assert (agent["max_turns"], agent["max_actions_per_turn"], agent["max_actions_all_turns"]) == (6, 5, 10)
    assert get("largeSokobanAgent")[1]["dim_room"] == [8, 8]
    for name, box_type, dim in (
        ("tetrisAgent_type_1_dim_4", 1, 4),
        ("tetrisAgent_type_2_dim_3", 2, 3),
        ("tetrisAgent_type_2_dim_4", 2, 4),
    ):
        agent, env = get(name)
        assert (env["box_type"], env["dim_x"], env["dim_y"]) == (box_type, dim, dim)
        assert (agent["max_turns"], agent["max_actions_per_turn"], agent["max_actions_all_turns"]) == (
            11,
            5,
            40,
        )
    for mode in ("text", "1d", "2d_sparse"):
        agent, env = get(f"blocksworldAgent_{mode}")
        assert env["render_mode"] == mode and env["num_blocks"] == 3
        assert (agent["max_turns"], agent["max_actions_per_turn"], agent["max_actions_all_turns"]) == (
            11,
            5,
            20,
        )
    assert (
        get("gsm8kAgent_single_turn")[0]["max_turns"] == 1 and get("gsm8kAgent_5_turn")[0]["max_turns"] == 5
    )
    assert get("gsm8kAgent_single_turn")[1]["data_path"].endswith("/gsm8k/{split}.jsonl")
    for name in MATH:
        agent, env = get(name)
        turns = 1 if name.endswith("single_turn") else 5
        assert (agent["max_turns"], agent["max_actions_all_turns"], env["max_attempts"]) == (
            turns,
            turns,
            turns,
        )
        assert (
            env["data_path"].endswith(f"/math/{name.split('Agent')[0]}/{{split}}.jsonl")
            and env["split"] == "test"
        )


def test_math_blocks_build_agents_on_a_fixture_file(validated, tmp_path):
    cfg, _ = validated
    path = tmp_path / "test.jsonl"
    path.write_text('{"problem": "Compute $2+2$.", "answer": "4"}\n', encoding="utf-8")
    for name in MATH:
        block = task_instance(cfg, name)
        block["env_config"]["data_path"] = str(path)
        agent = make_agent(name, block)
        assert "Compute $2+2$." in agent.reset(0)[1]["content"]
        result = agent.step("<think>2+2</think><answer>4</answer>")
        assert (result.reward, result.done, result.info["success"]) == (10.0, True, True)
        agent.close()


@pytest.mark.shared_data("gsm8k/test.jsonl")
def test_our_blocks_build_agents(validated):
    cfg, _ = validated
    for name in OURS:
        block = task_instance(cfg, name)
        if block["agent_type"] == "gsm8kAgent":
            block["env_config"]["data_path"] = str(GSM8K_TEST)
        agent = make_agent(name, block)
        messages = agent.reset(0)
        assert messages[0]["role"] == "system" and "Turn 1. State:" in messages[1]["content"]
        agent.close()


def test_a_misspelt_env_key_is_caught_by_the_validator():
    with pytest.raises(
        ConfigError, match=r"simpleSokobanAgent.env_config.dim_rom: unknown key for env sokoban"
    ):
        load_config(["+simpleSokobanAgent.env_config.dim_rom=[5,5]"])


@pytest.mark.parametrize(
    "override, change",
    [
        ("+simpleSokobanAgent.env_config.dim_rom=[5,5]", {"env_config": {"dim_rom": [5, 5]}}),
        ("simpleSokobanAgent.agent_type=sokoAgent", {"agent_type": "sokoAgent"}),
        (f"simpleSokobanAgent.agent_type={PROGRAM}", {"agent_type": PROGRAM}),
    ],
)
def test_a_run_s_config_and_a_block_given_by_hand_are_refused_in_one_text(override, change):
    """One task check serves the config and make_agent's blocks (grl.agents.check_task)."""
    with pytest.raises(ConfigError) as from_config:
        load_config([override])
    block = task_instance(load_config([]), "simpleSokobanAgent")
    for part, value in change.items():
        block[part] = {**block[part], **value} if isinstance(value, dict) else value
    with pytest.raises(ValueError) as by_hand:
        grl.agents.task_from_block("simpleSokobanAgent", block)
    assert str(from_config.value) == str(by_hand.value)


def test_textworld_blocks_take_one_command_per_turn(validated):
    cfg, _ = validated
    budgets = []
    for level in ("easy", "medium", "hard"):
        block = task_instance(cfg, f"textworldAgent_{level}")
        agent, env = block["agent_config"], block["env_config"]
        assert (
            env["level"] == level and agent["max_actions_per_turn"] == 1 and agent["action_separator"] is None
        )
        budgets.append(agent["max_turns"])
    assert budgets == sorted(budgets)


def test_left_out_agent_config_keys_take_grls_defaults():
    cfg = load_config(
        [
            "+bareSokoban.agent_type=sokobanAgent",
            "+bareSokoban.agent_config.max_turns=3",
            "rollout.training=[bareSokoban]",
            "rollout.validation=[bareSokoban]",
        ]
    )
    block = task_instance(cfg, "bareSokoban")
    assert block["agent_config"]["max_turns"] == 3
    assert block["agent_config"]["max_tokens"] == 100 and block["agent_config"]["action_separator"] == "||"
    agent = make_agent("bareSokoban", block)
    assert agent.settings.format_penalty == -0.1 and agent.settings.enable_think is True
