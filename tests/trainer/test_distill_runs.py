"""On-policy distillation through `grl-train`, preflight included: a local teacher with opd alone, and a
served teacher (`grl serve` over HTTP) whose term is added to GRPO's advantages."""

import pytest

from grl import train
from grl.tracking import METRICS_FILE, read_jsonl

pytestmark = pytest.mark.slow  # two one-step trainer runs and a served model

TEACHER_METRICS = (
    "teacher/reverse_kl_per_token",
    "teacher/reverse_kl_per_turn",
    "teacher/log_prob_mean",
    "teacher/student_log_prob_mean",
    "teacher/failed_episodes",
    "timing_s/teacher",
)


def run(tmp_path, name, *overrides):
    code = train.main(
        [
            "model_path=tiny",
            "trainer.device=cpu",
            "actor_rollout_ref.model.dtype=float32",
            "actor_rollout_ref.rollout.name=hf",
            "max_response_length=10",
            "rollout.agent_group_num=[2]",
            "rollout.agent_group_size=[2]",
            "simpleSokobanAgent.agent_config.max_turns=2",
            "ppo_mini_batch_size=4",
            "micro_batch_size_per_gpu=2",
            "total_training_steps=1",
            "test_freq=-1",
            "trainer.val_before_train=false",
            "trainer.logger=[jsonl]",
            "trainer.export_hf=false",
            "critic.enable=false",
            f"trainer.run_dir={tmp_path / name / 'run'}",
            f"trainer.default_local_dir={tmp_path / name / 'ckpt'}",
            *overrides,
        ]
    )
    assert code == 0
    (step,) = [r for r in read_jsonl(tmp_path / name / "run" / METRICS_FILE) if r["step"] == 1]
    return step


def test_a_local_teacher_trains_the_student_with_opd_alone(tmp_path, ray_runtime):
    step = run(tmp_path, "local", "algorithm.adv_estimator=opd", "teacher.model_path=tiny")
    assert all(key in step for key in TEACHER_METRICS), sorted(k for k in step if "teacher" in k)
    # the student is its own teacher here: nothing to learn, to fp32 noise
    assert abs(step["teacher/reverse_kl_per_token"]) < 1e-4 and step["teacher/failed_episodes"] == 0
    assert abs(step["critic/advantages/max"]) < 1e-3 and abs(step["critic/advantages/min"]) < 1e-3


def test_a_served_teacher_adds_its_term_to_grpo(tmp_path, ray_runtime):
    from grl.gateway.serving import serve_args, serve_gateway
    from tests.gateway.served import serve

    gateway = serve_gateway(serve_args(["tiny", "--engine", "hf", "--dtype", "float32"]))
    with serve(gateway) as url:
        step = run(
            tmp_path,
            "served",
            "algorithm.adv_estimator=grpo",
            f"teacher.url={url}",
            "teacher.advantage_coef=0.5",
        )
    assert all(key in step for key in TEACHER_METRICS) and step["teacher/failed_episodes"] == 0
    assert abs(step["teacher/reverse_kl_per_token"]) < 1e-4  # the served model is the student's
