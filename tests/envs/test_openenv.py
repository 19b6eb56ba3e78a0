"""The `openenv` env (grl/envs/openenv/env.py) against GRL's one-gap Tetris served as an OpenEnv environment
(grl/envs/openenv/serve.py): real servers started by the env with uvicorn, real WebSocket sessions through
OpenEnv's client, no mocks. Played through OpenEnv, the game is the native game, seed for seed; the boundary
fails in one line, in time, and leaves no server behind."""

import copy
import os
import random
import signal
import socket
import time
from pathlib import Path

import pytest
import yaml

import grl.envs  # noqa: E402
from grl.agents import make_agent  # noqa: E402
from grl.envs.openenv.servers import SERVER_MODULE, OpenEnvError  # noqa: E402

AGENTS = yaml.safe_load(
    (Path(__file__).resolve().parents[2] / "configs" / "agents.yaml").read_text(encoding="utf-8")
)
NATIVE = AGENTS["tetrisAgent_gap_dim_4"]
TETRIS = NATIVE["env_config"]
SERVED = {"app": "grl.envs.openenv.serve:make_app", "app_kwargs": {"env": "tetris", "env_config": TETRIS}}
INVALID = ["jump", "", "Left || Right", "<answer>Down</answer>", "rotate"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def local_servers() -> list[int]:
    """The OpenEnv servers this process started that still run (the module's `served` one among them)."""
    import psutil

    return [
        child.pid
        for child in psutil.Process().children(recursive=True)
        if child.is_running()
        and child.status() != psutil.STATUS_ZOMBIE
        and SERVER_MODULE in " ".join(child.cmdline())
    ]


@pytest.fixture(scope="module")
def served():
    """One server for the module, taking two sessions at once (the second plays it by URL)."""
    env = grl.envs.make(
        "openenv", app=SERVED["app"], app_kwargs={**SERVED["app_kwargs"], "max_concurrent_envs": 2}
    )
    env.reset(0)
    yield env
    env.close()


def test_played_through_openenv_it_is_the_native_game_seed_for_seed(served):
    native = grl.envs.make("tetris", **TETRIS)
    invalid_seen = ended = won = 0
    for seed in range(20):
        assert served.reset(seed) == native.reset(seed)
        assert served.valid_actions() == native.valid_actions()
        assert (served.legend(), served.action_help()) == (native.legend(), native.action_help())
        rng = random.Random(1000 + seed)
        for _ in range(8):  # the episode ends within max_steps (5); later steps must agree too
            if rng.random() < 0.2:
                action = rng.choice(INVALID)
                invalid_seen += 1
            else:
                action = rng.choice(native.valid_actions())
            got, want = served.step(action), native.step(action)
            assert got == want, (seed, action)
            assert served.valid_actions() == native.valid_actions()
        ended += want[2]
        won += want[3]["success"]
    assert invalid_seen and ended == 20 and 0 < won < 20  # the play covered wrong replies, wins and losses


def test_a_grl_agent_plays_the_served_game_as_it_plays_the_native_one():
    block = AGENTS["tetrisOpenEnv"]
    assert block["agent_type"] == "openenv" and block["env_config"]["app_kwargs"]["env_config"] == TETRIS
    assert block["agent_config"] == NATIVE["agent_config"]
    agent, native = (
        make_agent("tetrisOpenEnv", copy.deepcopy(block)),
        make_agent("tetrisAgent_gap_dim_4", copy.deepcopy(NATIVE)),
    )
    try:
        for seed in (3, 4):
            assert agent.reset(seed) == native.reset(seed)  # the same prompt: legend, action help, board
            assert agent.answer_choices() == native.answer_choices() == ["Left", "Right", "Down"]
            for reply in (
                "<answer>Left</answer>",
                "no answer",
                "<answer>Down</answer>",
                "<answer>Right</answer>",
            ):
                got, want = agent.step(reply), native.step(reply)
                assert (got.reward, got.done) == (want.reward, want.done)
                assert agent.messages == native.messages
                if want.done:
                    break
            assert got.done and agent.episode_metrics() == native.episode_metrics()
    finally:
        agent.close()


def test_a_url_with_nothing_behind_it_fails_in_one_line_naming_it():
    url = f"http://127.0.0.1:{free_port()}"
    env = grl.envs.make("openenv", base_url=url, timeout_s=5)
    started = time.monotonic()
    with pytest.raises(OpenEnvError) as caught:
        env.reset(0)
    message = str(caught.value)
    assert "\n" not in message and url in message and "reset failed" in message, message
    assert time.monotonic() - started < 5
    env.close()


def test_an_app_that_cannot_start_fails_in_one_line():
    before = set(local_servers())
    env = grl.envs.make("openenv", app=SERVED["app"], app_kwargs={"env": "no_such_env"})
    with pytest.raises(OpenEnvError) as caught:
        env.reset(0)
    message = str(caught.value)
    assert "\n" not in message and SERVED["app"] in message and "no_such_env" in message, message
    assert set(local_servers()) <= before


@pytest.mark.parametrize("how", ["killed", "frozen"])
def test_a_server_that_dies_mid_episode_makes_step_raise_within_the_timeout(how):
    env = grl.envs.make("openenv", **SERVED, timeout_s=2)
    try:
        env.reset(5)
        env.step("Left")
        pid = env.server_pid
        os.kill(pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(OpenEnvError) as caught:
            env.step("Right")
        assert time.monotonic() - started < 2 + 3  # the request's limit, and no more than scheduling slack
        message = str(caught.value)
        assert "\n" not in message and "step failed at http://127.0.0.1:" in message, message
        if how == "frozen":
            assert "TimeoutError" in message
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGCONT)
        env.close()
    assert gone(pid)


def test_close_leaves_no_server_behind():
    env = grl.envs.make("openenv", **SERVED)
    env.reset(1)
    env.reset(2)  # reused across resets: one server
    pid, url = env.server_pid, env.base_url
    env.close()
    assert gone(pid)
    port = int(url.rsplit(":", 1)[1])
    with socket.socket() as sock, pytest.raises(OSError):
        sock.connect(("127.0.0.1", port))
    env.close()  # twice is harmless


def test_the_envs_of_one_app_share_its_server_until_the_last_closes():
    before = set(local_servers())
    first, second = grl.envs.make("openenv", **SERVED), grl.envs.make("openenv", **SERVED)
    alone = grl.envs.make("openenv", **SERVED, share_server=False)
    native = grl.envs.make("tetris", **TETRIS)
    for env in (first, second, alone):
        assert env.reset(3) == native.reset(3)
    assert first.server_pid == second.server_pid != alone.server_pid
    pid = first.server_pid
    first.close()
    assert not gone(pid) and second.step("Down")[0] == native.step("Down")[0]  # its own session goes on
    second.close()
    alone.close()
    assert gone(pid) and set(local_servers()) <= before


def test_observation_fields_are_configurable(served):
    """By URL, a second session of the same server; without the text, action and info fields the observation
    is shown as compact JSON, actions are free text and validity falls back to the reward."""
    env = grl.envs.make(
        "openenv", base_url=served.base_url, text_field=None, actions_field=None, info_field=None
    )
    try:
        text = env.reset(7)
        assert text.startswith("{") and '"text":"' in text and "\n" not in text
        assert env.valid_actions() is None
        _, reward, done, info = env.step("jump")
        assert (reward, done) == (0.0, False) and info == {
            "success": False,
            "action_is_valid": True,
            "action_is_effective": True,
        }
    finally:
        env.close()
    assert served.reset(7) == grl.envs.make("tetris", **TETRIS).reset(
        7
    )  # the first session was not disturbed


def test_config_errors_are_caught_when_the_env_is_built():
    with pytest.raises(ValueError, match="give one of"):
        grl.envs.make("openenv", base_url="http://127.0.0.1:1", app=SERVED["app"])
    with pytest.raises(ValueError, match="timeout_s"):
        grl.envs.make("openenv", **SERVED, timeout_s=0)
    with pytest.raises(ValueError, match="package.module:attribute"):
        grl.envs.make("openenv", app="grl.envs.openenv.serve")
