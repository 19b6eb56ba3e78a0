"""The generic Agent on the real Sokoban env: messages, budgets, penalties, metrics, errors."""

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import grl.agents
import grl.envs
from grl.agents import make_agent
from grl.envs.base import Env, step_info

from agent_text import ROOT, state_of

METRIC_KEYS = {"success", "num_actions", "action_is_valid", "action_is_effective", "format_ok"}


def replay(seed, actions, **env_config):
    """Reference: the env driven directly, without the agent."""
    env = grl.envs.make("sokoban", **env_config)
    env.reset(seed)
    return [env.step(a) for a in actions]


def test_registry():
    assert {
        "sokobanAgent",
        "tetrisAgent",
        "blocksworldAgent",
        "gsm8kAgent",
        "webshopAgent",
        "birdAgent",
    } <= set(grl.agents.agent_types())
    assert [grl.agents.env_name(t) for t in ("sokobanAgent", "gsm8kAgent", "webshopAgent", "birdAgent")] == [
        "sokoban",
        "gsm8k",
        "webshop",
        "bird",
    ]
    assert all(grl.agents.env_name(t) in grl.envs.names() for t in grl.agents.agent_types())
    with pytest.raises(KeyError, match="nopeAgent"):
        grl.agents.env_name("nopeAgent")


def test_import_is_light():
    code = (
        "import sys, grl.agents; print(sorted(m for m in ('torch','ray','vllm','datasets') if m in "
        "sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_first_messages(task):
    agent = make_agent("simpleSokobanAgent", task("simpleSokobanAgent"))
    messages = agent.reset(7)
    cfg = task("simpleSokobanAgent")["agent_config"]
    assert [m["role"] for m in messages] == ["system", "user"] and messages == agent.messages
    assert messages[0]["content"] == cfg["system_prompt"]
    user = messages[1]["content"]
    for part in (
        cfg["prompt"].strip(),
        agent.env.legend(),
        agent.env.action_help(),
        "<think>your reasoning</think><answer>your answer</answer>",
        "at most 5 per answer",
        "You have 10 actions left",
    ):
        assert part in user
    assert state_of(user) == grl.envs.make("sokoban", dim_room=[6, 6]).reset(7)
    assert (agent.max_turns, agent.max_tokens, agent.format_penalty) == (6, 100, -0.1)


def test_step_runs_actions_and_matches_the_env(task):
    agent = make_agent("simpleSokobanAgent", task("simpleSokobanAgent"))
    agent.reset(3)
    reply = "<think>go around</think><answer>Up || Up || Right || Right || Down || Left || Left</answer>"
    result = agent.step(reply)
    reference = replay(3, ["Up", "Up", "Right", "Right", "Down"], dim_room=[6, 6])
    assert result.info["actions"] == ["Up", "Up", "Right", "Right", "Down"]
    assert result.info["actions_dropped"] == 2 and result.info["format_ok"] and not result.done
    assert result.reward == pytest.approx(sum(r for _, r, _, _ in reference))
    assert agent.messages[-2] == {"role": "assistant", "content": reply}
    follow_up = agent.messages[-1]["content"]
    assert agent.messages[-1]["role"] == "user" and follow_up.startswith(f"Reward: {result.reward:g}")
    assert state_of(follow_up) == reference[-1][0]
    assert (
        "Turn 2." in follow_up
        and "You have 5 actions left" in follow_up
        and "2 actions over the limit" in follow_up
    )


def test_action_budget_ends_the_episode(task):
    agent = make_agent("simpleSokobanAgent", task("simpleSokobanAgent", agent={"max_actions_all_turns": 7}))
    agent.reset(0)
    first = agent.step("<think>.</think><answer>Left || Right || Left || Right</answer>")
    assert not first.done and "use at most 3 in this answer" in agent.messages[-1]["content"]
    second = agent.step("<think>.</think><answer>Left || Right || Left || Right</answer>")
    assert second.done and second.info["actions"] == ["Left", "Right", "Left"]
    assert agent.episode_metrics()["num_actions"] == 7
    assert agent.messages[-1]["role"] == "assistant"  # no user message after the end


def test_max_turns_and_format_penalty(task):
    agent = make_agent("simpleSokobanAgent", task("simpleSokobanAgent"))
    agent.reset(0)
    results = [agent.step("Up Up Up") for _ in range(6)]
    assert [r.done for r in results] == [False] * 5 + [True]
    assert all(r.reward == -0.1 and r.info["actions"] == [] and not r.info["format_ok"] for r in results)
    assert "Format error: no <think>" in agent.messages[2 * 1 + 1]["content"]
    metrics = agent.episode_metrics()
    assert metrics["format_ok"] == 0.0 and metrics["num_actions"] == 0.0 and metrics["success"] == 0.0
    after = agent.step("<think>x</think><answer>Up</answer>")
    assert (after.reward, after.done, after.info["actions"]) == (0.0, True, [])
    assert set(after.info) == set(results[-1].info)
    assert len(agent.messages) == 2 + 6 * 2 - 1


def test_think_required_only_when_enabled(task):
    strict = make_agent("simpleSokobanAgent", task("simpleSokobanAgent"))
    loose = make_agent("simpleSokobanAgent", task("simpleSokobanAgent", agent={"enable_think": False}))
    strict.reset(5)
    loose.reset(5)
    assert strict.step("<answer>Up</answer>").info["actions"] == []
    result = loose.step("I will go up. <answer>Up</answer>")
    assert result.info["actions"] == ["Up"] and result.info["format_ok"]
    assert "End your reply with <answer>your answer</answer>" in loose.messages[1]["content"]


def test_invalid_action_is_penalised_and_counted(task):
    agent = make_agent("simpleSokobanAgent", task("simpleSokobanAgent"))
    agent.reset(2)
    result = agent.step("<think>.</think><answer>up || Jump || LEFT</answer>")
    env_rewards = sum(r for _, r, _, _ in replay(2, ["up", "Jump", "LEFT"], dim_room=[6, 6]))
    assert result.info["actions"] == ["up", "Jump", "LEFT"] and result.info["invalid_actions"] == ["Jump"]
    assert result.info["format_ok"] and result.info["penalised"]
    assert result.reward == pytest.approx(env_rewards - 0.1)
    assert "Invalid action: 'Jump'" in agent.messages[-1]["content"]
    metrics = agent.episode_metrics()
    assert metrics["action_is_valid"] == pytest.approx(2 / 3) and metrics["num_actions"] == 3
    assert METRIC_KEYS <= set(metrics) and all(isinstance(v, float) for v in metrics.values())


def test_same_seed_same_episode(task):
    replies = [
        "<think>a</think><answer>Up || Left</answer>",
        "junk",
        "<think>b</think><answer>Down || Right</answer>",
    ]

    def run(seed):
        agent = make_agent("simpleSokobanAgent", task("simpleSokobanAgent"))
        agent.reset(seed)
        rewards = [agent.step(r).reward for r in replies]
        return agent.messages, rewards, agent.episode_metrics()

    assert run(11) == run(11)
    assert len({run(seed)[0][1]["content"] for seed in range(4)}) > 1


def test_reset_starts_afresh(task):
    agent = make_agent("simpleSokobanAgent", task("simpleSokobanAgent"))
    first = agent.reset(4)
    agent.step("<think>.</think><answer>Up || Down</answer>")
    assert agent.reset(4) == first and agent.episode_metrics()["num_actions"] == 0


class BrokenEnv(Env):
    """A real env that fails at its `fail_at`-th step, by raising or by returning garbage."""

    def __init__(self, fail_at: int = 2, garbage: bool = False):
        self.fail_at, self.garbage = fail_at, garbage

    def reset(self, seed):
        self.steps = 0
        return "state 0"

    def step(self, action):
        self.steps += 1
        if self.steps >= self.fail_at:
            if self.garbage:
                return "state ?", 0.0, False, None
            raise RuntimeError("disk on fire")
        return f"state {self.steps}", 1.0, False, step_info(False, True, True)


def test_env_error_ends_the_episode_without_raising(task, monkeypatch):
    monkeypatch.setattr(grl.envs, "_REGISTRY", dict(grl.envs._REGISTRY))
    broken = grl.agents.AgentType("broken_test_env", grl.agents.TaskHooks())
    monkeypatch.setitem(grl.agents.AGENT_TYPES, "brokenAgent", broken)
    grl.envs.register("broken_test_env", BrokenEnv)
    block = task("simpleSokobanAgent")
    block["agent_type"], block["env_config"] = "brokenAgent", {"fail_at": 2}
    agent = make_agent("broken", block)
    agent.reset(0)
    result = agent.step("<think>.</think><answer>a || b || c</answer>")
    assert result.done and result.info["env_error"] == "RuntimeError: disk on fire"
    assert result.info["actions"] == ["a"] and result.reward == 1.0
    block["env_config"] = {"fail_at": 1, "garbage": True}
    agent = make_agent("broken", block)
    agent.reset(0)
    result = agent.step("<think>.</think><answer>a</answer>")
    assert result.done and result.info["env_error_kind"] == "info" and result.info["actions"] == []
    assert result.info["env_error"] == "step() returned an `info` that is not a dict: NoneType None"


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"agent_config": {"max_turns": 0}},
            r"simpleSokobanAgent.agent_config.max_turns: must be an integer >= 1",
        ),
        (
            {"agent_config": {"max_turn": 3}},
            r"simpleSokobanAgent.agent_config.max_turn: unknown key \(did you mean",
        ),
        ({"agent_config": {"enable_think": "maybe"}}, r"simpleSokobanAgent.agent_config.enable_think"),
        (
            {"env_config": {"dim_rooms": [5, 5]}},
            r"simpleSokobanAgent.env_config.dim_rooms: unknown key for env sokoban",
        ),
        ({"agent_type": "sokoAgent"}, r"simpleSokobanAgent.agent_type: unknown agent_type 'sokoAgent'"),
        (
            {"agent_type": "program"},
            r"simpleSokobanAgent: a task played by an agent program has agent_type: program",
        ),
    ],
)
def test_bad_task_blocks_name_the_key(task, change, message):
    block = task("simpleSokobanAgent", agent=change.get("agent_config"), env=change.get("env_config"))
    if "agent_type" in change:
        block["agent_type"] = change["agent_type"]
    with pytest.raises(ValueError, match=message):
        make_agent("simpleSokobanAgent", block)


def test_missing_agent_key_takes_grls_default(task):
    block = task("simpleSokobanAgent")
    del block["agent_config"]["format_penalty"]
    assert make_agent("simpleSokobanAgent", block).settings.format_penalty == -0.1


def test_accepts_omegaconf_blocks(task):
    from omegaconf import OmegaConf

    agent = make_agent("simpleSokobanAgent", OmegaConf.create(task("simpleSokobanAgent")))
    plain = make_agent("simpleSokobanAgent", task("simpleSokobanAgent"))
    assert agent.reset(1) == plain.reset(1)


replies = st.one_of(
    st.text(max_size=200),
    st.lists(
        st.sampled_from(
            [
                "<think>",
                "</think>",
                "<answer>",
                "</answer>",
                "||",
                "Up",
                "left",
                " ",
                "Jump",
                "\n",
                "DOWN",
                "Right",
            ]
        ),
        max_size=20,
    ).map("".join),
    st.none(),
    st.integers(),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(replies, min_size=1, max_size=8), st.integers(0, 3))
def test_agent_never_raises_on_any_reply(task, reply_list, seed):
    agent = make_agent("simpleSokobanAgent", task("simpleSokobanAgent"))
    agent.reset(seed)
    for reply in reply_list:
        result = agent.step(reply)
        assert isinstance(result.reward, float) and isinstance(result.done, bool)
    metrics = agent.episode_metrics()
    assert 0.0 <= metrics["format_ok"] <= 1.0 and metrics["num_actions"] <= 10


def test_sql_and_gsm8k_answers_are_never_split():
    for agent_type in ("birdAgent", "gsm8kAgent"):
        hooks = grl.agents.AGENT_TYPES[agent_type].hooks
        assert hooks.actions(" SELECT a || b FROM t ", "||") == ["SELECT a || b FROM t"]
    assert grl.agents.AGENT_TYPES["sokobanAgent"].hooks.actions("Up || Down", "||") == ["Up", "Down"]


def test_context_window_keeps_the_instructions_and_the_last_turns(task):
    block = task("simpleSokobanAgent")
    full = make_agent("simpleSokobanAgent", block)
    full.reset(5)
    for reply in ("<think>x</think><answer>Up</answer>", "<think>y</think><answer>Left</answer>"):
        full.step(reply)
    instructions, chat = full.instructions(), full.messages
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert full.context_messages() == chat  # -1 (GRL's default): the whole episode
    for window, replies_kept in ((0, 0), (1, 1), (2, 2), (5, 2)):
        block["agent_config"]["max_context_window"] = window
        agent = make_agent("simpleSokobanAgent", block)
        agent.reset(5)
        for reply in ("<think>x</think><answer>Up</answer>", "<think>y</think><answer>Left</answer>"):
            agent.step(reply)
        shown = agent.context_messages()
        assert agent.messages == chat  # the window is a view: the chat itself stays whole
        assert shown[0] == chat[0] and shown[-1]["content"].endswith(chat[-1]["content"])
        assert sum(m["role"] == "assistant" for m in shown) == replies_kept
        assert shown[1]["role"] == "user" and shown[1]["content"].startswith(instructions)
        assert shown[1]["content"].count(agent.env.legend()) == 1  # said once, whatever is cut
        if window == 0:
            assert [m["role"] for m in shown] == ["system", "user"]
            assert "Turn 3. State" in shown[1]["content"] and "Turn 2. State" not in shown[1]["content"]


def test_context_window_before_tool_output_gives_the_instructions_a_message():
    from grl.agents.turns import context_window

    chat = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "I\n\nstate 1"},
        {"role": "assistant", "content": "call"},
        {"role": "tool", "content": "out"},
    ]
    assert context_window(chat, "I", 0) == [chat[0], {"role": "user", "content": "I"}, chat[3]]
    assert context_window(chat, "I", 1) == chat
    with pytest.raises(ValueError, match="t.agent_config.max_context_window"):
        grl.agents.settings_from_mapping({"max_context_window": -2}, "t.agent_config")


def test_brief_turns_say_only_what_changed(task):
    """The one-gap Tetris of the CPU preset pays only at its end and takes one constrained move a turn; with
    brief_turns (its block sets it) a later turn's message is the board and the budget, without "Reward: 0"
    or a per-answer cap. Without it, every turn says both."""
    agent = make_agent("tetrisAgent_gap_dim_4", task("tetrisAgent_gap_dim_4"))
    agent.reset(3)
    assert not agent.step("<answer>Left</answer>").done
    follow_up = agent.messages[-1]["content"]
    assert follow_up.startswith("Turn 2. State:\n") and "Reward" not in follow_up
    assert follow_up.rstrip().endswith("You have 4 actions left.") and "at most" not in follow_up
    full = make_agent("tetrisAgent_gap_dim_4", task("tetrisAgent_gap_dim_4", agent={"brief_turns": False}))
    full.reset(3)
    full.step("<answer>Left</answer>")
    assert (
        full.messages[-1]["content"]
        == "Reward: 0\n" + follow_up.rstrip()[:-1] + "; use at most 1 in this answer."
    )
    agent.reset(3)
    dropped = agent.step("<answer>Down</answer>")  # never over the gap at the start: a loss
    assert dropped.done and not dropped.info["success"]
