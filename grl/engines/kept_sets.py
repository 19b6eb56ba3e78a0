"""Top-k/top-p sampling and the kept set it samples from, the same in every engine and in the trainer.

With top-k or top-p a token is drawn from the softmax, at the sampling temperature, over the ids the
filter kept: its kept set. The engine reports the log-prob under that renormalised distribution, so the
trainer must score the token under the same set, or the old-log-prob pass, the reference's KL and the
update read another distribution than the one that sampled (9 nats apart with the tiny model at top_p
0.7, top_k 5). A kept set is an allowed set the sampler chose (grl/engines/constraint.py): each engine
reports the set of every token it sampled under a filter (`GenerationOutput.kept_sets`), intersected with
the valid-action grammar's set when both apply (the filter runs on the grammar's masked logits), and the
batch carries them as it carries the grammar's (grl/rollout/allowed_sets.py). Each set is stored as the
smaller of its ids listed or the other ids denied, so top-p over a flat distribution stays compact too.

vLLM applies top-k/top-p in its own sampler and returns no kept set outside its V2 model runner (whose
`return_sampling_mask` takes no custom logits processor, so no grammar). GRL's logits processor
(grl/engines/vllm_grammar.py) therefore filters with `filter_logits` itself and hands vLLM top_p 1 and
top_k off: both engines keep exactly the same ids for the same logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from grl.engines.base import GenerationOutput, SamplingParams
from grl.engines.constraint import AllowedSet, ReplyGrammar

if TYPE_CHECKING:  # the rollout imports this module, and the gateway's `grl serve` checks must not load torch
    import torch

FILTER_ARG = "grl_kept_sets"  # vLLM SamplingParams.extra_args key of a request's KeptSets


def filters(sampling: SamplingParams) -> bool:
    """Whether `sampling` draws from a filtered distribution (top-k or top-p cut it)."""
    return not sampling.is_greedy and (sampling.top_p < 1.0 or sampling.top_k > 0)


def filter_logits(logits, temperature: float, top_k: int, top_p: float):
    """Scale by temperature and mask (-inf) what top-k and top-p exclude.
    logits: float [B, V]. Top-p keeps the smallest set of most likely tokens
    whose probability reaches top_p (always at least one)."""
    import torch

    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # probability of the tokens ranked above
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def kept_sets(filtered: torch.Tensor) -> list[AllowedSet]:
    """Rows `[N, V]` of filtered logits (-inf outside what was kept) -> each row's kept set: `(+n, ids)`,
    or `(-m, ids)` denying the m others when they are fewer (a set of the whole vocabulary is `(0, ())`)."""
    import torch

    kept = torch.isfinite(filtered)
    vocab = kept.shape[-1]
    counts = kept.sum(-1).tolist()
    sets = []
    for row, count in zip(kept, counts):
        denied = count > vocab - count
        ids = tuple((~row if denied else row).nonzero()[:, 0].tolist())
        sets.append((-len(ids) if denied else len(ids), ids))
    return sets


def reply_sets(output: GenerationOutput, grammar: ReplyGrammar | None) -> list[AllowedSet] | None:
    """The set each token of a reply was sampled from, for the trainer to score it under: the engine's
    kept sets when a filter cut the distribution, else the grammar's allowed sets, else None (the full
    softmax). The grammar's trace runs either way: it checks the engine honoured the grammar."""
    traced = None if grammar is None else grammar.trace(output.token_ids)
    return output.kept_sets if output.kept_sets is not None else traced


class KeptSets:
    """One vLLM request's filter, and the kept set the logits processor drew each reply position from.

    It reaches the processor inside the request's `extra_args`, and vLLM deep-copies a request's params
    on admission: a copy is this same object, so the processor's writes land here. That holds while the
    processor runs in this process, as GRL builds vLLM (in-process engine core, one worker); `for_reply`
    says so if it ever does not."""

    def __init__(self, temperature: float, top_k: int, top_p: float):
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.sets: dict[
            int, AllowedSet
        ] = {}  # by reply position: a step recomputed (preemption) overwrites its own

    def __deepcopy__(self, memo) -> KeptSets:
        return self

    def keep(self, logits: torch.Tensor) -> tuple[torch.Tensor, list[AllowedSet]]:
        """Rows `[N, V]` of raw logits -> (a mask, True outside each row's kept set; the kept sets)."""
        import torch

        filtered = filter_logits(logits, self.temperature, self.top_k, self.top_p)
        return ~torch.isfinite(filtered), kept_sets(filtered)

    def for_reply(self, length: int) -> list[AllowedSet]:
        missing = [p for p in range(length) if p not in self.sets]
        if missing:
            raise RuntimeError(
                f"vLLM's logits processor left no kept set for reply positions {missing[:5]}; it writes them "
                "here "
                "only when it runs in this process (GRL builds vLLM with an in-process engine core and one "
                "worker)"
            )
        return [self.sets[p] for p in range(length)]


def pack_filters(samplings: Sequence[KeptSets]) -> dict[tuple, list[int]]:
    """Indices of `samplings` grouped by their filter, so that each group is filtered in one call."""
    groups: dict[tuple, list[int]] = {}
    for i, s in enumerate(samplings):
        groups.setdefault((s.temperature, s.top_k, s.top_p), []).append(i)
    return groups
