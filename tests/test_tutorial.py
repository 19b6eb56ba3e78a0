"""docs/TUTORIAL.md: its first-hour script runs as written (train, plot, play, serve and query), and its
example, a new env in one file plus one YAML block, played through the agent's text interface by a solver
that cannot be wrong, and trained for a step."""

import copy
import functools
import json
import math
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

import grl.agents
from grl.config import load_config, task_instance

TASK = "guessNumberAgent"
ROOT = Path(__file__).resolve().parents[1]


def first_hour_script() -> str:
    """The one bash block of the tutorial's first-hour section."""
    section = (
        (ROOT / "docs" / "TUTORIAL.md").read_text().split("## 0. The first hour", 1)[1].split("\n## ", 1)[0]
    )
    (script,) = re.findall(r"```bash\n(.*?)```", section, re.S)
    return script


@pytest.mark.slow
def test_the_first_hour_runs_as_written(tmp_path):
    with socket.socket() as probe:  # a port free now, for the script's server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "first-hour"
    script = subprocess.Popen(
        ["bash", "-e", "-c", first_hour_script()],
        cwd=ROOT,
        env={**os.environ, "OUT": str(out), "PORT": str(port)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the server it starts ends with it, whatever happens here
    )
    try:
        stdout, stderr = script.communicate(timeout=900)
    finally:
        try:
            os.killpg(script.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert script.returncode == 0, stderr[-3000:]
    lines = stdout.splitlines()
    # 1. trained: one step logged, the checkpoint and the export written
    assert any(line.startswith("step 1/1 | ") for line in lines), stdout
    assert (out / "ckpt" / "hf_actor" / "config.json").is_file()
    assert [r["step"] for r in map(json.loads, (out / "run" / "metrics.jsonl").read_text().splitlines())] == [
        0,
        1,
    ]
    # 2. plotted: grl plot prints the picture it drew
    assert str(out / "run" / "curves.png") in lines and (out / "run" / "curves.png").stat().st_size > 10_000
    # 3. played: the three piped replies, each stepped
    assert "task tetrisAgent_gap_dim_4, seed 1" in stdout and stdout.count("=> reward") >= 1
    # 4. served and queried: an OpenAI chat completion, with the token ids the engine sampled
    reply = json.loads(next(line for line in reversed(lines) if line.startswith("{")))
    assert reply["object"] == "chat.completion" and isinstance(reply["choices"][0]["message"]["content"], str)
    assert reply["usage"]["completion_tokens"] >= 1


@functools.cache
def tutorial_block(*overrides):
    """The task block of the composed config, composed once per set of overrides (a composition takes ~0.4
    s)."""
    return task_instance(
        load_config([f"rollout.training=[{TASK}]", f"rollout.validation=[{TASK}]", *overrides]), TASK
    )


def tutorial_agent(*overrides):
    return grl.agents.make_agent(TASK, copy.deepcopy(tutorial_block(*overrides)))


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


@pytest.mark.slow
def test_the_tutorial_env_trains_for_a_step(tmp_path, ray_runtime):
    from grl.tracking import METRICS_FILE, read_jsonl
    from grl.trainer.agent_trainer import AgentTrainer

    overrides = {
        "model_path": "tiny",
        "n_gpus_per_node": 1,
        "trainer.device": "cpu",
        "actor_rollout_ref.rollout.name": "hf",
        "rollout.training": f"[{TASK}]",
        "rollout.validation": f"[{TASK}]",
        "rollout.agent_group_num": "[2]",
        "rollout.agent_group_size": "[2]",
        "rollout.validation_agent_group_num": "[2]",
        "rollout.validation_agent_group_size": "[1]",
        f"{TASK}.agent_config.max_turns": 2,
        "max_response_length": 8,
        "ppo_mini_batch_size": 4,
        "micro_batch_size_per_gpu": 4,
        "total_training_steps": 1,
        "test_freq": 1,
        "save_freq": -1,
        "trainer.val_before_train": False,
        "trainer.export_hf": False,
        "trainer.logger": "[jsonl]",
        "resume_mode": "disable",
        "trainer.run_dir": str(tmp_path / "run"),
        "trainer.default_local_dir": str(tmp_path / "ckpt"),
        "actor_rollout_ref.model.enable_gradient_checkpointing": False,
        "critic.model.enable_gradient_checkpointing": False,
    }
    cfg = load_config([f"{k}={v}" for k, v in overrides.items()])
    AgentTrainer.from_config(cfg).fit()
    (step,) = [r for r in read_jsonl(tmp_path / "run" / METRICS_FILE) if r["step"] == 1]
    # Episodes of one or two turns (max_turns 2), at most one guess a turn.
    turns, actions = step[f"train/{TASK}/num_turns"], step[f"train/{TASK}/num_actions"]
    assert 1 <= turns <= 2 and 0 <= actions <= turns, (turns, actions)
    assert 0 <= step[f"val-env/{TASK}/success"] <= 1
    # The update ran: a finite policy loss, a critic that had something to fit, gradients that moved.
    assert math.isfinite(step["actor/pg_loss"])
    assert math.isfinite(step["critic/vf_loss"]) and step["critic/vf_loss"] > 0
    assert math.isfinite(step["actor/grad_norm"]) and step["actor/grad_norm"] > 0


def test_the_tutorials_program_plays_through_the_gateway_and_a_perfect_player_wins():
    """docs/TUTORIAL.md's agent program (grl/gateway/examples.py) through the gateway with the tiny model,
    and the same program against a client that answers by binary search: it always wins in time."""
    import types

    from grl.engines import SamplingParams, make_engine
    from grl.gateway.contract import ProgramTask
    from grl.gateway.examples import guess_number
    from grl.gateway.programs import ProgramRunner
    from grl.rollout import TaskSpec

    cfg = load_config(["rollout.training=[guessNumberProgram]", "rollout.validation=[guessNumberProgram]"])
    block = task_instance(cfg, "guessNumberProgram")
    engine = make_engine("hf", "tiny", device="cpu", grammar=True)
    runner = ProgramRunner(engine, engine.tokenizer, context=2048, max_response_length=16)
    try:
        episodes, metrics = runner.run(
            [TaskSpec("guessNumberProgram", grl.agents.task_from_block("guessNumberProgram", block), 2, 2)],
            0,
            0,
            SamplingParams(temperature=1.0, seed=0),
        )
    finally:
        runner.close()
        engine.shutdown()
    assert metrics["gateway/program_errors"] == 0 and metrics["gateway/prefix_breaks"] == 0
    assert all(e.error is None and 1 <= len(e.turns) <= 7 and "guesses" in e.metrics for e in episodes)

    class BinarySearch:  # the `openai` client's shape, answering from the program's own feedback
        def __init__(self):
            self.low, self.high = 1, 100
            self.chat = types.SimpleNamespace(completions=types.SimpleNamespace(create=self.create))

        def create(self, model, messages, max_tokens):
            last = messages[-1]["content"]
            if last == "Higher.":
                self.low = self.guess + 1
            elif last == "Lower.":
                self.high = self.guess - 1
            self.guess = (self.low + self.high) // 2
            message = types.SimpleNamespace(content=f"{self.guess}")
            return types.SimpleNamespace(choices=[types.SimpleNamespace(message=message)])

    for seed in range(50):
        result = guess_number(
            BinarySearch(), ProgramTask("g", seed, 0, 0, {"max_number": 100, "max_guesses": 7})
        )
        assert result["success"] == 1.0 and result["guesses"] <= 7, (seed, result)


def readme_commands(program: str) -> list[list[str]]:
    """Every command of the README's bash blocks that runs `program`, continuation lines joined."""
    import shlex

    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    lines = [line.split(" #", 1)[0] for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [shlex.split(line) for line in lines if line.split(" ", 1)[0].endswith(program)]


def test_the_readme_trains_webshop_and_bird_on_the_data_it_installs_first():
    trained = {}
    for argv in readme_commands("grl-train"):
        tasks = [a.split("=", 1)[1] for a in argv if a.startswith("rollout.training=")]
        if tasks and tasks[0] in ("[webshopAgent]", "[birdAgent]"):
            trained[tasks[0].strip("[]")] = load_config(argv[1:])
    assert sorted(trained) == ["birdAgent", "webshopAgent"]
    installs = [argv[1:] for argv in readme_commands("scripts/install_dataset.sh")]
    assert ["--webshop", "--small"] in installs and ["--bird"] in installs
    webshop = task_instance(trained["webshopAgent"], "webshopAgent")["env_config"]
    assert webshop["products_path"].endswith(
        "data/webshop/items_shuffle_1000.json"
    )  # what --webshop --small writes
    bird = task_instance(trained["birdAgent"], "birdAgent")["env_config"]
    assert bird["split"] == "train" and bird["dataset_path"].endswith(
        "data/bird/{split}.jsonl"
    )  # --bird: train, dev
