"""docs/TUTORIAL.md's example: a new env in one file plus one YAML block, played through the agent's
text interface by a solver that cannot be wrong, and trained for a step."""

import math
import re

import pytest

import grl.agents
from grl.config import load_config, task_instance

TASK = "guessNumberAgent"


def tutorial_agent(*overrides):
    cfg = load_config([f"rollout.training=[{TASK}]", f"rollout.validation=[{TASK}]", *overrides])
    return grl.agents.make_agent(TASK, task_instance(cfg, TASK))


def bounds(message: str) -> tuple[int, int]:
    low, high = re.findall(r"between (\d+) and (\d+)", message)[-1]
    return int(low), int(high)


@pytest.mark.parametrize("seed", range(25))
def test_binary_search_through_the_agent_always_wins(seed):
    agent = tutorial_agent()
    messages = agent.reset(seed)
    limit = math.ceil(math.log2(100 + 1))
    for turn in range(limit):
        low, high = bounds(agent.messages[-1]["content"])
        step = agent.step(f"<answer>{(low + high) // 2}</answer>")
        if step.done:
            break
    assert step.done and step.info["success"], agent.messages[-1]
    assert agent.episode_metrics()["success"] == 1.0
    assert messages[0]["role"] == "system" and "whole number from 1 to 100" in messages[1]["content"]


def test_wrong_guesses_never_succeed_and_bad_replies_are_penalised():
    agent = tutorial_agent("guessNumberAgent.env_config.max_number=20")
    agent.reset(3)
    secret = agent.env.secret if hasattr(agent, "env") else None
    wrong = 1 if secret != 1 else 2
    rewards = []
    for _ in range(7):
        step = agent.step(f"<answer>{wrong}</answer>")
        rewards.append(step.reward)
        if step.done:
            break
    assert step.done and not step.info["success"]
    assert agent.episode_metrics()["success"] == 0.0

    agent.reset(3)
    assert agent.step("no tags, just chat").reward == pytest.approx(-0.1)
    assert agent.step("<answer>banana</answer>").reward == pytest.approx(-1.0 - 0.1)


def test_same_seed_same_secret():
    first, second = tutorial_agent(), tutorial_agent()
    assert first.reset(11) == second.reset(11)
    assert first.step("<answer>50</answer>").reward == second.step("<answer>50</answer>").reward


def test_the_tutorial_env_trains_for_a_step(tmp_path):
    pytest.importorskip("ray")
    from grl.tracking import METRICS_FILE, read_jsonl
    from grl.trainer.agent_trainer import AgentTrainer
    from grl.workers import init_ray

    overrides = {
        "model_path": "tiny", "n_gpus_per_node": 1, "trainer.device": "cpu", "actor_rollout_ref.rollout.name": "hf",
        "rollout.training": f"[{TASK}]", "rollout.validation": f"[{TASK}]",
        "rollout.agent_group_num": "[2]", "rollout.agent_group_size": "[2]",
        "rollout.validation_agent_group_num": "[2]", "rollout.validation_agent_group_size": "[1]",
        f"{TASK}.agent_config.max_turns": 2, "max_response_length": 8,
        "ppo_mini_batch_size": 4, "micro_batch_size_per_gpu": 4, "total_training_steps": 1,
        "test_freq": 1, "save_freq": -1, "trainer.val_before_train": False, "trainer.export_hf": False,
        "trainer.logger": "[jsonl]", "resume_mode": "disable",
        "trainer.run_dir": str(tmp_path / "run"), "trainer.default_local_dir": str(tmp_path / "ckpt"),
        "actor_rollout_ref.model.enable_gradient_checkpointing": False,
        "critic.model.enable_gradient_checkpointing": False,
    }
    cfg = load_config([f"{k}={v}" for k, v in overrides.items()])
    init_ray(None, num_cpus=2)
    try:
        AgentTrainer.from_config(cfg).fit()
    finally:
        import ray

        ray.shutdown()
    (step,) = [r for r in read_jsonl(tmp_path / "run" / METRICS_FILE) if r["step"] == 1]
    assert step[f"train/{TASK}/num_actions"] >= 0 and f"val-env/{TASK}/success" in step
    for name in ("actor/pg_loss", "critic/vf_loss", "actor/grad_norm"):
        assert step[name] is not None, name  # the update ran and gave finite numbers
