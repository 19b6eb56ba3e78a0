"""The critic-free advantage estimators: group baselines (GRPO, RLOO, GiGPO's episode and step groups),
REINFORCE++ and GEM's return batch normalisation, over the tensors and conventions of
grl/algo/advantages.py (which holds the GAE family and the shared layout helpers).

Registered on their functions like the others; torch is imported when an estimator first runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from grl.algo.advantages import _zero, _Packing, _discounted_reverse_sum, _turn_layout, _to_tokens
from grl.algo.registry import ImportedOnFirstUse, register_estimator

torch = ImportedOnFirstUse("torch")


def group_index(group_ids: torch.Tensor | Sequence, device: torch.device | None = None) -> torch.Tensor:
    """Dense group index `[batch]` (0..G-1) from a tensor or a list of hashable group ids."""
    if isinstance(group_ids, torch.Tensor):
        return torch.unique(group_ids, return_inverse=True)[1].to(device or group_ids.device)
    dense: dict = {}
    return torch.tensor([dense.setdefault(g, len(dense)) for g in group_ids], dtype=torch.long, device=device)


def _group_stats(scores: torch.Tensor, idx: torch.Tensor):
    """Per-row group size, group sum and unbiased group std, gathered back to rows."""
    G = int(idx.max()) + 1 if idx.numel() else 0
    count = scores.new_zeros(G).index_add_(0, idx, torch.ones_like(scores))
    total = scores.new_zeros(G).index_add_(0, idx, scores)
    mean = total / count
    sq_dev = scores.new_zeros(G).index_add_(0, idx, (scores - mean[idx]) ** 2)
    std = (sq_dev / (count - 1).clamp(min=1)).sqrt()
    return count[idx], total[idx], std[idx]


@register_estimator("grpo", hyperparameters=("norm_adv_by_std_in_grpo",))
def compute_grpo(
    episode_scores: torch.Tensor,
    loss_mask: torch.Tensor,
    group_ids,
    norm_adv_by_std_in_grpo: bool = True,
    eps: float = 1e-6,
):
    """GRPO -> (advantages, returns): A_b = (s_b - mean_group) / (std_group + eps) on every
    generated token (std unbiased; without `norm_adv_by_std_in_grpo` only the mean is removed).
    As in verl, a group of one keeps its raw score (mean 0, std 1)."""
    idx = group_index(group_ids, episode_scores.device)
    n, total, std = _group_stats(episode_scores, idx)
    single = n == 1
    mean = torch.where(single, _zero(total), total / n)
    adv = episode_scores - mean
    if norm_adv_by_std_in_grpo:
        adv = adv / (torch.where(single, torch.ones_like(std), std) + eps)
    advantages = torch.where(loss_mask > 0, adv[:, None].to(loss_mask.dtype), _zero(loss_mask))
    return advantages, advantages


@register_estimator("rloo")
def compute_rloo(episode_scores: torch.Tensor, loss_mask: torch.Tensor, group_ids):
    """RLOO -> (advantages, returns): A_b = s_b - mean of the other members of b's group, on every
    generated token. As in verl, a group of one keeps its raw score."""
    idx = group_index(group_ids, episode_scores.device)
    n, total, _ = _group_stats(episode_scores, idx)
    leave_one_out = (total - episode_scores) / (n - 1).clamp(min=1)
    adv = torch.where(n > 1, episode_scores - leave_one_out, episode_scores)
    advantages = torch.where(loss_mask > 0, adv[:, None].to(loss_mask.dtype), _zero(loss_mask))
    return advantages, advantages


@register_estimator("reinforce_plus_plus", hyperparameters=("gamma",))
def compute_reinforce_plus_plus(token_rewards: torch.Tensor, loss_mask: torch.Tensor, gamma: float):
    """REINFORCE++ -> (advantages, returns).

    returns G_t = r_t + gamma * G(next generated token): the discount runs over generated tokens
    across turns and is not reset at environment tokens. advantages = G whitened over the mask.
    """
    from grl.algo.masked import masked_whiten  # imports torch, which this module leaves to the first estimate

    gen = loss_mask > 0
    packing = _Packing(gen)
    returns = packing.unpack(_discounted_reverse_sum(packing.pack(token_rewards), gamma))
    return masked_whiten(returns, loss_mask), returns


def _turn_returns(token_rewards: torch.Tensor, gen: torch.Tensor, turn_ids: torch.Tensor, gamma: float):
    """Each turn's discounted return G_k = R_k + gamma * G_{k+1} over a row's turns, R_k the turn's summed
    token rewards; turns without generated tokens are skipped. -> (tid, has_turn, returns `[batch, K]`)."""
    tid, _, _, has_turn, K = _turn_layout(turn_ids, gen)
    per_token = torch.where(gen, token_rewards, _zero(token_rewards))
    turn_rewards = token_rewards.new_zeros(gen.shape[0], K + 1).scatter_add(1, tid, per_token)[:, :K]
    packing = _Packing(has_turn)  # turns of a row packed left, so the discount skips empty turns
    return tid, has_turn, packing.unpack(_discounted_reverse_sum(packing.pack(turn_rewards), gamma))


@register_estimator("gigpo", hyperparameters=("gamma", "gigpo_step_weight", "norm_adv_by_std_in_grpo"))
def compute_gigpo(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    turn_ids: torch.Tensor,
    turn_states: torch.Tensor,
    group_ids,
    gamma: float,
    gigpo_step_weight: float,
    episode_scores: torch.Tensor | None = None,
    norm_adv_by_std_in_grpo: bool = True,
    eps: float = 1e-6,
):
    """GiGPO (group-in-group policy optimisation) -> (advantages, returns).

    A = A_episode + gigpo_step_weight * A_step on every generated token of a turn.
    A_episode is `compute_grpo` over the episodes of a group. A_step groups the turns of one
    episode group whose state is identical (`turn_states[b, k]`, an integer id of the state turn k
    of row b acted on; an "anchor state"): each turn's discounted return G_k = R_k + gamma * G_{k+1}
    over the row's turns (R_k the turn's summed token rewards) is normalised within its anchor
    group like GRPO, and a turn whose state no other turn of its group visited gets A_step = 0
    (a group of one says nothing about the action). Turns without generated tokens are skipped.
    returns holds the step returns G_k on the turn's tokens.
    """
    gen = loss_mask > 0
    tid, has_turn, step_returns = _turn_returns(token_rewards, gen, turn_ids, gamma)
    B, K = has_turn.shape
    if episode_scores is None:
        episode_scores = torch.where(gen, token_rewards, _zero(token_rewards)).sum(-1)
    episode_adv, _ = compute_grpo(episode_scores, loss_mask, group_ids, norm_adv_by_std_in_grpo, eps)
    if turn_states.shape[1] < K:
        raise ValueError(f"turn_states has {turn_states.shape[1]} turns per row, turn_ids need {K}")
    states = turn_states[:, :K].long()
    if bool((has_turn & (states < 0)).any()):
        raise ValueError("turn_states must be >= 0 on every turn with a generated token")
    group = group_index(group_ids, gen.device)[:, None].expand(B, K)
    # an anchor group: one (episode group, state) pair, over the turns that have tokens
    anchor = torch.unique(torch.stack([group[has_turn], states[has_turn]]), dim=1, return_inverse=True)[1]
    n, total, std = _group_stats(step_returns[has_turn], anchor)
    step_adv = step_returns[has_turn] - total / n
    if norm_adv_by_std_in_grpo:
        step_adv = step_adv / (std + eps)
    step_adv = torch.where(n > 1, step_adv, _zero(step_adv))
    per_turn = step_returns.new_zeros(B, K).masked_scatter(has_turn, step_adv)
    advantages = episode_adv + gigpo_step_weight * _to_tokens(per_turn, tid, gen)
    return advantages, _to_tokens(step_returns, tid, gen)


@register_estimator("rebn", hyperparameters=("gamma",))
def compute_rebn(
    token_rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    turn_ids: torch.Tensor,
    gamma: float,
    eps: float = 1e-9,
):
    """GEM's per-turn returns with return batch normalisation (ReBN) -> (advantages, returns).

    Each turn is one transition, as in GEM's trainers: G_k = R_k + gamma * G_{k+1} over the row's turns.
    The returns of every turn in the batch are normalised together, A_k = (G_k - mean) / (std + eps) with
    the population std (GEM's OAT trainer, `--norm_return`), and A_k goes on every generated token of
    turn k. returns hold G_k on the turn's tokens.
    """
    gen = loss_mask > 0
    tid, has_turn, step_returns = _turn_returns(token_rewards, gen, turn_ids, gamma)
    centered = step_returns[has_turn] - step_returns[has_turn].mean()
    normalized = centered / (centered.pow(2).mean().sqrt() + eps)
    return _to_tokens(
        step_returns.new_zeros(has_turn.shape).masked_scatter(has_turn, normalized), tid, gen
    ), _to_tokens(step_returns, tid, gen)
