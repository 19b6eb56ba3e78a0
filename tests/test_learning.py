"""PPO must learn: a from-scratch tiny model on a trivial two-turn word game.

The game (a lipogram): every turn the model must reply without the letter
"e". A random model's token avoids it about half the time, so a clean reply of
three tokens happens by chance (~12% a turn, ~1.5% an episode), and greedy
validation starts near zero. PPO with a critic (masked multi-turn GAE) must
raise the greedy validation success well above its start within a few
minutes. A wrong sign, a shifted loss mask or broken advantages push the
policy the wrong way or nowhere, and the test fails.
"""

import pytest
from omegaconf import OmegaConf

import grl.agents
import grl.envs
from grl.agents.tasks import TaskHooks
from grl.config import compose, validate
from grl.envs.base import Env, step_info
from grl.tracking import METRICS_FILE, read_jsonl

ray = pytest.importorskip("ray")

TOPICS = ("rain", "cats", "bread", "stars", "music", "roads", "trees", "ships")


class LipogramEnv(Env):
    """Reward 1 for a turn whose reply has no letter e; success when every turn was clean."""

    def __init__(self, rounds: int = 2):
        self.rounds = rounds

    def reset(self, seed: int) -> str:
        self.topic = TOPICS[seed % len(TOPICS)]
        self.turn, self.clean = 0, True
        return self._state()

    def _state(self) -> str:
        return f"Round {self.turn + 1} of {self.rounds}. Topic: {self.topic}. Write without the letter e."

    def step(self, action: str):
        ok = "e" not in action.lower()
        self.clean = self.clean and ok
        self.turn += 1
        done = self.turn >= self.rounds
        return self._state(), float(ok), done, step_info(success=done and self.clean, action_is_valid=True,
                                                         action_is_effective=ok)


class WholeReplyHooks(TaskHooks):
    """The whole reply is the action (a random model never writes answer tags)."""

    def fallback_answer(self, reply: str):
        return reply

    def actions(self, answer, separator):
        return [answer or ""]


TASK = {
    "agent_type": "lipogramAgent",
    "agent_config": {"system_prompt": "You play a word game.", "prompt": "Reply with a few words.",
                     "enable_think": False, "max_tokens": 3, "max_turns": 2, "max_actions_per_turn": 1,
                     "max_actions_all_turns": 2, "format_penalty": 0.0, "action_separator": None},
    "env_config": {"rounds": 2},
}


def learning_config(tmp_path):
    grl.envs.register("lipogram", LipogramEnv)
    grl.agents.register("lipogramAgent", "lipogram", WholeReplyHooks())
    overrides = {
        "model_path": "tiny", "n_gpus_per_node": 1, "trainer.device": "cpu",
        "actor_rollout_ref.rollout.name": "hf", "max_response_length": 3,
        "rollout.training": "[lipogram]", "rollout.agent_group_num": "[8]", "rollout.agent_group_size": "[4]",
        "rollout.validation": "[lipogram]", "rollout.validation_agent_group_num": "[32]",
        "rollout.validation_agent_group_size": "[1]",
        "rollout.use_turn_scores": True,
        "ppo_mini_batch_size": 16, "micro_batch_size_per_gpu": 16, "total_training_steps": 20,
        "test_freq": 20, "save_freq": -1, "trainer.val_before_train": True, "trainer.export_hf": False,
        "trainer.logger": "[jsonl]", "resume_mode": "disable",
        "trainer.run_dir": str(tmp_path / "run"), "trainer.default_local_dir": str(tmp_path / "ckpt"),
        "actor_rollout_ref.model.enable_gradient_checkpointing": False,
        "critic.model.enable_gradient_checkpointing": False,
        "actor_rollout_ref.actor.optim.lr": 3e-3, "critic.optim.lr": 3e-3,
        "actor_rollout_ref.actor.entropy_coeff": 0.0,
        "algorithm.lam": 0.95,
    }
    cfg = compose([f"{k}={v}" for k, v in overrides.items()])
    OmegaConf.set_struct(cfg, False)
    cfg.lipogram = TASK
    return validate(cfg)


def test_ppo_learns_a_trivial_multi_turn_task(tmp_path):
    from grl.trainer.agent_trainer import AgentTrainer
    from grl.workers import init_ray

    init_ray(None, num_cpus=2)
    cfg = learning_config(tmp_path)
    AgentTrainer.from_config(cfg).fit()
    history = {r["step"]: r for r in read_jsonl(tmp_path / "run" / METRICS_FILE)}
    before = history[0]["val-env/lipogram/success"]
    after = history[cfg.trainer.total_training_steps]["val-env/lipogram/success"]
    train = [history[s]["env/lipogram/success"] for s in sorted(history) if s > 0]
    print(f"greedy validation success {before:.3f} -> {after:.3f}; training success by step {train}")
    assert after >= before + 0.4, (before, after, train)
