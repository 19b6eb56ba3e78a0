"""compute_gae (vectorised over the batch) against the per-sample Python loop it is tested with.

A realistic multi-turn layout: a long prompt, then up to 10 turns of reply (sampled, in the loss
mask) and environment observation (not in it), right-padded to 2048 tokens.
Run: python bench/bench_gae.py [--batch 64] [--tokens 2048] [--repeat 3]
"""

import argparse
import random
import time

import torch

from grl.algo import compute_advantage, compute_gae
from grl.schema import Algorithm


def multi_turn_batch(batch: int, tokens: int, seed: int = 0):
    rng = random.Random(seed)
    mask = torch.zeros(batch, tokens, dtype=torch.float64)
    turn_ids = torch.full((batch, tokens), -1, dtype=torch.long)
    rewards = torch.zeros(batch, tokens, dtype=torch.float64)
    for b in range(batch):
        t = rng.randint(150, 300)  # system prompt + first observation
        turn_ids[b, :t] = 0
        for k in range(rng.randint(1, 10)):
            reply, obs = rng.randint(20, 150), rng.randint(30, 120)
            if t + reply > tokens:
                break
            mask[b, t : t + reply] = 1.0
            turn_ids[b, t : t + reply] = k
            rewards[b, t + reply - 1] = rng.choice([0.0, -0.1, 1.0])
            t += reply
            turn_ids[b, t : t + obs] = k + 1
            t = min(t + obs, tokens)
    values = torch.randn(batch, tokens, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return rewards, values, mask, turn_ids


def python_loop_gae(rewards, values, mask, gamma, lam):
    """The obvious implementation: per sample, gather generated positions, scan them backwards."""
    adv, ret = torch.zeros_like(values), torch.zeros_like(values)
    for b in range(values.shape[0]):
        r, v = rewards[b].tolist(), values[b].tolist()
        pos = [t for t, m in enumerate(mask[b].tolist()) if m > 0]
        last, row_adv = 0.0, [0.0] * len(pos)
        for i in reversed(range(len(pos))):
            next_v = v[pos[i + 1]] if i + 1 < len(pos) else 0.0
            last = r[pos[i]] + gamma * next_v - v[pos[i]] + gamma * lam * last
            row_adv[i] = last
        index = torch.tensor(pos, dtype=torch.long)
        adv[b, index] = torch.tensor(row_adv, dtype=values.dtype)
        ret[b, index] = adv[b, index] + values[b, index]
    return adv, ret


def column_loop_gae(rewards, values, mask, gamma, lam):
    """The usual vectorised alternative: one step per token column with masked carries."""
    B, T = values.shape
    adv, next_v, carry = torch.zeros_like(values), values.new_zeros(B), values.new_zeros(B)
    for t in range(T - 1, -1, -1):
        gen = mask[:, t] > 0
        step = rewards[:, t] + gamma * next_v - values[:, t] + gamma * lam * carry
        carry = torch.where(gen, step, carry)
        next_v = torch.where(gen, values[:, t], next_v)
        adv[:, t] = torch.where(gen, carry, 0.0)
    return adv, torch.where(mask > 0, adv + values, 0.0)


def best_time(fn, repeat, device):
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times), out


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--device", default="cpu", help="cpu or cuda (the Python-loop baseline always runs on CPU)"
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    rewards, values, mask, turn_ids = multi_turn_batch(args.batch, args.tokens)
    gamma, lam = 0.99, 0.95
    print(
        f"batch {args.batch} x {args.tokens} tokens, {int(mask.sum())} generated ({mask.mean():.0%}), "
        f"device {device}, torch threads {torch.get_num_threads()}"
    )

    t_loop, (ref_adv, ref_ret) = best_time(
        lambda: python_loop_gae(rewards, values, mask, gamma, lam), args.repeat, torch.device("cpu")
    )
    print(f"per-sample python loop   : {t_loop * 1e3:8.1f} ms   (baseline)")
    on = [x.to(device) for x in (rewards, values, mask, turn_ids)]
    t_col, (adv, _) = best_time(lambda: column_loop_gae(*on[:3], gamma, lam), args.repeat, device)
    torch.testing.assert_close(adv.cpu(), ref_adv, atol=1e-6, rtol=0)
    print(f"column loop (masked)     : {t_col * 1e3:8.1f} ms   speed-up x{t_loop / t_col:.1f}")
    t_vec, (adv, ret) = best_time(lambda: compute_gae(*on[:3], gamma, lam), args.repeat, device)
    torch.testing.assert_close(adv.cpu(), ref_adv, atol=1e-6, rtol=0)
    torch.testing.assert_close(ret.cpu(), ref_ret, atol=1e-6, rtol=0)
    print(f"compute_gae (float64)    : {t_vec * 1e3:8.1f} ms   speed-up x{t_loop / t_vec:.1f}")
    on32 = [x.float() for x in on[:3]]
    t32, _ = best_time(lambda: compute_gae(*on32, gamma, lam), args.repeat, device)
    print(f"compute_gae (float32)    : {t32 * 1e3:8.1f} ms   speed-up x{t_loop / t32:.1f}")
    t_bi, _ = best_time(
        lambda: compute_advantage(
            {"token_rewards": on[0], "values": on[1], "loss_mask": on[2], "turn_ids": on[3]},
            Algorithm(adv_estimator="bi_level_gae", gamma=gamma, lam=lam, high_level_gamma=0.95),
        ),
        args.repeat,
        device,
    )
    print(f"bi_level_gae (float64)   : {t_bi * 1e3:8.1f} ms   speed-up x{t_loop / t_bi:.1f}")


if __name__ == "__main__":
    main()
