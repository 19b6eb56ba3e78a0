"""Bytes of a training batch's allowed sets (constrained decoding): the padded form the batch held
before (`constraint_ids` `[rows, T, K]` int64, K the largest set) against the compact one
(grl/rollout/allowed_sets.py: every set's ids once, int32). Computed, not timed.

The batch: `--rows` episodes `--width` tokens wide, each with `--turns` replies that are a forced
tool call (`tool_choice` required, the hermes frame Qwen uses, grl/gateway/grammars.py) of at most
`--reply` tokens, walked on the tiny model's tokenizer with each token drawn uniformly from its
allowed set (a blind sampler: it spends its budget inside JSON strings, where the sets are large).

    python bench/bench_constraint_memory.py [--rows 64] [--width 2048] [--turns 4] [--reply 128]

With the defaults (23,327 reply tokens, 424 ids per token on average, the largest set 2,091 ids):
padded 2,092.0 MiB, compact 38.7 MiB (of which constraint_size 1.0 MiB), 54x less. The scorer's
per-chunk mask, `[logits_chunk_size, vocab]` booleans, is the same in both forms.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grl.engines.constraint import compile_call_grammar  # noqa: E402
from grl.engines.json_grammar import JsonVocabulary, token_texts  # noqa: E402
from grl.models import load_tokenizer  # noqa: E402
from grl.rollout.chat import ChatTokens  # noqa: E402
from grl.toolcalls import call_frames  # noqa: E402


def walk(grammar, vocab: int, rng: random.Random) -> list[int]:
    """The set sizes of one reply sampled uniformly inside `grammar`."""
    walker, sizes = grammar.walker(), []
    while not walker.done:
        size, ids = walker.allowed()
        token = rng.choice(ids) if size > 0 else rng.randrange(vocab)
        while size < 0 and token in ids:
            token = rng.randrange(vocab)
        sizes.append(abs(size))
        walker.advance(token)
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--reply", type=int, default=128)
    args = parser.parse_args()
    tokenizer = load_tokenizer("tiny")
    chat = ChatTokens(tokenizer, {})
    frames = call_frames("hermes", ["weather", "search"])
    grammar = compile_call_grammar(
        chat.encode, chat.end_ids(), frames, JsonVocabulary(token_texts(tokenizer)), args.reply
    )
    rng = random.Random(0)
    replies = [walk(grammar, len(tokenizer), rng) for _ in range(args.rows * args.turns)]
    largest = max(max(r) for r in replies)
    listed = sum(sum(r) for r in replies)
    tokens = sum(len(r) for r in replies)
    sizes_bytes = args.rows * args.width * 8  # constraint_size [rows, T] int64, the same in both forms
    padded = sizes_bytes + args.rows * args.width * largest * 8
    compact = sizes_bytes + listed * 4
    print(f"tiny tokenizer ({len(tokenizer)} ids), hermes tool call, replies of <= {args.reply} tokens")
    print(f"{args.rows} rows x {args.width} tokens, {args.turns} replies each: {tokens} reply tokens")
    print(f"largest set {largest} ids, mean {listed / tokens:.1f} ids per reply token")
    print(
        f"padded [rows, T, K] int64: {padded / 2**20:,.1f} MiB; compact (CSR, int32): {compact / 2**20:,.2f} "
        "MiB"
    )
    print(f"ratio {padded / compact:,.0f}x")


if __name__ == "__main__":
    main()
