"""Advantage estimators against slow per-sample Python references on random multi-turn masks."""

import math
import statistics

import pytest
import torch

from grl.algo import (
    ESTIMATORS,
    compute_advantage,
    compute_bi_level_gae,
    compute_gae,
    compute_gigpo,
    compute_grpo,
    compute_reinforce_plus_plus,
    compute_rloo,
    compute_turn_gae,
    compute_weighted_gae,
    turn_ids_from_mask,
)
from grl.algo.advantages import _discounted_reverse_sum
from grl.schema import Algorithm
from tests.algo.batches import random_episode_batch

SEEDS = range(6)


def estimate(name, inputs, whiten=True, **keys):
    """`compute_advantage` as the trainer calls it: the batch inputs by name and a typed `algorithm`
    section; an estimator that reads a teacher gets teacher and student log-probs that depend on the
    rewards (a fixed function of them, so what the tests change off the mask reaches them too)."""
    if ESTIMATORS[name].needs_teacher if name in ESTIMATORS else False:
        rewards = inputs["token_rewards"]
        inputs = {
            "teacher_log_probs": -torch.sigmoid(rewards),
            "student_log_probs": -0.5 + 0 * rewards,
            **inputs,
        }
    return compute_advantage(inputs, Algorithm(adv_estimator=name, **keys), whiten=whiten)


# ---- references: one row at a time, generated positions gathered first --------------------------


def generated(mask_row):
    return [t for t, m in enumerate(mask_row.tolist()) if m > 0]


def ref_gae_row(r, v, pos, gamma, lam):
    adv, last = {}, 0.0
    for i in reversed(range(len(pos))):
        next_v = v[pos[i + 1]] if i + 1 < len(pos) else 0.0
        delta = r[pos[i]] + gamma * next_v - v[pos[i]]
        last = delta + gamma * lam * last
        adv[pos[i]] = last
    return adv


def ref_gae(batch, gamma, lam):
    r, v, m = batch["token_rewards"], batch["values"], batch["loss_mask"]
    adv, ret = torch.zeros_like(v), torch.zeros_like(v)
    for b in range(v.shape[0]):
        pos = generated(m[b])
        for t, a in ref_gae_row(r[b].tolist(), v[b].tolist(), pos, gamma, lam).items():
            adv[b, t], ret[b, t] = a, a + v[b, t]
    return adv, ret


def ref_turns(batch, b):
    """Ordered list of (turn id, generated positions) of row b."""
    pos = generated(batch["loss_mask"][b])
    turns = {}
    for t in pos:
        turns.setdefault(int(batch["turn_ids"][b, t]), []).append(t)
    return sorted(turns.items())


def ref_turn_gae_row(batch, b, hgamma, hlam):
    r, v = batch["token_rewards"][b].tolist(), batch["values"][b].tolist()
    turns = ref_turns(batch, b)
    R = [sum(r[t] for t in toks) for _, toks in turns]
    V = [v[toks[0]] for _, toks in turns]
    A, last = [0.0] * len(turns), 0.0
    for k in reversed(range(len(turns))):
        next_v = V[k + 1] if k + 1 < len(turns) else 0.0
        last = R[k] + hgamma * next_v - V[k] + hgamma * hlam * last
        A[k] = last
    return turns, A, [a + val for a, val in zip(A, V, strict=True)]


def ref_bi_level(batch, gamma, lam, hgamma, hlam):
    v = batch["values"]
    adv, ret = torch.zeros_like(v), torch.zeros_like(v)
    for b in range(v.shape[0]):
        turns, _, G = ref_turn_gae_row(batch, b, hgamma, hlam)
        for (_, toks), g in zip(turns, G, strict=True):
            low_r = {t: 0.0 for t in toks}
            low_r[toks[-1]] = g
            for t, a in ref_gae_row(low_r, v[b].tolist(), toks, gamma, lam).items():
                adv[b, t], ret[b, t] = a, a + v[b, t]
    return adv, ret


def ref_weighted(batch, gamma, lam, hgamma, hlam, w):
    adv, ret = ref_gae(batch, gamma, lam)
    for b in range(adv.shape[0]):
        turns, A, _ = ref_turn_gae_row(batch, b, hgamma, hlam)
        for (_, toks), a in zip(turns, A, strict=True):
            for t in toks:
                adv[b, t] += w * a
    return adv, ret


def ref_group_scores(scores, groups, kind, norm_by_std=True, eps=1e-6):
    out = []
    for i, s in enumerate(scores):
        members = [scores[j] for j in range(len(scores)) if groups[j] == groups[i]]
        if len(members) == 1:
            out.append(s / (1 + eps) if kind == "grpo" and norm_by_std else s)
        elif kind == "grpo":
            a = s - statistics.mean(members)
            out.append(a / (statistics.stdev(members) + eps) if norm_by_std else a)
        else:
            others = [scores[j] for j in range(len(scores)) if groups[j] == groups[i] and j != i]
            out.append(s - sum(others) / len(others))
    return out


def ref_whiten(x, mask):
    vals = [x[b, t].item() for b in range(x.shape[0]) for t in generated(mask[b])]
    mean = sum(vals) / len(vals)
    var = sum((a - mean) ** 2 for a in vals) / (len(vals) - 1)
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for t in generated(mask[b]):
            out[b, t] = (x[b, t] - mean) / math.sqrt(var + 1e-8)
    return out


def ref_reinforce_pp(batch, gamma):
    r, m = batch["token_rewards"], batch["loss_mask"]
    ret = torch.zeros_like(r)
    for b in range(r.shape[0]):
        g = 0.0
        for t in reversed(generated(m[b])):
            g = r[b, t].item() + gamma * g
            ret[b, t] = g
    return ref_whiten(ret, m), ret


def close(a, b):
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


# ---- estimators vs references ---------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_gae_matches_reference(seed):
    batch = random_episode_batch(16, seed)
    gamma, lam = [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.7, 0.5)][seed % 4]
    adv, ret = compute_gae(batch["token_rewards"], batch["values"], batch["loss_mask"], gamma, lam)
    ref_adv, ref_ret = ref_gae(batch, gamma, lam)
    close(adv, ref_adv)
    close(ret, ref_ret)


@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_blocked_scan_matches_loop(chunk):
    x = torch.randn(5, 50, dtype=torch.float64, generator=torch.Generator().manual_seed(chunk))
    for decay in (0.0, 0.5, 0.97, 1.0):
        expected = torch.zeros_like(x)
        for s in range(5):
            carry = 0.0
            for j in reversed(range(50)):
                carry = x[s, j].item() + decay * carry
                expected[s, j] = carry
        close(_discounted_reverse_sum(x, decay, chunk), expected)


def test_long_episodes_span_many_scan_chunks():
    batch = random_episode_batch(6, 42, max_turns=12, max_env=20, max_reply=60)
    assert int(batch["loss_mask"].sum(-1).max()) > 3 * 64
    for gamma, lam in [(0.99, 0.95), (1.0, 1.0)]:
        adv, ret = compute_gae(batch["token_rewards"], batch["values"], batch["loss_mask"], gamma, lam)
        ref_adv, ref_ret = ref_gae(batch, gamma, lam)
        close(adv, ref_adv)
        close(ret, ref_ret)
    adv, ret = compute_bi_level_gae(
        batch["token_rewards"], batch["values"], batch["loss_mask"], batch["turn_ids"], 0.99, 0.95, 0.9, 0.8
    )
    ref_adv, ref_ret = ref_bi_level(batch, 0.99, 0.95, 0.9, 0.8)
    close(adv, ref_adv)
    close(ret, ref_ret)


def test_gae_by_hand():
    # two turns [g g] env [g]; the first turn's last token bootstraps from the second turn's first
    r = torch.tensor([[0.0, 1.0, 9.0, 2.0]], dtype=torch.float64)
    v = torch.tensor([[0.5, 0.25, 7.0, 1.0]], dtype=torch.float64)
    m = torch.tensor([[1.0, 1.0, 0.0, 1.0]], dtype=torch.float64)
    gamma, lam = 0.5, 0.5
    d2 = 2.0 - 1.0
    d1 = 1.0 + gamma * 1.0 - 0.25
    d0 = 0.0 + gamma * 0.25 - 0.5
    a2, a1 = d2, d1 + gamma * lam * d2
    expected = torch.tensor([[d0 + gamma * lam * a1, a1, 0.0, a2]], dtype=torch.float64)
    adv, ret = compute_gae(r, v, m, gamma, lam)
    close(adv, expected)
    close(ret, torch.where(m > 0, expected + v, 0.0))


@pytest.mark.parametrize("seed", SEEDS)
def test_bi_level_gae_matches_reference(seed):
    batch = random_episode_batch(16, 100 + seed)
    gamma, lam, hgamma, hlam = [(1.0, 1.0, 0.95, 1.0), (0.99, 0.95, 0.9, 0.8), (0.9, 0.5, 1.0, 0.0)][seed % 3]
    adv, ret = compute_bi_level_gae(
        batch["token_rewards"],
        batch["values"],
        batch["loss_mask"],
        batch["turn_ids"],
        gamma,
        lam,
        hgamma,
        hlam,
    )
    ref_adv, ref_ret = ref_bi_level(batch, gamma, lam, hgamma, hlam)
    close(adv, ref_adv)
    close(ret, ref_ret)


def test_turn_gae_matches_reference():
    batch = random_episode_batch(16, 150)
    turns = compute_turn_gae(
        batch["token_rewards"], batch["values"], batch["loss_mask"], batch["turn_ids"], 0.9, 0.8
    )
    for b in range(16):
        ref_turns_b, A, G = ref_turn_gae_row(batch, b, 0.9, 0.8)
        ids = [k for k, _ in ref_turns_b]
        assert turns.turn_mask[b].nonzero().flatten().tolist() == ids
        assert turns.last[b, ids].tolist() == [toks[-1] for _, toks in ref_turns_b]
        close(turns.advantages[b, ids], torch.tensor(A, dtype=torch.float64))
        close(turns.returns[b, ids], torch.tensor(G, dtype=torch.float64))


@pytest.mark.parametrize("seed", SEEDS)
def test_weighted_gae_matches_reference(seed):
    batch = random_episode_batch(16, 200 + seed)
    gamma, lam, hgamma, hlam, w = 0.99, 0.9, 0.95, 0.7, [0.0, 0.5, 2.0][seed % 3]
    adv, ret = compute_weighted_gae(
        batch["token_rewards"],
        batch["values"],
        batch["loss_mask"],
        batch["turn_ids"],
        gamma,
        lam,
        hgamma,
        w,
        hlam,
    )
    ref_adv, ref_ret = ref_weighted(batch, gamma, lam, hgamma, hlam, w)
    close(adv, ref_adv)
    close(ret, ref_ret)


@pytest.mark.parametrize("seed", SEEDS)
def test_grpo_and_rloo_match_reference(seed):
    g = torch.Generator().manual_seed(seed)
    B = 24
    groups = torch.randint(0, 6, (B,), generator=g)
    scores = torch.randn(B, generator=g, dtype=torch.float64).round(
        decimals=1
    )  # ties happen, as with 0/1 rewards
    mask = random_episode_batch(B, 300 + seed)["loss_mask"]
    for norm in (True, False):
        adv, ret = compute_grpo(scores, mask, groups, norm_adv_by_std_in_grpo=norm)
        ref = torch.tensor(
            ref_group_scores(scores.tolist(), groups.tolist(), "grpo", norm), dtype=torch.float64
        )
        close(adv, torch.where(mask > 0, ref[:, None], 0.0))
        close(ret, adv)
    adv, _ = compute_rloo(scores, mask, groups)
    ref = torch.tensor(ref_group_scores(scores.tolist(), groups.tolist(), "rloo"), dtype=torch.float64)
    close(adv, torch.where(mask > 0, ref[:, None], 0.0))


def test_group_ids_as_list_of_strings():
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    mask = torch.ones(5, 2, dtype=torch.float64)
    names = ["a", "b", "a", "b", "c"]
    adv, _ = compute_grpo(scores, mask, names)
    ref = ref_group_scores(scores.tolist(), names, "grpo")
    close(adv[:, 0], torch.tensor(ref, dtype=torch.float64))
    assert adv[4, 0].item() == pytest.approx(1.0 / (1 + 1e-6))  # a group of one keeps its score


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_plus_plus_matches_reference(seed):
    batch = random_episode_batch(16, 400 + seed)
    gamma = [1.0, 0.99, 0.5][seed % 3]
    adv, ret = compute_reinforce_plus_plus(batch["token_rewards"], batch["loss_mask"], gamma)
    ref_adv, ref_ret = ref_reinforce_pp(batch, gamma)
    close(ret, ref_ret)
    close(adv, ref_adv)


def test_reinforce_plus_plus_discount_crosses_env_tokens():
    # reward only at the end of turn 2; turn 1's last token is one generated step before it
    r = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    m = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]], dtype=torch.float64)
    _, ret = compute_reinforce_plus_plus(r, m, 0.5)
    close(ret, torch.tensor([[0.25, 0.5, 0.0, 0.0, 1.0]], dtype=torch.float64))


def random_turn_states(batch, seed, num_states):
    """`[B, turns]` state ids drawn from `num_states` values, so that turns of a group repeat states."""
    K = int(batch["turn_ids"].max()) + 1
    return torch.randint(
        0, num_states, (batch["turn_ids"].shape[0], max(K, 1)), generator=torch.Generator().manual_seed(seed)
    )


def ref_gigpo(batch, states, groups, gamma, w, norm_by_std=True, eps=1e-6):
    r = batch["token_rewards"]
    scores = [sum(r[b, t].item() for t in generated(batch["loss_mask"][b])) for b in range(r.shape[0])]
    episode = ref_group_scores(scores, groups, "grpo", norm_by_std, eps)
    steps = {}  # (row, turn id) -> (discounted return, tokens)
    for b in range(r.shape[0]):
        turns, g = ref_turns(batch, b), 0.0
        for k, toks in reversed(turns):
            g = sum(r[b, t].item() for t in toks) + gamma * g
            steps[b, k] = (g, toks)
    adv, ret = torch.zeros_like(r), torch.zeros_like(r)
    for (b, k), (g, toks) in steps.items():
        anchor = [
            steps[c, j][0] for (c, j) in steps if groups[c] == groups[b] and states[c, j] == states[b, k]
        ]
        step_adv = 0.0
        if len(anchor) > 1:
            step_adv = g - statistics.mean(anchor)
            if norm_by_std:
                step_adv /= statistics.stdev(anchor) + eps
        for t in toks:
            adv[b, t], ret[b, t] = episode[b] + w * step_adv, g
    return adv, ret


@pytest.mark.parametrize("seed", SEEDS)
def test_gigpo_matches_reference(seed):
    batch = random_episode_batch(24, 1100 + seed, max_turns=5)
    groups = (torch.arange(24) // 6).tolist()
    states = random_turn_states(batch, seed, num_states=3)
    gamma, w, norm = [(1.0, 1.0, True), (0.95, 0.5, True), (0.9, 2.0, False)][seed % 3]
    adv, ret = estimate(
        "gigpo",
        {**batch, "turn_states": states, "group_ids": groups},
        gamma=gamma,
        gigpo_step_weight=w,
        norm_adv_by_std_in_grpo=norm,
    )
    ref_adv, ref_ret = ref_gigpo(batch, states, groups, gamma, w, norm)
    close(adv, ref_adv)
    close(ret, ref_ret)
    assert (ref_adv != ref_group_like(batch, groups, norm)).any()  # repeated states did move some turns


def ref_group_like(batch, groups, norm):
    scores = torch.where(batch["loss_mask"] > 0, batch["token_rewards"], 0).sum(-1)
    ref = torch.tensor(ref_group_scores(scores.tolist(), groups, "grpo", norm), dtype=torch.float64)
    return torch.where(batch["loss_mask"] > 0, ref[:, None], 0.0)


def test_gigpo_with_distinct_states_is_grpo():
    batch = random_episode_batch(24, 1200, max_turns=5)
    groups = (torch.arange(24) // 4).tolist()
    K = int(batch["turn_ids"].max()) + 1
    states = torch.arange(24 * K).view(24, K)  # every turn its own state
    for norm in (True, False):
        adv, _ = compute_gigpo(
            batch["token_rewards"],
            batch["loss_mask"],
            batch["turn_ids"],
            states,
            groups,
            0.9,
            3.0,
            norm_adv_by_std_in_grpo=norm,
        )
        scores = torch.where(batch["loss_mask"] > 0, batch["token_rewards"], 0).sum(-1)
        grpo, _ = compute_grpo(scores, batch["loss_mask"], groups, norm)
        close(adv, grpo)


def test_gigpo_same_state_in_another_group_is_not_an_anchor():
    # rows 0, 1 in group 0 and rows 2, 3 in group 1; all turns share state 7
    m = torch.tensor([[1.0, 0.0, 1.0]] * 4, dtype=torch.float64)
    tids = torch.tensor([[0, 1, 1]] * 4)
    r = torch.tensor(
        [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 5.0], [0.0, 0.0, 5.0]], dtype=torch.float64
    )
    states = torch.full((4, 2), 7)
    adv, ret = compute_gigpo(r, m, tids, states, [0, 0, 1, 1], 0.5, 1.0, norm_adv_by_std_in_grpo=False)
    # group 0: episode adv +-0.5; anchor over 4 turns with returns [0.5, 1, 0, 0], mean 0.375
    close(
        ret,
        torch.tensor(
            [[0.5, 0.0, 1.0], [0.0, 0.0, 0.0], [2.5, 0.0, 5.0], [2.5, 0.0, 5.0]], dtype=torch.float64
        ),
    )
    close(
        adv[:2],
        torch.tensor(
            [[0.5 + 0.125, 0.0, 0.5 + 0.625], [-0.5 - 0.375, 0.0, -0.5 - 0.375]], dtype=torch.float64
        ),
    )
    close(adv[2:], torch.tensor([[-1.25, 0.0, 1.25]] * 2, dtype=torch.float64))


# ---- invariances and robustness --------------------------------------------------------------------


def insert_env_tokens(batch, seed):
    """Insert 1-3 env tokens (mask 0, random values, reward 0) after every turn's last generated token."""
    g = torch.Generator().manual_seed(seed)
    B, T = batch["loss_mask"].shape
    rows = []
    for b in range(B):
        cols = {k: [] for k in batch}
        for t in range(T):
            for k in batch:
                cols[k].append(batch[k][b, t].item())
            ends_run = batch["loss_mask"][b, t] > 0 and (t + 1 == T or batch["loss_mask"][b, t + 1] == 0)
            if ends_run:
                for _ in range(int(torch.randint(1, 4, (1,), generator=g))):
                    cols["loss_mask"].append(0.0)
                    cols["token_rewards"].append(0.0)
                    cols["values"].append(float(torch.randn(1, generator=g)))
                    cols["turn_ids"].append(cols["turn_ids"][-1])
        rows.append(cols)
    T2 = max(len(c["loss_mask"]) for c in rows)
    out = {}
    for k in batch:
        fill = -1 if k == "turn_ids" else 0.0
        out[k] = torch.tensor([c[k] + [fill] * (T2 - len(c[k])) for c in rows], dtype=batch[k].dtype)
    return out


def on_generated(x, mask):
    return [x[b][mask[b] > 0] for b in range(x.shape[0])]


@pytest.mark.parametrize("estimator", ["gae", "bi_level_gae", "weighted_gae", "reinforce_plus_plus"])
def test_env_tokens_between_turns_change_nothing(estimator):
    batch = random_episode_batch(12, 500, garbage=0.0)
    wider = insert_env_tokens(batch, 501)
    kw = {"gamma": 0.97, "lam": 0.9, "high_level_gamma": 0.9, "turn_advantage_weight": 0.5}
    adv, ret = estimate(estimator, batch, whiten=False, **kw)
    adv2, ret2 = estimate(estimator, wider, whiten=False, **kw)
    for a, a2 in zip(
        on_generated(adv, batch["loss_mask"]), on_generated(adv2, wider["loss_mask"]), strict=True
    ):
        close(a, a2)
    for a, a2 in zip(
        on_generated(ret, batch["loss_mask"]), on_generated(ret2, wider["loss_mask"]), strict=True
    ):
        close(a, a2)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_non_generated_positions_are_ignored(estimator):
    """NaN/inf on padding and arbitrary numbers on env tokens never reach the outputs."""
    nan_batch = random_episode_batch(10, 600, garbage=float("nan"))
    clean = {
        k: torch.where(nan_batch["loss_mask"] > 0, x, 0) if x.is_floating_point() and k != "loss_mask" else x
        for k, x in nan_batch.items()
    }
    groups = torch.arange(10) // 3
    given = {"group_ids": groups, "turn_states": random_turn_states(nan_batch, 601, num_states=2)}
    kw = {"gamma": 0.99, "lam": 0.95, "high_level_gamma": 0.9}
    adv, ret = estimate(estimator, {**nan_batch, **given}, **kw)
    adv2, ret2 = estimate(estimator, {**clean, **given}, **kw)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert (adv[nan_batch["loss_mask"] == 0] == 0).all() and (ret[nan_batch["loss_mask"] == 0] == 0).all()
    close(adv, adv2)
    close(ret, ret2)


def test_dispatcher_whitens_critic_estimators():
    batch = random_episode_batch(16, 700)
    adv, ret = estimate("gae", batch, gamma=0.99, lam=0.95)
    raw_adv, raw_ret = ref_gae(batch, 0.99, 0.95)
    close(adv, ref_whiten(raw_adv, batch["loss_mask"]))
    close(ret, raw_ret)


def test_dispatcher_episode_scores_default_to_summed_rewards():
    batch = random_episode_batch(8, 800)
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    adv, _ = estimate("rloo", {**batch, "group_ids": groups})
    scores = torch.where(batch["loss_mask"] > 0, batch["token_rewards"], 0).sum(-1)
    ref = torch.tensor(ref_group_scores(scores.tolist(), groups, "rloo"), dtype=torch.float64)
    close(adv, torch.where(batch["loss_mask"] > 0, ref[:, None], 0.0))


def test_dispatcher_errors_name_the_problem():
    batch = random_episode_batch(8, 900)
    assert (batch["loss_mask"].sum(-1) > 1).any()
    with pytest.raises(
        ValueError, match="gae, bi_level_gae, weighted_gae, grpo, rloo, reinforce_plus_plus, gigpo"
    ):
        estimate("ppo_magic", batch)
    with pytest.raises(ValueError, match="'values'"):
        estimate("gae", {"token_rewards": batch["token_rewards"], "loss_mask": batch["loss_mask"]})
    with pytest.raises(ValueError, match="'group_ids'"):
        estimate("grpo", batch)
    with pytest.raises(ValueError, match="'turn_states'"):
        estimate("gigpo", {**batch, "group_ids": [0] * 8})
    backwards = torch.where(batch["loss_mask"] > 0, 1000 - batch["loss_mask"].cumsum(-1), 0).long()
    with pytest.raises(ValueError, match="must not decrease"):
        estimate("bi_level_gae", {**batch, "turn_ids": backwards})
    with pytest.raises(ValueError, match="turn_ids must be >= 0"):
        estimate("bi_level_gae", {**batch, "turn_ids": torch.full_like(batch["turn_ids"], -1)})


def test_turn_ids_from_mask():
    m = torch.tensor([[0, 0, 1, 1, 0, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.float64)
    expected = torch.tensor([[0, 0, 0, 0, 1, 1, 2, 2, 2, 3], [0, 1, 1, 1, 1, 1, 1, 1, 1, 1]])
    assert torch.equal(turn_ids_from_mask(m), expected)


def test_bi_level_without_turn_ids_uses_mask_runs():
    batch = random_episode_batch(8, 1000)
    # the batch generator can put two turns' replies side by side; turn ids from the mask then merge them
    derived = turn_ids_from_mask(batch["loss_mask"])
    kw = {"gamma": 0.99, "lam": 0.9, "high_level_gamma": 0.95}
    a, _ = estimate("bi_level_gae", {**batch, "turn_ids": None}, whiten=False, **kw)
    b, _ = estimate("bi_level_gae", {**batch, "turn_ids": derived}, whiten=False, **kw)
    close(a, b)


def test_empty_batch_rows():
    m = torch.zeros(3, 5, dtype=torch.float64)
    x = torch.randn(3, 5, dtype=torch.float64)
    for est in ESTIMATORS:
        inputs = {
            "token_rewards": x,
            "values": x,
            "loss_mask": m,
            "turn_ids": torch.full((3, 5), -1),
            "group_ids": [0, 0, 1],
            "turn_states": torch.zeros(3, 1, dtype=torch.long),
        }
        adv, ret = estimate(est, inputs)
        assert (adv == 0).all() and (ret == 0).all(), est
