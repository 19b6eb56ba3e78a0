"""The `openenv` env against the other kinds of OpenEnv environment, all real servers over OpenEnv's client:
integer actions (OpenSpiel's shape), an MCP env played by tool calls, and an env package OpenEnv itself
ships (`openenv init`'s template, laid out by OpenEnv's own CLI), named by its module and served one
session per server, pooled."""

import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
from openenv.core.env_server.mcp_types import CallToolAction

import grl.envs
from grl.agents import make_agent
from grl.engines.constraint import compile_reply_grammar
from grl.envs.openenv import servers
from grl.envs.openenv.actions import ActionCodec, ActionError

TETRIS = {"dim_x": 4, "dim_y": 3, "box_type": 1, "max_steps": 5, "gap_rows": 1, "max_pieces": 1}
TYPED = {
    "app": "grl.envs.openenv.serve_typed:make_typed_app",
    "app_kwargs": {"env": "tetris", "env_config": TETRIS},
}
GUESS = {"max_number": 20, "max_guesses": 6}
MCP = {
    "app": "grl.envs.openenv.serve_typed:make_mcp_app",
    "app_kwargs": {"env": "guess_number", "env_config": GUESS},
}


def test_integer_moves_are_offered_as_text_and_sent_back_as_the_ids_of_the_native_game():
    env, native = grl.envs.make("openenv", **TYPED), grl.envs.make("tetris", **TETRIS)
    try:
        for seed in range(6):
            assert env.reset(seed) == native.reset(seed)
            moves = native.valid_actions()
            assert env.valid_actions() == [str(i) for i in range(len(moves))]
            assert (
                "Write the action as a whole number." in env.action_help()
                and "1 = Right" in env.action_help()
            )
            for reply in (
                "1",
                "Left",
                " 0 ",
                "7",
                "2",
            ):  # junk and an id past the list are invalid, not sent on
                text, reward, done, info = env.step(reply)
                if reply.strip().isdigit() and int(reply) < len(moves):
                    assert (text, reward, done, info["action_is_valid"]) == native.step(moves[int(reply)])[
                        :3
                    ] + (True,)
                else:
                    assert (
                        not info["action_is_valid"] and reward == 0.0 and not done and text == native.render()
                    )
                if done:
                    break
    finally:
        env.close()


def test_integer_moves_pass_the_valid_action_check_and_compile_into_the_reply_grammar():
    """What broke on integer actions before: the agent's legal-action check and the constrained grammar."""
    task = {
        "agent_type": "openenv",
        "agent_config": {
            "enable_think": False,
            "action_decoding": "constrained",
            "max_turns": 5,
            "max_actions_all_turns": 5,
        },
        "env_config": TYPED,
    }
    agent = make_agent("tetrisTyped", task)
    try:
        agent.reset(4)
        choices = agent.answer_choices()
        assert choices == ["0", "1", "2"]
        grammar = compile_reply_grammar(lambda text: list(text.encode()), [256], choices, False, 32)
        assert grammar is not None
        step = agent.step("<answer>2</answer>")  # Down: the piece drops and the one-piece game ends
        native = grl.envs.make("tetris", **TETRIS)
        native.reset(4)
        assert (step.reward, step.done) == native.step("Down")[1:3] and step.info["actions"] == ["2"]
    finally:
        agent.close()


def test_a_structured_action_is_a_json_object_of_the_schema_fields():
    codec = ActionCodec(CallToolAction.model_json_schema(), None, "test")  # several fields: structured
    assert codec.field is None and "tool_name" in codec.describe()
    call = {"tool_name": "act", "arguments": {"action": "3"}}
    assert codec.encode(json.dumps(call)) == call
    legal = {'{"arguments":{},"tool_name":"a"}': {"tool_name": "a", "arguments": {}}}
    assert (
        codec.encode('{"arguments":{},"tool_name":"a"}', legal) is legal['{"arguments":{},"tool_name":"a"}']
    )
    for bad in ("act", '{"arguments": {}}', '{"tool_name": "a", "colour": 1}', "[1]"):
        with pytest.raises(ActionError):
            codec.encode(bad)
    integer = ActionCodec({"properties": {"action_id": {"type": "integer"}, "metadata": {}}}, None, "test")
    assert integer.encode(" 12 ") == {"action_id": 12}
    with pytest.raises(ActionError):
        integer.encode("1.5")


def binary_search_replies(agent, native: bool) -> int:
    """Gold play of guess the number through tool calls: halve the range the env reports. `native`: the
    call as tool-calling models write it, else its JSON in answer tags."""
    low, high = 1, GUESS["max_number"]
    for turn in range(1, GUESS["max_guesses"] + 1):
        guess = (low + high) // 2
        call = f'{{"name": "act", "arguments": {{"action": "{guess}"}}}}'
        step = agent.step(f"<tool_call>{call}</tool_call>" if native else f"<answer>{call}</answer>")
        assert step.info["actions"] == [f"<tool_call>{call}</tool_call>" if native else call]
        if step.done:
            return turn if step.reward > 0 else -1
        said = agent.messages[-1]["content"]
        low, high = (guess + 1, high) if "too low" in said else (low, guess - 1)
    return -1


def test_a_tool_calling_agent_plays_an_mcp_env_by_its_tools_and_binary_search_always_wins():
    task = {
        "agent_type": "openenvToolsAgent",
        "agent_config": {
            "prompt": "Find the number.",
            "enable_think": False,
            "max_turns": 8,
            "max_actions_all_turns": 8,
            "format_penalty": 0.0,
        },
        "env_config": MCP,
    }
    agent = make_agent("guessMCP", task)
    try:
        first = agent.reset(0)
        prompt = json.dumps(first)
        assert (
            "<tools>" in prompt and '\\"name\\": \\"act\\"' in prompt and "legal_actions" in prompt
        )  # the env's own tools
        bound = math.ceil(math.log2(GUESS["max_number"] + 1))
        for seed in range(12):
            agent.reset(seed)
            turns = binary_search_replies(agent, native=seed % 2 == 0)
            assert 1 <= turns <= bound, (seed, turns)
        agent.reset(3)
        step = agent.step(
            '<answer><tool_call>{"name": "legal_actions", "arguments": {}}</tool_call></answer>'
        )
        listed = json.dumps([str(n) for n in range(1, 21)], separators=(",", ":"))
        assert listed in agent.messages[-1]["content"] and not step.done
        step = agent.step('<answer>{"name": "shout", "arguments": {}}</answer>')  # not one of the env's tools
        assert "unknown tool 'shout'" in agent.messages[-1]["content"] and step.info["invalid_actions"]
    finally:
        agent.close()


@pytest.fixture(scope="module")
def echo_package(tmp_path_factory):
    """OpenEnv's own env template, laid out by OpenEnv's CLI as `openenv init echo_game` lays it out."""
    root = tmp_path_factory.mktemp("openenv_pkgs")
    subprocess.run(
        [str(Path(sys.executable).with_name("openenv")), "init", "echo_game", "--output-dir", str(root)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    sys.path.insert(0, str(root))
    yield "echo_game"
    sys.path.remove(str(root))
    servers.stop_idle()


@pytest.mark.slow
def test_an_env_package_is_played_by_name_one_session_per_server_and_its_servers_are_pooled(echo_package):
    first = grl.envs.make("openenv", package=echo_package, text_field="echoed_message")
    second = grl.envs.make("openenv", package=echo_package, text_field="echoed_message")
    try:
        with ThreadPoolExecutor(2) as pool:  # two episodes starting at once, as a rollout's agents do
            texts = list(pool.map(lambda env: env.reset(0), (first, second)))
        assert texts == ["Echo Game environment ready!"] * 2
        assert first.server_pid != second.server_pid  # the app takes one session: a server each
        for message in ("hello", "a longer message", ""):  # its documented play: the echo, 0.1 a character
            text, reward, done, _ = first.step(message)
            assert (text, done) == (message, False) and reward == pytest.approx(0.1 * len(message))
        pids = {first.server_pid, second.server_pid}
    finally:
        first.close()
        second.close()
    task = {
        "agent_type": "openenv",
        "agent_config": {"enable_think": False, "max_turns": 3, "max_actions_all_turns": 3},
        "env_config": {"package": echo_package},
    }
    agent = make_agent(
        "echoPackage", {**task, "env_config": {**task["env_config"], "text_field": "echoed_message"}}
    )
    try:
        agent.reset(2)
        assert agent.env.server_pid in pids  # the next episode reuses an idle server: no start
        step = agent.step("<answer>echo me</answer>")
        assert (
            step.reward == pytest.approx(0.7) and not step.done and "echo me" in agent.messages[-1]["content"]
        )
    finally:
        agent.close()
    servers.stop_idle()
    assert not any(psutil.pid_exists(pid) for pid in pids)


def test_a_package_this_machine_cannot_run_fails_in_one_line_when_built(tmp_path, monkeypatch):
    """Not installed; installed without a server app (openenv-core itself: no env in it); installed with a
    dependency this machine lacks (a package laid out here, declaring one)."""
    (tmp_path / "needy_game" / "server").mkdir(parents=True)
    for name in ("needy_game/__init__.py", "needy_game/server/__init__.py", "needy_game/server/app.py"):
        (tmp_path / name).write_text("")
    info = tmp_path / "openenv_needy_game-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: openenv-needy-game\nVersion: 0.1.0\n"
        "Requires-Dist: openenv-core>=0.2\nRequires-Dist: grl-no-such-dependency>=1.0\n"
        'Requires-Dist: grl-no-such-extra; extra == "dev"\n'
    )
    (info / "top_level.txt").write_text("needy_game\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cases = {
        "openenv-no_such_game": "not installed here",
        "openenv-core": "has no server app openenv.server.app",
        "openenv-needy-game": "needs grl-no-such-dependency>=1.0 (not installed)",
        "needy_game": "needs grl-no-such-dependency>=1.0 (not installed)",
    }
    for package, why in cases.items():
        with pytest.raises(ValueError) as caught:
            grl.envs.make("openenv", package=package)
        message = str(caught.value)
        assert "\n" not in message and why in message and repr(package) in message, message
    with pytest.raises(ValueError, match="give one of"):
        grl.envs.make("openenv", package="json", app="grl.envs.openenv.serve:make_app")
