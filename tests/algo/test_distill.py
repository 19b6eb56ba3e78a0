"""On-policy distillation's advantage and metrics against Python loops, and its place in the estimator
registry and the config's rules."""

import pytest
import torch

from grl.algo import compute_advantage, distill_metrics, teacher_advantage
from grl.algo.estimators import ESTIMATORS
from grl.config import ConfigError, load_config
from grl.schema import Algorithm


def _batch(seed=0, rows=5, width=23):
    gen = torch.Generator().manual_seed(seed)
    loss_mask = (torch.rand(rows, width, generator=gen) < 0.6).float()
    loss_mask[:, :2] = 0.0  # every row begins with a prompt
    turn_ids = torch.cumsum((torch.rand(rows, width, generator=gen) < 0.2).long(), 1)
    teacher = -torch.rand(rows, width, generator=gen) * 4
    student = -torch.rand(rows, width, generator=gen) * 4
    return teacher, student, loss_mask, turn_ids


def test_the_advantage_is_the_teacher_s_log_prob_minus_the_student_s_on_sampled_tokens_only():
    teacher, student, mask, _ = _batch()
    got = teacher_advantage(teacher, student, mask)
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            want = float(teacher[b, t] - student[b, t]) if mask[b, t] > 0 else 0.0
            assert float(got[b, t]) == pytest.approx(want, abs=1e-6)


def test_opd_is_a_registered_estimator_that_reads_the_teacher_and_no_reward():
    spec = ESTIMATORS["opd"]
    assert spec.needs_teacher and not spec.needs_critic and not spec.group_based and not spec.whiten
    assert "token_rewards" not in spec.inputs
    teacher, student, mask, _ = _batch(1)
    inputs = {
        "teacher_log_probs": teacher,
        "student_log_probs": student,
        "loss_mask": mask,
        "token_rewards": torch.randn(mask.shape),  # what the rollout earned: opd ignores it
    }
    advantages, returns = compute_advantage(inputs, Algorithm(adv_estimator="opd"))
    torch.testing.assert_close(advantages, teacher_advantage(teacher, student, mask))
    torch.testing.assert_close(returns, advantages)
    with pytest.raises(ValueError, match="needs 'teacher_log_probs'"):
        compute_advantage({"loss_mask": mask, "token_rewards": mask}, Algorithm(adv_estimator="opd"))


def test_the_metrics_equal_loops_over_tokens_and_turns():
    teacher, student, mask, turns = _batch(2)
    got = distill_metrics(teacher, student, mask, turns)
    tokens, per_turn = [], {}
    for b in range(mask.shape[0]):
        for t in range(mask.shape[1]):
            if mask[b, t] > 0:
                gap = float(student[b, t] - teacher[b, t])
                tokens.append(gap)
                per_turn[(b, int(turns[b, t]))] = per_turn.get((b, int(turns[b, t])), 0.0) + gap
    assert got["teacher/reverse_kl_per_token"] == pytest.approx(sum(tokens) / len(tokens), abs=1e-5)
    assert got["teacher/reverse_kl_per_turn"] == pytest.approx(
        sum(per_turn.values()) / len(per_turn), abs=1e-5
    )
    assert got["teacher/log_prob_mean"] == pytest.approx(float(teacher[mask > 0].mean()), abs=1e-5)
    assert got["teacher/student_log_prob_mean"] == pytest.approx(float(student[mask > 0].mean()), abs=1e-5)
    assert distill_metrics(teacher, student, torch.zeros_like(mask), turns) == {}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["algorithm.adv_estimator=opd"],
            "algorithm.adv_estimator=opd distils a teacher; set teacher.model_path",
        ),
        (
            ["teacher.model_path=tiny", "teacher.url=http://127.0.0.1:9"],
            "teacher.model_path and teacher.url: name one teacher",
        ),
        (["teacher.url=127.0.0.1:8000"], "teacher.url: '127.0.0.1:8000' is not an http(s) URL"),
        (["teacher.model_path=tiny", "teacher.advantage_coef=-1"], "teacher.advantage_coef"),
    ],
)
def test_a_teacher_the_run_cannot_use_is_one_line_before_anything_starts(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(["model_path=tiny", *overrides])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_forward_advantage_moves_the_student_by_teacher_minus_student_in_expectation():
    """Over the student's own samples at one state, the forward advantage's policy gradient on the logits
    is exactly teacher - student (the cross-entropy's), where the reverse one's is minus the reverse KL's."""
    logits = torch.tensor([0.3, -0.2, 0.5, 0.0], requires_grad=True)
    teacher = torch.log_softmax(torch.tensor([2.0, -1.0, 0.0, -3.0]), -1)
    mask = torch.ones(4)
    for divergence, objective in (
        ("forward", lambda s: -(teacher.exp() * s).sum()),  # cross-entropy to the teacher
        ("reverse", lambda s: (s.exp() * (s - teacher)).sum()),  # KL(student || teacher)
    ):
        student = torch.log_softmax(logits, -1)
        advantage = teacher_advantage(teacher, student.detach(), mask, divergence)
        # the expected policy gradient, sum over tokens of p_student * A * grad log p_student
        (expected,) = torch.autograd.grad(-(student.exp().detach() * advantage * student).sum(), logits)
        (exact,) = torch.autograd.grad(objective(torch.log_softmax(logits, -1)), logits)
        torch.testing.assert_close(expected, exact, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="divergence: 'js' is not one of reverse, forward"):
        teacher_advantage(teacher, teacher, mask, "js")
