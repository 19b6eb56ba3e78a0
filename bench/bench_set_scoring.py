"""The policy head's cost on tokens decoded under valid-action sets: each scored on its own set's rows of
the head (grl/workers/heads.py, sets of at most SMALL_SET ids) against the masked softmax over the whole
vocabulary that every token paid before. Forward and backward of one chunk of scored tokens, as an update
runs them, on the embedded model's head shape (49,152 x 576) unless `--vocab`/`--hidden` say otherwise.

    python bench/bench_set_scoring.py [--tokens 1024] [--choices 4] [--repeats 5]

The replies: `<answer>Left</answer>`-like, one choice among `--choices` then forced tokens (sets of one),
eight tokens a reply, as the CPU preset's games write them. Prints both times and their ratio (same
process, same inputs); the values agree to 1e-5.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grl.workers.heads import _log_prob_and_entropy, _over_the_vocabulary  # noqa: E402

REPLY_TOKENS = 8


def replies(tokens: int, choices: int, vocab: int, generator: torch.Generator):
    """(sizes, flat ids, labels): per reply one choice among `choices` ids, then forced tokens."""
    sizes, ids, labels = [], [], []
    for t in range(tokens):
        size = choices if t % REPLY_TOKENS == 0 else 1
        members = torch.randperm(vocab, generator=generator)[:size].tolist()
        sizes.append(size), ids.extend(members), labels.append(members[t % size])
    return torch.tensor(sizes), torch.tensor(ids, dtype=torch.int32), torch.tensor(labels)


def timed(score, head, hidden, labels, sizes, ids, repeats: int) -> tuple[float, tuple]:
    best = float("inf")
    for _ in range(repeats):
        head.zero_grad(set_to_none=True)
        start = time.perf_counter()
        log_prob, entropy = score(head, hidden, labels, 1.0, sizes, ids)
        (log_prob.sum() + entropy.sum()).backward()
        best = min(best, time.perf_counter() - start)
    return best, (log_prob.detach(), entropy.detach())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--choices", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False)
    hidden = torch.randn(args.tokens, args.hidden, generator=generator, requires_grad=True)
    sizes, ids, labels = replies(args.tokens, args.choices, args.vocab, generator)
    vocabulary_s, want = timed(_over_the_vocabulary, head, hidden, labels, sizes, ids, args.repeats)
    on_sets_s, got = timed(_log_prob_and_entropy, head, hidden, labels, sizes, ids, args.repeats)
    worst = max(float((g - w).abs().max()) for g, w in zip(got, want))
    print(
        f"{args.tokens} tokens, head {args.vocab} x {args.hidden}, torch {torch.__version__}, "
        f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads"
    )
    print(
        f"over the vocabulary {vocabulary_s * 1e3:.1f} ms, on the sets {on_sets_s * 1e3:.1f} ms: "
        f"{vocabulary_s / on_sets_s:.1f}x (largest difference {worst:.1e})"
    )


if __name__ == "__main__":
    main()
