"""One decoding step of the HF engine (grl/engines/hf.py), row by row: the tokens a grammar forces, the
logits masked to a grammar's allowed tokens, the sampled token with its log-prob under the distribution it
was drawn from (and its kept set under top-k/top-p), and the replies the rows make."""

from __future__ import annotations

import torch

from grl.engines.base import GenerationOutput, SamplingParams
from grl.engines.constraint import allowed_sets_tensors, constrain_logits
from grl.engines.kept_sets import filter_logits, filters, kept_sets


def take_forced(
    walker,
    tokens: list[int],
    log_probs: list[float],
    finish: list,
    row: int,
    limit: int,
    only_to_the_end: bool = False,
) -> None:
    """Append the tokens `walker` forces from here (log-prob 0), within `limit` reply tokens;
    with `only_to_the_end`, only a run that finishes the reply."""
    run, ends = walker.forced()
    if only_to_the_end and not ends:
        return
    room = limit - len(tokens)
    for token in run[:room]:
        tokens.append(token)
        log_probs.append(0.0)
        walker.advance(token)
    if ends and len(run) <= room:
        finish[row] = "stop"
    elif len(tokens) >= limit:
        finish[row] = "length"


def constrain(logits, walkers, finish):
    """Mask the rows that decode under a grammar to their allowed tokens."""
    rows = [row for row, w in enumerate(walkers) if w is not None and finish[row] is None]
    if not rows:
        return logits
    sizes, ids = allowed_sets_tensors([walkers[row].allowed() for row in rows])
    index = torch.tensor(rows, dtype=torch.long, device=logits.device)
    logits[index] = constrain_logits(logits[index], sizes.to(logits.device), ids.to(logits.device))
    return logits


def choose(logits, sampling: SamplingParams, generators, generator):
    """-> (tokens, their log-probs under the distribution they were drawn from: greedy rows
    report the log-softmax of the (masked) logits, as vLLM's processed log-probs do; the rows' kept
    sets when top-k/top-p filtered, else None)."""
    if sampling.is_greedy:
        chosen = logits.argmax(-1)
        return chosen, logits.log_softmax(-1).gather(-1, chosen[:, None])[:, 0], None
    filtered = filter_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    probs = filtered.softmax(-1)
    if generators is None:
        chosen = torch.multinomial(probs, 1, generator=generator)[:, 0]
    else:
        chosen = torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators)])
    kept = kept_sets(filtered) if filters(sampling) else None
    return chosen, filtered.log_softmax(-1).gather(-1, chosen[:, None])[:, 0], kept


def replies(tokens, log_probs, kept, finish, sampling: SamplingParams) -> list[GenerationOutput]:
    """The rows' replies. A token a grammar forced (no sampling step) was drawn from the set of itself
    alone."""
    return [
        GenerationOutput(
            tokens[row],
            log_probs[row] if sampling.logprobs else None,
            finish[row] or "length",
            None
            if kept is None
            else [kept[row].get(i, (1, (token,))) for i, token in enumerate(tokens[row])],
        )
        for row in range(len(tokens))
    ]
