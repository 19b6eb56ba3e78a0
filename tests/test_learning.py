"""PPO must learn: a from-scratch tiny model on a three-round fruit game under valid-action decoding.

Each round the model picks one of four fruits (constrained decoding: every reply is one of them, so it
can fail only on the choice); the right one is a fruit the untrained model does not pick greedily, so
greedy validation success starts at zero and must reach 0.5 within eight updates. Two advantage paths
learn it: GRPO without a critic, and PPO with a critic (masked multi-turn GAE over the rounds' rewards,
each on its turn's last token); a third run plays the game as an OpenAI-client program through the
gateway, and a fourth as an OpenAI Agents SDK agent over its Responses API. Every learning test also
runs with the advantages negated, and must then not learn: each can fail. (A two-turn game rewarding
lowercase replies, the critic's test before, passed with its sign flipped on seed 42: two thirds of the
vocabulary are lowercase words, so any change of the greedy reply looked like learning.)

GRL_TEST_SEED (default 42, trainer.seed's) reseeds sampling and the training games, to check a margin on
other seeds (docs/DEVELOPMENT.md has the table).
"""

import functools
import math
import os
import re

import pytest
from omegaconf import OmegaConf

import grl.agents
import grl.envs
from grl.config import compose, validate
from grl.envs.base import Env, step_info
from grl.tracking import METRICS_FILE, read_jsonl

TOPICS = ("rain", "cats", "bread", "stars", "music", "roads", "trees", "ships")
SEED = int(os.environ.get("GRL_TEST_SEED", "42"))


def small_run_config(
    tmp_path, task: str, block: dict, max_response_length: int, validation_groups: int, **overrides
):
    """A short CPU run of the tiny model on one registered task, validated greedily before and after."""
    keys = {
        "model_path": "tiny",
        "n_gpus_per_node": 1,
        "trainer.device": "cpu",
        "actor_rollout_ref.rollout.name": "hf",
        "max_response_length": max_response_length,
        "rollout.training": f"[{task}]",
        "rollout.agent_group_num": "[4]",
        "rollout.agent_group_size": "[4]",
        "rollout.validation": f"[{task}]",
        "rollout.validation_agent_group_num": f"[{validation_groups}]",
        "rollout.validation_agent_group_size": "[1]",
        "save_freq": -1,
        "trainer.val_before_train": True,
        "trainer.export_hf": False,
        "trainer.logger": "[jsonl]",
        "resume_mode": "disable",
        "trainer.run_dir": str(tmp_path / "run"),
        "trainer.default_local_dir": str(tmp_path / "ckpt"),
        "actor_rollout_ref.model.enable_gradient_checkpointing": False,
        "actor_rollout_ref.actor.optim.lr": 3e-3,
        "actor_rollout_ref.actor.entropy_coeff": 0.0,
        "trainer.seed": SEED,
        **overrides,
    }
    cfg = compose([f"{k}={v}" for k, v in keys.items()])
    OmegaConf.set_struct(cfg, False)
    cfg[task] = block
    return validate(cfg)


def multiply_advantages(monkeypatch, sign: float) -> None:
    """Negate the advantages (sign -1): a test that learns must then fail."""
    import grl.trainer.transforms as transforms

    estimate = transforms.compute_advantage
    monkeypatch.setattr(
        transforms,
        "compute_advantage",
        lambda *a, **k: tuple(sign * x if i == 0 else x for i, x in enumerate(estimate(*a, **k))),
    )


def outcome(tmp_path, task: str, sign: float, last_step: int):
    """(history by step, greedy validation success at step 0 and at `last_step`), printed with the training
    curve."""
    history = {r["step"]: r for r in read_jsonl(tmp_path / "run" / METRICS_FILE)}
    before, after = history[0][f"val-env/{task}/success"], history[last_step][f"val-env/{task}/success"]
    train = [round(history[s][f"train/{task}/success"], 2) for s in sorted(history) if s > 0]
    print(
        f"sign {sign:+.0f}: greedy validation success {before:.3f} -> {after:.3f}; training success {train}"
    )
    return history, before, after


# ---------------------------------------------------------------- valid-action decoding

FRUITS = ("apple", "pear", "plum", "fig")


class FruitEnv(Env):
    """Three rounds; `wanted` is the right fruit in each; success when every round was right. Its
    valid actions are the four fruits, so under constrained decoding every reply is one of them:
    the model can fail only on the choice, never on the format."""

    wanted = "plum"

    def reset(self, seed: int) -> str:
        self.topic, self.round, self.right = TOPICS[seed % len(TOPICS)], 0, 0
        return self._state()

    def _state(self) -> str:
        return f"Round {self.round + 1} of 3 ({self.topic}). Pick a fruit."

    def valid_actions(self):
        return list(FRUITS)

    def step(self, action: str):
        ok = action.strip() == self.wanted
        self.right += ok
        self.round += 1
        done = self.round == 3
        return (
            self._state(),
            float(ok),
            done,
            step_info(
                success=done and self.right == 3,
                action_is_valid=action.strip() in FRUITS,
                action_is_effective=True,
            ),
        )


@functools.cache  # the untrained model and greedy decoding: the same answer for every test that asks
def first_greedy_choice() -> str:
    """The fruit the untrained tiny model picks greedily in round 1."""
    from grl.agents import task_from_block
    from grl.engines import SamplingParams, make_engine
    from grl.rollout import MultiTurnRollout, TaskSpec

    engine = make_engine("hf", "tiny", device="cpu")
    rollout = MultiTurnRollout(engine, engine.tokenizer, max_prompt_length=512, max_response_length=12)
    episode = rollout.run(
        [TaskSpec("fruit", task_from_block("fruit", FRUIT_TASK), 1, 1)], 0, SamplingParams(greedy=True)
    ).episodes[0]
    engine.shutdown()
    return episode.turns[0].info["actions"][0]


FRUIT_TASK = {
    "agent_type": "fruitAgent",
    "agent_config": {
        "system_prompt": "You pick fruit.",
        "prompt": "Pick the right fruit each round.",
        "enable_think": False,
        "max_tokens": 12,
        "max_turns": 3,
        "max_actions_per_turn": 1,
        "max_actions_all_turns": 3,
        "format_penalty": 0.0,
        "action_separator": None,
        "action_decoding": "constrained",
    },
    "env_config": {},
}


# The critic's path: masked multi-turn GAE over the rounds' rewards, each on its turn's last token.
WITH_CRITIC = {
    "algorithm.adv_estimator": "gae",
    "critic.enable": True,
    "rollout.use_turn_scores": True,
    "critic.model.enable_gradient_checkpointing": False,
    "critic.optim.lr": 3e-3,
    "algorithm.lam": 0.95,
}
ESTIMATORS = {"grpo": {"algorithm.adv_estimator": "grpo", "critic.enable": False}, "gae_critic": WITH_CRITIC}


def constrained_config(tmp_path, estimator: str = "grpo"):
    grl.envs.register("fruit", FruitEnv)
    grl.agents.register("fruitAgent", "fruit")
    return small_run_config(
        tmp_path,
        "fruit",
        FRUIT_TASK,
        max_response_length=12,
        validation_groups=8,
        **{
            **ESTIMATORS[estimator],
            "ppo_mini_batch_size": 16,
            "micro_batch_size_per_gpu": 16,
            "total_training_steps": 8,
            "test_freq": 8,
        },
    )


@pytest.mark.learning
@pytest.mark.parametrize("estimator", sorted(ESTIMATORS))
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["as_is", "advantage_sign_flipped"])
def test_ppo_learns_under_valid_action_decoding(tmp_path, monkeypatch, ray_runtime, sign, estimator):
    """Greedy validation success rises from 0 to at least 0.5, every reply is a valid action, with GRPO
    and with the critic's GAE; with the advantages negated the same run must not learn (the test can fail)."""
    from grl.trainer.agent_trainer import AgentTrainer

    multiply_advantages(monkeypatch, sign)
    cfg = constrained_config(tmp_path, estimator)
    # The right fruit is one the untrained model does not pick, so greedy success starts at 0.
    monkeypatch.setattr(FruitEnv, "wanted", next(f for f in FRUITS if f != first_greedy_choice()))
    AgentTrainer.from_config(cfg).fit()
    history, before, after = outcome(tmp_path, "fruit", sign, 8)
    assert all(
        history[s]["train/fruit/action_is_valid"] == 1.0 and history[s]["train/fruit/format_ok"] == 1.0
        for s in history
        if s > 0
    )
    assert before == 0.0
    assert (after >= 0.5) == (sign > 0), (before, after)
    if estimator == "gae_critic":  # the critic trained beside the actor
        assert all(
            math.isfinite(history[s]["critic/vf_loss"]) and history[s]["critic/grad_norm"] > 0
            for s in history
            if s > 0
        )


# ---------------------------------------------------------------- an agent program through the gateway


# The fruit game written against the `openai` client, and as an OpenAI Agents SDK agent (openai-agents,
# unmodified).
FRUIT_PROGRAMS = {
    "openai_client": "tests.gateway.programs:fruit_picker",
    "agents_sdk": "tests.gateway.agents_sdk_programs:fruit_picker",
}


def program_fruit_task(wanted: str, program: str) -> dict:
    """The fruit game as one of `FRUIT_PROGRAMS`."""
    return {
        "agent_type": "program",
        "agent_config": {"program": FRUIT_PROGRAMS[program], "max_tokens": 12, "max_turns": 3},
        "env_config": {"wanted": wanted},
    }


@functools.cache
def program_greedy_choice(program: str) -> str:
    """The fruit the untrained tiny model picks greedily in round 1 of the program's conversation."""
    from grl.agents import task_from_block
    from grl.engines import SamplingParams, make_engine
    from grl.gateway.programs import ProgramRunner
    from grl.rollout import TaskSpec

    engine = make_engine("hf", "tiny", device="cpu", grammar=True)
    runner = ProgramRunner(engine, engine.tokenizer, context=1024, max_response_length=12)
    task = TaskSpec(
        "fruitProgram", task_from_block("fruitProgram", program_fruit_task("plum", program)), 1, 1
    )
    try:
        [episode], _ = runner.run([task], 0, 0, SamplingParams(greedy=True))
    finally:
        runner.close()
        engine.shutdown()
    first_reply = next(m for m in episode.messages if m["role"] == "assistant")["content"]
    return re.sub(r"</?answer>", "", first_reply).strip()


@pytest.mark.learning
@pytest.mark.parametrize("program", sorted(FRUIT_PROGRAMS))
@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["as_is", "advantage_sign_flipped"])
def test_ppo_learns_through_the_gateway_the_fruit_game_written_as_a_program(
    tmp_path, monkeypatch, ray_runtime, sign, program
):
    """The valid-action test above with its agent written against the `openai` client, and with the
    Agents SDK over the Responses API: the trainer starts the gateway, the program's calls are its
    episodes, and the same run learns (and, with the advantages negated, does not)."""
    import httpx

    from grl.trainer.agent_trainer import AgentTrainer

    multiply_advantages(monkeypatch, sign)
    wanted = next(f for f in FRUITS if f != program_greedy_choice(program))
    cfg = small_run_config(
        tmp_path,
        "fruitProgram",
        program_fruit_task(wanted, program),
        max_response_length=12,
        validation_groups=8,
        **{
            "algorithm.adv_estimator": "grpo",
            "critic.enable": False,
            "ppo_mini_batch_size": 16,
            "micro_batch_size_per_gpu": 16,
            "total_training_steps": 8,
            "test_freq": 8,
        },
    )
    trainer = AgentTrainer.from_config(cfg)
    gateway = trainer.rollout.programs.url  # started by the trainer, on this machine only
    assert gateway.startswith("http://127.0.0.1:")
    trainer.fit()
    with pytest.raises(httpx.ConnectError):  # and stopped with it
        httpx.get(f"{gateway}/v1/models", timeout=5)
    history, before, after = outcome(tmp_path, "fruitProgram", sign, 8)
    assert all(
        history[s]["gateway/calls"] == 48 and history[s]["gateway/prefix_breaks"] == 0
        for s in history
        if s > 0
    )
    # The update scores exactly the sampled ids under the distribution they were drawn from (one optimizer
    # step a rollout, so the scoring weights are the sampling ones): the engine's log-probs agree.
    assert all(history[s]["training/rollout_logprob_diff_max"] < 1e-3 for s in history if s > 0)
    assert before == 0.0
    assert (after >= 0.5) == (sign > 0), (before, after)
