"""CPU end to end: the tiny model on two FSDP2 ranks over gloo.

Three runs share one Ray runtime:
  A  trains 2 steps without interruption (validation, a checkpoint per step, HF export);
  B  is the same run, but a worker is killed after step 1: it must stop with a
     message naming the worker and the checkpoint to resume from;
  C  reruns B with resume_mode=auto: it continues from step 1, and its step 2
     equals A's step 2 in every deterministic metric.
"""

import json

import pytest
import ray
from omegaconf import OmegaConf

from grl.config import load_config
from grl.run_plan import build_run
from grl.tracking import METRICS_FILE, read_jsonl
from grl.trainer import RunAborted, run
from grl.trainer.agent_trainer import AgentTrainer

# Metrics that depend only on the data and the weights (timings and throughput excluded).
DETERMINISTIC = (
    "reward/mean",
    "reward/std",
    "response_length/mean",
    "actor/pg_loss",
    "actor/entropy",
    "actor/pg_clipfrac",
    "actor/ppo_kl",
    "actor/grad_norm",
    "critic/vf_loss",
    "critic/grad_norm",
    "critic/advantages/mean",
    "critic/returns/mean",
    "critic/values/mean",
    "train/simpleSokobanAgent/format_ok",
    "val-env/simpleSokobanAgent/success",
    "val-env/simpleSokobanAgent/response_length",
)


def config(tmp_path, name, **over):
    overrides = {
        "model_path": "tiny",
        "n_gpus_per_node": 2,
        "trainer.device": "cpu",
        "max_response_length": 12,
        "actor_rollout_ref.rollout.name": "hf",
        "rollout.agent_group_num": "[2]",
        "rollout.agent_group_size": "[2]",
        "rollout.validation_agent_group_num": "[2]",
        "rollout.validation_agent_group_size": "[1]",
        "simpleSokobanAgent.agent_config.max_turns": 2,
        "ppo_mini_batch_size": 2,
        "micro_batch_size_per_gpu": 1,
        "total_training_steps": 2,
        "test_freq": 2,
        "save_freq": 1,
        "trainer.logger": "[jsonl]",
        "trainer.export_hf": True,
        "trainer.run_dir": str(tmp_path / name / "run"),
        "trainer.default_local_dir": str(tmp_path / name / "ckpt"),
        "actor_rollout_ref.model.enable_gradient_checkpointing": False,
        "critic.model.enable_gradient_checkpointing": False,
        "actor_rollout_ref.actor.optim.lr": 1e-3,
        "critic.optim.lr": 1e-3,
    }
    overrides.update(over)
    return load_config([f"{k}={v}" for k, v in overrides.items()])


def by_step(run_dir):
    return {r["step"]: r for r in read_jsonl(run_dir / METRICS_FILE)}


@pytest.mark.slow
def test_train_checkpoint_kill_and_resume(tmp_path, ray_runtime, capsys):
    # A: uninterrupted
    cfg_a = config(tmp_path, "a", resume_mode="disable")
    AgentTrainer.from_config(cfg_a).fit()
    a_dir = tmp_path / "a"
    report = capsys.readouterr().out
    assert f"run folder   {a_dir / 'run'}" in report and f"checkpoints  {a_dir / 'ckpt'}" in report
    assert (
        "device       cpu x 2 rank(s), engine hf" in report
        and "training     simpleSokobanAgent (2x2)" in report
    )
    finished = [line for line in report.splitlines() if line.startswith("finished simpleSokobanAgent:")]
    assert (
        len(finished) == 1
        and "at step 0" in finished[0]
        and "last" in finished[0]
        and "at step 2" in finished[0]
    )
    assert f"HF export    {a_dir / 'ckpt' / 'hf_actor'}" in report
    assert f"checkpoint   {a_dir / 'ckpt' / 'global_step_2'}" in report
    history = by_step(a_dir / "run")
    assert sorted(history) == [0, 1, 2]
    assert (
        "val-env/simpleSokobanAgent/success" in history[0]
        and "val-env/simpleSokobanAgent/success" in history[2]
    )
    assert history[1]["actor/grad_norm"] > 0 and history[1]["critic/vf_loss"] > 0
    grl_names = [
        "train/simpleSokobanAgent/success",
        "timing_s/gen",
        "timing_s/gen_engine",
        "timing_s/gen_env",
        "timing_s/gen_other",
        "timing_s/adv",
        "timing_s/testing",
        "timing_per_token_ms/gen",
        "timing_per_token_ms/update_actor",
        "perf/throughput",
        "perf/time_per_step",
        "perf/max_memory_allocated_gb",
        "perf/critic/max_memory_allocated_gb",
        "perf/cpu_memory_used_gb",
        "perf/mfu/actor",  # on CPU against the ranks' own measured matmul peak (grl/workers/peak.py)
        "critic/score/mean",
        "critic/vf_explained_var",
        "prompt_length/mean",
        "response_length/clip_ratio",
        "val-env/response_length",
    ]
    assert [n for n in grl_names if n not in history[2]] == []
    assert 0 < history[2]["perf/mfu/actor"] < float("inf")
    split = sum(history[2][f"timing_s/gen_{part}"] for part in ("engine", "env", "other"))
    assert (
        split == pytest.approx(history[2]["timing_s/gen"], rel=1e-6) and history[2]["timing_s/gen_engine"] > 0
    )
    assert {p.name for p in (a_dir / "ckpt").iterdir()} >= {
        "global_step_1",
        "global_step_2",
        "latest",
        "hf_actor",
    }
    assert (a_dir / "ckpt" / "latest").read_text().strip() == "global_step_2"
    assert OmegaConf.load(a_dir / "run" / "config.yaml").model_path == "tiny"
    assert "git_sha" in json.loads((a_dir / "run" / "run_info.json").read_text())
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(a_dir / "ckpt" / "hf_actor")
    assert exported.config.num_hidden_layers == 2

    # val_only: resume A's last checkpoint, validate once, exit without training, in A's own run folder,
    # whose history and config stay as A left them
    a_records = {name: (a_dir / "run" / name).read_bytes() for name in (METRICS_FILE, "config.yaml")}
    cfg_val = config(tmp_path, "a", resume_mode="auto", **{"trainer.val_only": True})
    validator = AgentTrainer.from_config(cfg_val)
    assert validator.critic is None  # nothing trains, so no critic starts (A's critic stays in its folder)
    validator.fit()
    val_report = capsys.readouterr().out
    assert (
        f"grl-train: resumed from {a_dir / 'ckpt' / 'global_step_2'} (step 2); trainer.val_only" in val_report
    )
    assert f"metrics      {a_dir / 'run' / 'val_only' / METRICS_FILE}" in val_report
    assert {name: (a_dir / "run" / name).read_bytes() for name in a_records} == a_records
    only = by_step(a_dir / "run" / "val_only")
    assert sorted(only) == [2] and "val-env/simpleSokobanAgent/success" in only[2]
    assert not any(k.startswith("actor/") for k in only[2])
    assert (a_dir / "ckpt" / "latest").read_text().strip() == "global_step_2"

    # B: a worker dies after step 1 has been checkpointed
    def kill_after_step_1(trainer, step, metrics, batch):
        if step == 1:
            ray.kill(trainer.actor.workers[1], no_restart=True)

    cfg_b = config(tmp_path, "b", resume_mode="auto")
    with pytest.raises(RunAborted) as info:
        AgentTrainer.from_config(cfg_b, hooks=[kill_after_step_1]).fit()
    message = str(info.value)
    assert "actor rank 1" in message and "global_step_1" in message and "resume_mode=auto" in message
    b_dir = tmp_path / "b"
    assert (b_dir / "ckpt" / "latest").read_text().strip() == "global_step_1"

    # C: resume B; its step 2 is A's step 2
    capsys.readouterr()
    AgentTrainer.from_config(cfg_b).fit()
    first_line = capsys.readouterr().out.splitlines()[0]
    assert (
        first_line
        == f"grl-train: resumed from {b_dir / 'ckpt' / 'global_step_1'} (step 1): 1 of 2 steps left"
    )
    resumed = by_step(b_dir / "run")
    assert sorted(resumed) == [0, 1, 2]
    assert (b_dir / "ckpt" / "latest").read_text().strip() == "global_step_2"
    compared = [k for k in DETERMINISTIC if k in history[2]]
    assert len(compared) >= 10, compared
    for key in compared:
        assert resumed[2][key] == pytest.approx(history[2][key], rel=1e-6, abs=1e-9), key

    # C again, as grl-train runs it: nothing is left to train; one line before any worker starts, and
    # neither the metrics nor the checkpoint change
    run(build_run(cfg_b))
    assert capsys.readouterr().out.startswith(
        f"grl-train: nothing left to train: {b_dir / 'ckpt' / 'global_step_2'} is step 2"
    )
    assert by_step(b_dir / "run") == resumed


@pytest.mark.slow
def test_lora_gigpo_run_resumes_to_equal_metrics(tmp_path, ray_runtime):
    """A LoRA policy trained with GiGPO and a KL loss (the reference is the base model with
    the adapter off): resumed from the uninterrupted run's adapter-only checkpoint of step 1
    (trainer.resume_mode=<folder>), its step 2 is that run's; the export is a merged model plus the
    adapter. (test_train_checkpoint_kill_and_resume resumes a run a killed worker stopped.)"""
    from transformers import AutoModelForCausalLM

    from grl.workers.sharded import saved_names

    lora = {
        "actor_rollout_ref.model.lora_rank": 4,
        "actor_rollout_ref.model.lora_alpha": 8,
        "actor_rollout_ref.actor.optim.lr": 0.02,
        "actor_rollout_ref.actor.use_kl_loss": True,
        "algorithm.adv_estimator": "gigpo",
        "algorithm.gamma": 0.9,
        "critic.enable": False,
    }

    AgentTrainer.from_config(config(tmp_path, "a", resume_mode="disable", **lora)).fit()
    history = by_step(tmp_path / "a" / "run")
    step_1 = tmp_path / "a" / "ckpt" / "global_step_1"
    saved = saved_names(step_1 / "actor")["model"]
    assert saved and all(".lora_" in k for k in saved)
    AgentTrainer.from_config(config(tmp_path, "b", resume_mode=str(step_1), **lora)).fit()
    resumed = by_step(tmp_path / "b" / "run")
    assert history[1]["actor/grad_norm"] > 0 and "actor/kl_loss" in history[1]
    compared = [k for k in DETERMINISTIC + ("actor/kl_loss",) if k in history[2]]
    assert len(compared) >= 8, compared
    for key in compared:
        assert resumed[2][key] == pytest.approx(history[2][key], rel=1e-6, abs=1e-9), key
    hf = tmp_path / "a" / "ckpt" / "hf_actor"
    assert AutoModelForCausalLM.from_pretrained(hf).config.num_hidden_layers == 2
    assert (hf / "adapter" / "adapter_config.json").exists()


@pytest.mark.slow
def test_export_best_holds_the_actor_of_the_best_validation(tmp_path, ray_runtime, capsys):
    """trainer.export_best: the HF folder holds the weights of the step whose validation scored
    highest (a tie to the later step), not the last step's. The real validation runs; its success is
    then replaced by a script (the tiny model scores 0 at every step), so that best and last differ."""
    from safetensors.torch import load_file

    scripted = {1: 0.5, 2: 0.75, 3: 0.25}

    class ScriptedScores(AgentTrainer):
        def validate(self):
            metrics = super().validate()
            metrics["val-env/simpleSokobanAgent/success"] = scripted[self.global_step]
            return metrics

    def keep_weights(trainer, step, metrics, batch):
        trainer.actor.export_hf(str(tmp_path / f"step_{step}"))

    cfg = config(
        tmp_path,
        "best",
        resume_mode="disable",
        n_gpus_per_node=1,
        total_training_steps=3,
        test_freq=1,
        save_freq=-1,
        **{
            "trainer.export_best": True,
            "trainer.val_before_train": False,
            "critic.enable": False,
            "algorithm.adv_estimator": "grpo",
        },
    )
    ScriptedScores.from_config(cfg, hooks=[keep_weights]).fit()
    best = max(scripted, key=lambda s: (scripted[s], s))
    weights = {name: load_file(tmp_path / name / "model.safetensors") for name in ("step_2", "step_3")}
    exported = load_file(tmp_path / "best" / "ckpt" / "hf_actor" / "model.safetensors")
    assert best == 2 and all(exported[k].equal(weights["step_2"][k]) for k in exported)
    assert not all(exported[k].equal(weights["step_3"][k]) for k in exported)
    assert "(the actor of step 2, the best validation" in capsys.readouterr().out
    state = json.loads((tmp_path / "best" / "ckpt" / "global_step_3" / "trainer_state.json").read_text())
    assert state["best_validation"] == [2, 0.75]
