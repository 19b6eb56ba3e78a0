"""scripts/logprob_gate.py, the check of gpu_smoke.sh's run, on fabricated metrics.jsonl files: it passes a
sound run whose largest gap is large (many tokens, a near-tie), and fails a run whose weights are wrong,
whose tail is wrong, or that logged nothing."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GATE = ROOT / "scripts" / "logprob_gate.py"
MEAN, P99, MAX = (f"training/rollout_logprob_diff_{stat}" for stat in ("mean", "p99", "max"))


def run_gate(tmp_path, records, *args):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return subprocess.run(
        [sys.executable, str(GATE), str(path), *args], capture_output=True, text=True, timeout=60
    )


def step(n, **gaps):
    return {"step": n, "perf/time_per_step": 30.0, **gaps}


def test_a_sound_run_with_one_far_token_passes(tmp_path):
    """A maximum of 2.5 nats failed the old gate (max <= 1 nat); the mean and p99 are those of a sound
    pair."""
    result = run_gate(
        tmp_path, [step(1, **{MEAN: 0.5, P99: 3.0}), step(2, **{MEAN: 0.03, P99: 0.4, MAX: 2.5})]
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1 and "step 2:" in result.stdout and result.stderr == ""


@pytest.mark.parametrize(
    "gaps, named",
    [
        ({MEAN: 1.7, P99: 6.0}, [MEAN, P99]),  # weights or buffers lost in the reload: every token moves
        ({MEAN: 0.06, P99: 1.4}, [P99]),  # a tail of tokens far apart, the mean still small
        ({MEAN: 0.15, P99: 0.8}, [MEAN]),
        ({MEAN: float("nan"), P99: 0.2}, [MEAN]),
    ],
)
def test_a_gap_above_its_limit_fails_in_one_line_naming_it(tmp_path, gaps, named):
    result = run_gate(tmp_path, [step(1, **{MEAN: 0.01, P99: 0.1}), step(2, **gaps)])
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert [key for key in (MEAN, P99) if f"{key} " in result.stderr] == named


def test_a_run_without_the_figures_fails(tmp_path):
    only_verl = step(
        2, **{"training/rollout_probs_diff_mean": 0.001, "training/rollout_probs_diff_max": 0.02}
    )
    for records in ([], [step(1, **{MEAN: 0.01, P99: 0.1})], [only_verl], [step(2, **{MEAN: 0.01})]):
        result = run_gate(tmp_path, records)
        assert result.returncode == 1 and "step 2 logged no" in result.stderr, records
    assert run_gate(tmp_path, [], "--step", "3").stderr.startswith("step 3 logged no")


@pytest.mark.slow  # one training step of the tiny model through Ray
def test_a_top_k_top_p_run_scores_each_token_under_the_set_it_was_drawn_from(tmp_path, ray_runtime):
    """A real step in fp32 with top_p 0.7 and top_k 5, free replies (Sokoban) and valid-action replies
    (BlocksWorld) side by side, the old-log-prob pass on (two mini-batches): the trainer scores each sampled
    token under the renormalised softmax over the engine's kept set (inside the grammar's), so the
    engine/trainer gap is fp32 noise, as without a filter; over the full softmax it was 9 nats."""
    from grl.config import load_config
    from grl.run_plan import RunPlan
    from grl.tracking import METRICS_FILE, read_jsonl
    from grl.trainer.agent_trainer import AgentTrainer

    tasks = ["simpleSokobanAgent", "blocksworldAgent_text"]
    overrides = {
        "model_path": "tiny",
        "n_gpus_per_node": 1,
        "trainer.device": "cpu",
        "actor_rollout_ref.model.dtype": "float32",
        "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.rollout.temperature": 0.9,
        "actor_rollout_ref.rollout.top_p": 0.7,
        "actor_rollout_ref.rollout.top_k": 5,
        # the reference scores the same tokens under the same sets
        "actor_rollout_ref.actor.use_kl_loss": True,
        "rollout.training": f"[{','.join(tasks)}]",
        "rollout.agent_group_num": "[1,1]",
        "rollout.agent_group_size": "[2,2]",
        "blocksworldAgent_text.agent_config.action_decoding": "constrained",
        **{f"{task}.agent_config.max_turns": 2 for task in tasks},
        "max_response_length": 24,
        "algorithm.adv_estimator": "grpo",
        "critic.enable": False,
        "ppo_mini_batch_size": 2,
        "micro_batch_size_per_gpu": 2,
        "total_training_steps": 1,
        "test_freq": -1,
        "save_freq": -1,
        "trainer.val_before_train": False,
        "trainer.export_hf": False,
        "trainer.logger": "[jsonl]",
        "resume_mode": "disable",
        "trainer.run_dir": str(tmp_path / "run"),
        "trainer.default_local_dir": str(tmp_path / "ckpt"),
        "actor_rollout_ref.model.enable_gradient_checkpointing": False,
    }
    cfg = load_config([f"{k}={v}" for k, v in overrides.items()])
    assert RunPlan.from_config(cfg).old_log_prob_pass(4)
    AgentTrainer.from_config(cfg).fit()
    metrics = tmp_path / "run" / METRICS_FILE
    (step,) = [r for r in read_jsonl(metrics) if r["step"] == 1]
    assert step[MEAN] <= 1e-5 and step[MAX] <= 1e-4, (step[MEAN], step[MAX])
    # The entropy is that of the same distributions: at most 5 ids each (the full softmax's is ~10 nats).
    assert 0 < step["actor/entropy"] <= math.log(5), step["actor/entropy"]
    gate = subprocess.run(
        [sys.executable, str(GATE), str(metrics), "--step", "1"], capture_output=True, text=True, timeout=60
    )
    assert gate.returncode == 0, gate.stderr
