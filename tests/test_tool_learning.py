"""PPO must teach a from-scratch tiny model to call the Python tool.

The task: each episode hides a fruit, chosen by a hash of the seed, so nothing in the prompt tells
which (training and validation seeds differ): without the tool a reply can only guess (one in four).
The tool call that reveals it is one of the replies the model may write: under valid-action
decoding every reply is `<answer>X</answer>` where X is a fruit or the seed's Python call, so the
model can fail only on the choice, never on the format. The call's output, the fruit printed 300
times, is the next message (environment tokens); a second reply that names it succeeds. To learn,
the model must both call the tool and copy its output. A call pays only once the copy works, and the
copy is learnt only from episodes that call, so the output must make the copy easy: printed 300 times
the fruit is three quarters of the context, where a 2-layer random model picks it up in about ten
updates (printed 48 times, a third of the context, the calls rose to 0.85 by step 18 but the answers
after them were still guesses).
Greedy validation success must rise to 0.75 with the tool called in nearly every episode; with the
advantages negated the same run must not learn.
"""

import pytest

import grl.agents
import grl.envs
from grl.envs.base import Env, step_info
from grl.tracking import METRICS_FILE, read_jsonl

from test_learning import multiply_advantages, small_run_config

FRUITS = ("apple", "fig", "lime", "date")  # one token each, with or without a newline before


def hidden_fruit(seed: int) -> str:
    return FRUITS[pow(seed, 7, 97) % len(FRUITS)]


REPEATS = 300  # lines of tool output: 1800 characters at most, under the default output cap of 2000


def reveal_code(seed: int) -> str:
    """Python that prints the seed's fruit, one a line, REPEATS times."""
    choices = ", ".join(f"'{fruit}\\n'" for fruit in FRUITS)
    return f"print(({choices})[pow({seed}, 7, 97) % {len(FRUITS)}] * {REPEATS})"


class HiddenFruitEnv(Env):
    """One answer per episode; reward 1 and success when it is the seed's hidden fruit."""

    def reset(self, seed: int) -> str:
        self.seed = seed
        return f"Box {seed} holds a fruit. Name it."

    def valid_actions(self):
        return [*FRUITS, f"<python>{reveal_code(self.seed)}</python>"]

    def step(self, action: str):
        right = action.strip() == hidden_fruit(self.seed)
        return (
            "done",
            float(right),
            True,
            step_info(success=right, action_is_valid=action.strip() in FRUITS, action_is_effective=True),
        )


TASK = {
    "agent_type": "hiddenFruitAgent",
    "agent_config": {
        "system_prompt": "You find hidden fruit.",
        "prompt": "Which fruit is in the box?",
        "enable_think": False,
        "max_tokens": 64,
        "max_turns": 2,
        "max_actions_per_turn": 1,
        "max_actions_all_turns": 1,
        "format_penalty": 0.0,
        "action_separator": None,
        "action_decoding": "constrained",
        "tools": ["python"],
        "max_tool_calls": 1,
    },
    "env_config": {},
}


def test_the_answer_needs_the_tool():
    """The hidden fruit is spread over all four and the tool prints exactly it."""
    from grl.tools import run_python

    assert {hidden_fruit(seed) for seed in range(40)} == set(FRUITS)
    for seed in (3, 100003):
        assert run_python(reveal_code(seed)).output.split() == [hidden_fruit(seed)] * REPEATS


@pytest.mark.learning
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["as_is", "advantage_sign_flipped"])
def test_ppo_learns_to_call_the_tool(tmp_path, monkeypatch, ray_runtime, sign):
    from grl.trainer.agent_trainer import AgentTrainer

    multiply_advantages(monkeypatch, sign)
    grl.envs.register("hidden_fruit", HiddenFruitEnv)
    grl.agents.register("hiddenFruitAgent", "hidden_fruit")
    steps = 12
    cfg = small_run_config(
        tmp_path,
        "hidden_fruit",
        TASK,
        max_response_length=64,
        validation_groups=16,
        **{
            "algorithm.adv_estimator": "grpo",
            "critic.enable": False,
            "ppo_mini_batch_size": 32,
            "micro_batch_size_per_gpu": 16,
            "total_training_steps": steps,
            "test_freq": steps,
            "rollout.use_turn_scores": False,
            "rollout.agent_group_num": "[8]",
            "actor_rollout_ref.actor.optim.lr": 3e-3,
        },
    )
    AgentTrainer.from_config(cfg).fit()
    history = {r["step"]: r for r in read_jsonl(tmp_path / "run" / METRICS_FILE)}
    before, after = history[0]["val-env/hidden_fruit/success"], history[steps]["val-env/hidden_fruit/success"]
    calls = history[steps]["val-env/hidden_fruit/tool_calls"]
    train = [
        (
            round(history[s]["train/hidden_fruit/success"], 2),
            round(history[s]["train/hidden_fruit/tool_calls"], 2),
        )
        for s in sorted(history)
        if s > 0
    ]
    print(
        f"sign {sign:+.0f}: greedy validation success {before:.3f} -> {after:.3f}, tool calls {calls:.2f}; "
        f"training (success, tool calls) {train}"
    )
    assert all(history[s]["train/hidden_fruit/tool_errors"] == 0.0 for s in history if s > 0)
    learned = after >= 0.75 and calls >= 0.9
    assert learned == (sign > 0), (before, after, calls, train)
