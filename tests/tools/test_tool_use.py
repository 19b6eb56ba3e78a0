"""Tool calls inside an episode: parsing, budgets, output as the next message, counts, concurrency."""

import time

import pytest

import grl.agents
from grl.agents import make_agent, parse_tool_calls
from grl.envs.base import Env, step_info
from grl.rollout.env_pool import run_calls
from grl.tools import SandboxLimits

LIMITS = SandboxLimits(wall_s=3.0, cpu_s=2, memory_mb=512)


class CountEnv(Env):
    """Answer the number of letters in a word; counts its steps so a test sees it was not stepped."""

    def reset(self, seed: int) -> str:
        self.word, self.steps = ("banana", "kiwi", "cherry")[seed % 3], 0
        return f"How many letters has {self.word}?"

    def step(self, action: str):
        self.steps += 1
        right = action.strip() == str(len(self.word))
        return (
            "done",
            float(right),
            True,
            step_info(success=right, action_is_valid=True, action_is_effective=True),
        )


def task(**agent_config):
    return {
        "agent_type": "countAgent",
        "agent_config": {
            "enable_think": False,
            "max_turns": 4,
            "format_penalty": -0.1,
            "tools": ["python"],
            "max_tool_calls_per_turn": 1,
            "max_tool_calls": 2,
            "max_tool_output_chars": 50,
            **agent_config,
        },
    }


@pytest.fixture(scope="module", autouse=True)
def count_agent():
    grl.envs.register("count", CountEnv)
    grl.agents.register("countAgent", "count")


@pytest.mark.parametrize(
    "reply, expected",
    [
        ("<python>print(1)</python>", [("python", "print(1)")]),
        (
            "a <PYTHON >x = 2\nprint(x)</ python> b <python>print(3)",
            [("python", "x = 2\nprint(x)"), ("python", "print(3)")],
        ),
        ("<python>print(1)</pyt", [("python", "print(1)")]),
        (
            '<tool_call>{"name": "python", "arguments": {"code": "print(4)"}}</tool_call>',
            [("python", "print(4)")],
        ),
        (
            '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(5)\\"}"}</tool_call>',
            [("python", "print(5)")],
        ),
        ("<tool_call>not json</tool_call>", [("", "")]),
        ('<tool_call>{"name": "python"}</tool_call>', [("", "")]),
        ("<answer>5</answer>", []),
        ("", []),
    ],
)
def test_parse_tool_calls(reply, expected):
    assert [(c.tool, c.code) for c in parse_tool_calls(reply)] == expected


def test_a_tool_turn_returns_the_output_as_the_next_message_without_stepping_the_env():
    agent = make_agent("count", task(), LIMITS)
    agent.reset(0)
    step = agent.step("<python>print(len('banana'))</python>")
    assert not step.done and step.reward == 0.0 and agent.env.steps == 0
    assert agent.messages[-1] == {"role": "tool", "content": "6"}
    step = agent.step("<answer>6</answer>")
    assert step.done and step.reward == 1.0 and agent.env.steps == 1
    metrics = agent.episode_metrics()
    assert metrics["tool_calls"] == 1 and metrics["tool_errors"] == 0 and metrics["tool_timeouts"] == 0
    assert metrics["tool_time_s"] > 0 and metrics["success"] == 1.0 and metrics["num_actions"] == 1


def test_limits_errors_and_truncation_come_back_as_text():
    agent = make_agent("count", task(), LIMITS)
    agent.reset(1)
    agent.step("<python>print('x' * 500)</python><python>print(2)</python>")
    output = agent.messages[-1]["content"]
    assert (
        "[call 1]\n"
        + "x" * 25
        + "\n...\n"
        + "x" * 24
        + "\n[output truncated: 501 characters, the first 25 and "
        "last 25 shown]" in output
    )
    assert "[call 2]\n[not run: 1 call(s) a reply, 2 an episode]" in output
    agent.step("<python>import time\ntime.sleep(30)</python>")
    assert "[stopped: time limit of 3 s]" in agent.messages[-1]["content"]
    agent.step("<python>1/0</python>")
    assert "[not run: 1 call(s) a reply, 2 an episode]" in agent.messages[-1]["content"]
    step = agent.step("<answer>4</answer>")
    assert step.done and step.reward == 1.0
    counts = {key: agent.episode_metrics()[key] for key in ("tool_calls", "tool_errors", "tool_timeouts")}
    assert counts == {"tool_calls": 2.0, "tool_errors": 0.0, "tool_timeouts": 1.0}
    agent.reset(2)
    agent.step("<python>1/0</python>")
    assert agent.messages[-1]["content"].endswith(
        "Error: division by zero\n[output truncated: 148 characters, the first 25 and last 25 shown]\n[exit "
        "code 1]"
    )
    agent.step('<tool_call>{"name": "bash", "arguments": {"code": "ls"}}</tool_call>')
    assert "[tool call not run: unknown tool 'bash' (tools: python)]" in agent.messages[-1]["content"]
    assert agent.episode_metrics()["tool_errors"] == 2.0  # counters start again with the episode


def test_the_last_turn_may_be_a_tool_turn():
    agent = make_agent("count", task(max_turns=1), LIMITS)
    agent.reset(0)
    step = agent.step("<python>print(1)</python>")
    assert step.done and step.info["tool_output"] == "1" and agent.messages[-1]["role"] == "assistant"


def test_slow_tool_calls_hold_the_turn_no_longer_than_the_limit():
    """Four agents sleep past the limit while a fifth answers: the pool's turn ends within the
    wall limit plus a second, not four limits."""
    agents = [make_agent("count", task(), LIMITS) for _ in range(5)]
    for agent in agents:
        agent.reset(0)
    replies = ["<python>import time\ntime.sleep(60)</python>"] * 4 + ["<python>print(6)</python>"]
    started = time.monotonic()
    results = run_calls([lambda a=a, r=r: a.step(r) for a, r in zip(agents, replies)], workers=8, timeout=60)
    assert time.monotonic() - started < LIMITS.wall_s + 1.0
    assert all(r.ok and not r.value.done for r in results)
    assert [a.episode_metrics()["tool_timeouts"] for a in agents] == [1, 1, 1, 1, 0]
    assert agents[-1].messages[-1]["content"] == "6"


def test_bad_tool_settings_are_one_line_errors():
    with pytest.raises(ValueError, match=r"count.agent_config.tools: 'shell' is not one of python"):
        make_agent("count", task(tools=["shell"]), LIMITS)
    with pytest.raises(ValueError, match=r"count.agent_config.max_tool_calls: must be an integer >= 1"):
        make_agent("count", task(max_tool_calls=0), LIMITS)


def test_tool_output_is_rendered_in_the_template_tool_role_or_as_user():
    from grl.models import load_tokenizer
    from grl.rollout.chat import ChatTokens

    tokenizer = load_tokenizer("tiny")
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "42"},
    ]
    assert "<|im_start|>tool\n42<|im_end|>" in ChatTokens(tokenizer).render(messages, True)

    class NoToolRole:  # a template that knows only user and assistant turns, as many do
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            if any(m["role"] not in ("system", "user", "assistant") for m in messages):
                raise ValueError("Conversation roles must be user or assistant")
            return "".join(f"[{m['role']}] {m['content']}\n" for m in messages)

    assert ChatTokens(NoToolRole()).render(messages, True).endswith("[user] 42\n")


class ChoiceCountEnv(CountEnv):
    def valid_actions(self):
        return ["4", "6", f"<python>print(len({self.word!r}))</python>"]


def test_constrained_choices_offer_tool_calls_only_while_the_budget_lasts():
    grl.envs.register("choice_count", ChoiceCountEnv)
    grl.agents.register("choiceCountAgent", "choice_count")
    block = task(action_decoding="constrained", max_tool_calls=1) | {"agent_type": "choiceCountAgent"}
    agent = make_agent("choice_count", block, LIMITS)
    agent.reset(0)
    assert agent.answer_choices() == ["4", "6", "<python>print(len('banana'))</python>"]
    agent.step("<answer><python>print(len('banana'))</python></answer>")
    assert agent.messages[-1] == {"role": "tool", "content": "6"}
    assert agent.answer_choices() == ["4", "6"]
    agent.reset(0)
    assert len(agent.answer_choices()) == 3


class ToolOnlyEnv(Env):
    """Its valid actions are two tool calls that print the same, so a constrained reply is a call every turn
    (two: a grammar of one choice forces every token, which grl/engines/hf.py's prefix cache fails on)."""

    def reset(self, seed: int) -> str:
        return "Run the tool."

    def valid_actions(self):
        return ["<python>print('zebra' * 3)</python>", "<python>print('zebra' + 'zebra' + 'zebra')</python>"]

    def step(self, action: str):
        return "done", 0.0, True, step_info(success=False, action_is_valid=True, action_is_effective=True)


def test_tool_output_is_environment_tokens_in_the_rollout_batch():
    from grl.engines import SamplingParams, make_engine
    from grl.rollout import MultiTurnRollout, TaskSpec, build_batch

    grl.envs.register("tool_only", ToolOnlyEnv)
    grl.agents.register("toolOnlyAgent", "tool_only")
    block = task(action_decoding="constrained", max_turns=2, max_tokens=40, max_tool_calls=1) | {
        "agent_type": "toolOnlyAgent"
    }
    engine = make_engine("hf", "tiny", device="cpu")
    rollout = MultiTurnRollout(
        engine,
        engine.tokenizer,
        max_prompt_length=512,
        max_response_length=40,
        agent_factory=lambda name, cfg: make_agent(name, cfg, LIMITS),
    )
    episode = rollout.run(
        [TaskSpec("tool_only", grl.agents.task_from_block("tool_only", block), 1, 1)],
        0,
        SamplingParams(greedy=True),
    ).episodes[0]
    engine.shutdown()
    assert [turn.info.get("tool_output") for turn in episode.turns] == [
        "zebrazebrazebra",
        "[not run: 1 call(s) a reply, 1 an episode]",
    ]
    batch, _ = build_batch([episode])
    ids, mask = batch["input_ids"][0].tolist(), batch["loss_mask"][0].tolist()
    second_prompt = episode.turns[1].prompt_ids
    start = next(i for i in range(len(ids)) if ids[i : i + len(second_prompt)] == second_prompt)
    assert "<|im_start|>tool\nzebrazebrazebra<|im_end|>" in engine.tokenizer.decode(second_prompt)
    assert all(m == 0.0 for m in mask[start : start + len(second_prompt)])  # tool output: environment tokens
    assert sum(mask) == len(episode.turns[0].response_ids) + len(episode.turns[1].response_ids)
