"""The env boundary (grl/envs/checks.py): every malformed kind of value an env can return is refused
or repaired, by kind; and through the agent, a refused value ends the episode instead of raising."""

import math

import numpy as np
import pytest

from grl.agents import Agent, AgentSettings, TaskHooks
from grl.envs.base import Env, step_info
from grl.envs.checks import (
    MAX_OBSERVATION_CHARS,
    EnvValueError,
    check_observation,
    check_step,
    check_valid_actions,
)

INFO = step_info(False, True, True)
HUGE = "x" * (10 * 2**20)

REFUSED_STEPS = [
    ("nan reward", ("s", math.nan, False, INFO), "nonfinite_reward", "float nan"),
    ("+inf reward", ("s", math.inf, False, INFO), "nonfinite_reward", "float inf"),
    ("-inf reward", ("s", -math.inf, False, INFO), "nonfinite_reward", "float -inf"),
    ("numpy nan reward", ("s", np.float32("nan"), False, INFO), "nonfinite_reward", "float32"),
    ("None reward", ("s", None, False, INFO), "reward", "NoneType None"),
    ("text reward", ("s", "1.0 points", False, INFO), "reward", "str '1.0 points'"),
    ("bytes observation", (b"state", 1.0, False, INFO), "observation", "bytes b'state'"),
    ("int observation", (7, 1.0, False, INFO), "observation", "int 7"),
    ("None observation", (None, 1.0, False, INFO), "observation", "NoneType None"),
    ("10 MB bytes observation", (HUGE.encode(), 1.0, False, INFO), "observation", "bytes b'xxx"),
    ("2-tuple", ("s", 1.0), "result", "a 2-tuple"),
    ("5-tuple", ("s", 1.0, False, False, INFO), "result", "gymnasium"),
    ("not a tuple", None, "result", "NoneType None"),
    ("int done", ("s", 1.0, 1, INFO), "done", "int 1"),
    ("text done", ("s", 1.0, "False", INFO), "done", "str 'False'"),
    ("None info", ("s", 1.0, False, None), "info", "NoneType None"),
    ("list info", ("s", 1.0, False, [("success", True)]), "info", "list"),
]


@pytest.mark.parametrize(
    "result, kind, shown", [r[1:] for r in REFUSED_STEPS], ids=[r[0] for r in REFUSED_STEPS]
)
def test_malformed_step_results_are_refused_by_kind(result, kind, shown):
    with pytest.raises(EnvValueError) as info:
        check_step(result)
    assert info.value.kind == kind and shown in str(info.value)
    assert len(str(info.value)) < 300  # a short repr, even of 10 MB


def test_valid_step_results_pass_with_plain_types():
    assert check_step(("s", 1, True, INFO)) == ("s", 1.0, True, INFO, [])
    obs, reward, done, info, repairs = check_step(["s", np.float64(0.5), np.bool_(False), INFO])
    assert (
        (obs, reward, done, repairs) == ("s", 0.5, False, []) and type(reward) is float and type(done) is bool
    )
    assert check_step(("s", True, False, INFO))[1] == 1.0  # a bool is a number in Python


def test_huge_observation_is_cut_to_the_documented_limit_and_says_so():
    text, repairs = check_observation(HUGE, "step")
    assert text.startswith("x" * MAX_OBSERVATION_CHARS) and text.count("x") == MAX_OBSERVATION_CHARS
    assert f"observation cut: {len(HUGE)} characters" in text
    assert [r.kind for r in repairs] == ["observation_cut"]
    assert check_observation("x" * MAX_OBSERVATION_CHARS, "step") == ("x" * MAX_OBSERVATION_CHARS, [])


@pytest.fixture(scope="module")
def tokenizer():
    from grl.models import load_tokenizer

    return load_tokenizer("tiny")


@pytest.mark.parametrize(
    "raw, clean",
    [("a\ud800b", "a\ufffdb"), ("a\x00b\x00", "a\ufffdb\ufffd"), ("\udc80\ud83d\ude00", "\ufffd" * 3)],
    ids=["surrogate", "nul", "pairs"],
)
def test_lone_surrogates_and_nul_are_replaced_and_the_tokenizer_takes_the_result(raw, clean, tokenizer):
    with pytest.raises(Exception):  # what the repair prevents: the tokenizer refuses a lone surrogate
        tokenizer.encode("a\ud800b")
    text, repairs = check_observation(raw, "reset")
    assert text == clean and [r.kind for r in repairs] == ["observation_repaired"]
    assert tokenizer.decode(tokenizer.encode(text)) == clean
    text.encode("utf-8")


@pytest.mark.parametrize(
    "value",
    [[], (), "Up", ["Up", ""], ["Up", 3], ["Up", None], ["Up\x00"], ["\ud800"], 5],
    ids=[
        "empty",
        "empty tuple",
        "a string",
        "empty action",
        "int action",
        "None action",
        "nul",
        "surrogate",
        "int",
    ],
)
def test_malformed_valid_actions_are_refused(value):
    with pytest.raises(EnvValueError) as info:
        check_valid_actions(value)
    assert info.value.kind == "valid_actions"


def test_valid_actions_pass():
    assert check_valid_actions(None) is None
    assert check_valid_actions(("Up", "Down")) == ["Up", "Down"]


class HostileEnv(Env):
    """Returns `bad` (a whole step result) at its second step, a fine state otherwise."""

    def __init__(self, bad=None, bad_reset="start"):
        self.bad, self.bad_reset = bad, bad_reset

    def reset(self, seed):
        self.t = 0
        return self.bad_reset

    def step(self, action):
        self.t += 1
        return self.bad if self.t == 2 else (f"state {self.t}", 1.0, False, INFO)

    def valid_actions(self):
        return ["go"] if self.t < 2 else []


def agent(env, decoding="free"):
    settings = AgentSettings(
        max_turns=5, max_actions_all_turns=5, enable_think=False, action_decoding=decoding
    )
    return Agent("hostile", settings, env, TaskHooks())


@pytest.mark.parametrize(
    "result, kind, shown", [r[1:] for r in REFUSED_STEPS], ids=[r[0] for r in REFUSED_STEPS]
)
def test_agent_ends_the_episode_on_a_malformed_step_and_never_raises(result, kind, shown):
    a = agent(HostileEnv(bad=result))
    a.reset(0)
    first = a.step("<answer>go</answer>")
    assert not first.done and first.reward == 1.0
    second = a.step("<answer>go</answer>")
    assert second.done and second.info["env_error_kind"] == kind and shown in second.info["env_error"]
    assert second.reward == 0.0 and second.info["actions"] == []
    assert a.observation == "state 1" and math.isfinite(a.episode_metrics()["num_actions"])


def test_agent_repairs_observations_and_reports_what_it_repaired():
    a = agent(HostileEnv(bad=("ok\x00" + HUGE, 1.0, False, INFO), bad_reset="\ud800start"))
    messages = a.reset(0)
    assert "\ufffdstart" in messages[1]["content"] and [r.kind for r in a.env_repairs] == [
        "observation_repaired"
    ]
    a.step("<answer>go</answer>")
    assert a.env_repairs == []
    step = a.step("<answer>go</answer>")
    assert not step.done and [r.kind for r in a.env_repairs] == ["observation_cut", "observation_repaired"]
    assert len(a.observation) < MAX_OBSERVATION_CHARS + 100 and a.state_key()


@pytest.mark.parametrize("bad_reset", [b"start", None, 3])
def test_agent_reset_refuses_an_observation_that_is_not_text(bad_reset):
    with pytest.raises(EnvValueError, match="reset\\(\\) returned an observation that is not text"):
        agent(HostileEnv(bad_reset=bad_reset)).reset(0)


def test_constrained_agent_refuses_an_empty_action_list():
    a = agent(HostileEnv(bad=("s", 1.0, False, INFO)), decoding="constrained")
    a.reset(0)
    assert a.answer_choices() == ["go"]
    a.step("<answer>go</answer>")
    a.step("<answer>go</answer>")
    with pytest.raises(EnvValueError, match="empty list"):
        a.answer_choices()
    assert agent(HostileEnv()).answer_choices() is None  # free decoding never asks the env
