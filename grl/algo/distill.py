"""On-policy distillation: a frozen teacher scores the tokens the student sampled, and each token's
advantage is log p_teacher - log p_student, an estimate of minus the reverse KL's contribution at that
token. A policy gradient with it lowers KL(student || teacher) on the states the student itself reaches
(the student's expected advantage at a state is minus that KL), so the signal is dense: every sampled
token has one, not only the episode's last. No discount: each token is credited only with its own term.

The tensors are the batch's right-padded `[batch, tokens]` rows (docs/CONTRACTS.md); everything off the
loss mask is 0. torch is imported on first use, as in grl/algo/advantages.py.
"""

from __future__ import annotations

from grl.algo.registry import ImportedOnFirstUse, register_estimator

torch = ImportedOnFirstUse("torch")


def teacher_advantage(
    teacher_log_probs: torch.Tensor, student_log_probs: torch.Tensor, loss_mask: torch.Tensor
) -> torch.Tensor:
    """log p_teacher - log p_student on every sampled token, 0 elsewhere."""
    return torch.where(loss_mask > 0, teacher_log_probs - student_log_probs, 0.0)


@register_estimator("opd")
def compute_opd(
    teacher_log_probs: torch.Tensor, student_log_probs: torch.Tensor, loss_mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """On-policy distillation alone: the teacher's per-token advantage, no reward. Returns are the same
    numbers (there is no critic to fit)."""
    advantages = teacher_advantage(teacher_log_probs, student_log_probs, loss_mask)
    return advantages, advantages


def distill_metrics(
    teacher_log_probs: torch.Tensor,
    student_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    turn_ids: torch.Tensor,
) -> dict[str, float]:
    """`teacher/*`: the reverse KL's sample estimate per sampled token and per turn (a turn's sampled tokens
    summed, averaged over the turns that sampled any), and both models' mean log-prob of the sampled
    tokens."""
    mask = loss_mask > 0
    tokens = int(mask.sum())
    if tokens == 0:
        return {}
    gap = torch.where(mask, student_log_probs - teacher_log_probs, 0.0)
    turns = torch.where(mask, turn_ids, -1)
    width = int(turns.max()) + 1
    # one slot per (row, turn); the last is where the tokens off the mask go
    slot = torch.where(mask, torch.arange(len(turns))[:, None] * width + turns, len(turns) * width)
    per_turn = torch.zeros(len(turns) * width + 1).index_add(0, slot.flatten(), gap.flatten().float())
    sampled = torch.zeros(len(turns) * width + 1).index_add(0, slot.flatten(), mask.flatten().float())
    played = sampled[:-1] > 0
    return {
        "teacher/reverse_kl_per_token": float(gap.sum()) / tokens,
        "teacher/reverse_kl_per_turn": float(per_turn[:-1][played].mean()),
        "teacher/log_prob_mean": float(teacher_log_probs[mask].mean()),
        "teacher/student_log_prob_mean": float(student_log_probs[mask].mean()),
    }
