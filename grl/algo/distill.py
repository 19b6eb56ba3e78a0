"""On-policy distillation: a frozen teacher scores the tokens the student sampled, and each token gets an
advantage from the two log-probs alone, so the signal is dense: every sampled token has one, not only the
episode's last. No discount: each token is credited only with its own term.

By default the advantage is log p_teacher - log p_student, an estimate of minus the reverse KL's
contribution at that token: its policy gradient lowers KL(student || teacher) on the states the student
itself reaches. The reverse KL is mode-seeking, and while the student does not yet tell states apart its
best policy avoids every move the teacher rules out in most states, even where the teacher takes it: on
the CPU preset's Tetris that is never dropping the piece (docs/RESULTS.md). `forward` descends
KL(teacher || student) instead, whose policy blind to the state is the teacher's average, from the same
two log-probs.

The tensors are the batch's right-padded `[batch, tokens]` rows (docs/CONTRACTS.md); everything off the
loss mask is 0. torch is imported on first use, as in grl/algo/advantages.py.
"""

from __future__ import annotations

from grl.algo.registry import ImportedOnFirstUse, register_estimator
from grl.schema.run import OPD_DIVERGENCES

torch = ImportedOnFirstUse("torch")


def teacher_advantage(
    teacher_log_probs: torch.Tensor,
    student_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    divergence: str = "reverse",
) -> torch.Tensor:
    """Each sampled token's advantage from the teacher, 0 off the loss mask.

    reverse: log p_teacher - log p_student, whose policy gradient descends KL(student || teacher), the
    mode-seeking direction; forward: p_teacher / p_student - 1, whose policy gradient descends
    KL(teacher || student) (the cross-entropy to the teacher at the states the student reaches: in
    expectation over the sampled token it moves the student's distribution by teacher - student, and the
    -1 is a baseline, E[p_teacher / p_student] = 1)."""
    gap = teacher_log_probs - student_log_probs
    if divergence == "forward":
        gap = torch.exp(gap) - 1.0
    elif divergence != "reverse":
        raise ValueError(f"divergence: {divergence!r} is not one of {', '.join(OPD_DIVERGENCES)}")
    return torch.where(loss_mask > 0, gap, 0.0)


@register_estimator("opd", hyperparameters=("opd_divergence",))
def compute_opd(
    teacher_log_probs: torch.Tensor,
    student_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    opd_divergence: str = "reverse",
) -> tuple[torch.Tensor, torch.Tensor]:
    """On-policy distillation alone: the teacher's per-token advantage, no reward. Returns are the same
    numbers (there is no critic to fit)."""
    advantages = teacher_advantage(teacher_log_probs, student_log_probs, loss_mask, opd_divergence)
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
