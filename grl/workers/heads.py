"""What a role's model puts on top of the shared backbone, as one object per kind of head.

A role names its head once (`PolicyWorker.head = POLICY`, `CriticWorker.head = VALUE`) and the worker
passes that object down: to `grl.models` to read the weights, to `grl.workers.fsdp.empty_model` to
build the empty copy each rank shards, and to `TokenScorer` (grl/workers/scoring.py) to turn hidden
states into scores. A new head is one more `Head` here and a role that names it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import nn

from grl import models
from grl.algo import entropy_from_logits, log_probs_from_logits
from grl.engines.constraint import constrain_logits_flat, set_owners


# A token decoded under a grammar whose allowed set has at most this many ids is scored on those ids
# alone: its masked softmax over the vocabulary is the softmax over its set, and the tokens of a valid
# action or a forced tool call (mostly sets of one) then cost a few dot products, not a vocabulary's.
SMALL_SET = 64


def _log_prob_and_entropy(head: nn.Module, hidden, labels, temperature: float, sizes=None, ids=None):
    if sizes is None or not isinstance(head, nn.Linear):  # a LoRA-wrapped head has no plain weight to index
        return _over_the_vocabulary(head, hidden, labels, temperature, sizes, ids)
    owner = set_owners(sizes, len(ids))
    label_listed = torch.zeros_like(labels, dtype=torch.bool).index_put_(
        (owner,), ids.long() == labels[owner], accumulate=True
    )
    # A label outside its set (log-prob -inf) stays on the vocabulary's path, which says so.
    on_set = (sizes > 0) & (sizes <= SMALL_SET) & label_listed
    if not bool(on_set.any()):
        return _over_the_vocabulary(head, hidden, labels, temperature, sizes, ids)
    listed_on_set = on_set[owner]
    parts = [
        (
            on_set,
            _over_the_set(
                head, hidden[on_set], labels[on_set], temperature, sizes[on_set], ids[listed_on_set]
            ),
        )
    ]
    if not bool(on_set.all()):
        off = ~on_set
        parts.append(
            (
                off,
                _over_the_vocabulary(
                    head, hidden[off], labels[off], temperature, sizes[off], ids[~listed_on_set]
                ),
            )
        )
    scores = []
    for j in range(2):
        out = torch.zeros(len(labels), dtype=torch.float32, device=hidden.device)
        for rows, part in parts:
            out = out.masked_scatter(rows, part[j])
        scores.append(out)
    return tuple(scores)


def _over_the_vocabulary(head: nn.Module, hidden, labels, temperature: float, sizes=None, ids=None):
    logits = head(hidden).float() / temperature
    if sizes is not None:
        logits = constrain_logits_flat(logits, sizes, ids)
    return log_probs_from_logits(logits, labels), entropy_from_logits(logits)


def _over_the_set(head: nn.Linear, hidden, labels, temperature: float, sizes, ids):
    """(log-prob, entropy) of each position's softmax over its own allowed ids (each listed once, as
    every grammar builds them), from those ids' rows of the head: the vocabulary path's values."""
    owner, ids = set_owners(sizes, len(ids)), ids.long()
    logits = (hidden[owner].float() * head.weight[ids].float()).sum(-1)
    if head.bias is not None:
        logits = logits + head.bias[ids].float()
    logits = logits / temperature

    def per_position(values):
        return torch.zeros(len(sizes), dtype=values.dtype, device=values.device).index_add(0, owner, values)

    peak = torch.full((len(sizes),), float("-inf"), device=hidden.device).scatter_reduce(
        0, owner, logits.detach(), "amax"
    )
    exp = torch.exp(logits - peak[owner])
    total = per_position(exp)
    log_norm = peak + torch.log(total)
    label_logit = per_position(torch.where(ids == labels[owner], logits, torch.zeros_like(logits)))
    entropy = log_norm - per_position(exp / total[owner] * logits)
    return label_logit - log_norm, entropy


def _value(head: nn.Module, hidden, labels, temperature: float, sizes=None, ids=None):
    return (head(hidden).float().squeeze(-1),)


def _output_embeddings(model: nn.Module) -> nn.Module:
    # With tied embeddings lm_head shares the input embedding's weight, so the output embedding is the
    # right head either way.
    return model.get_output_embeddings()


def _score_layer(model: nn.Module) -> nn.Module:
    return model.score


# eq=False: heads compare (and hash) by identity; there is one object per kind.
@dataclass(frozen=True, eq=False)
class Head:
    name: str  # for logs and errors only: nothing looks a head up by its name
    model_class: Callable[[], type]  # the transformers class that builds this model (imported when called)
    config_kwargs: Mapping[str, object]  # what that class's config needs beyond the checkpoint's own
    load: Callable[..., nn.Module]  # (path, dtype, device) -> the model with its weights, on the host
    module: Callable[[nn.Module], nn.Module]  # the head's layer within the loaded model
    # (head layer, hidden, labels, temperature, constraint sizes, constraint ids) -> a tuple of `outputs`
    # per-position scores; one chunk of positions at a time, its allowed sets' ids flat
    # (constrain_logits_flat)
    score: Callable[..., tuple[torch.Tensor, ...]]
    outputs: int
    loss_tokens_only: bool  # vocabulary-sized: only the positions the loss reads go through it
    takes_adapters: bool  # LoRA adapters go on this model when the run asks for them


POLICY = Head(
    name="policy",
    model_class=models.causal_lm_class,
    config_kwargs=MappingProxyType({}),
    load=models.load_causal_lm,
    module=_output_embeddings,
    score=_log_prob_and_entropy,
    outputs=2,
    loss_tokens_only=True,
    takes_adapters=True,
)
"""The causal LM's vocabulary head: (log-prob, entropy) of each token under the engine's sampling
distribution."""

VALUE = Head(
    name="value",
    model_class=models.value_model_class,
    config_kwargs=MappingProxyType(models.VALUE_CONFIG),
    load=models.load_critic,
    module=_score_layer,
    score=_value,
    outputs=1,
    loss_tokens_only=False,
    takes_adapters=False,
)
"""The critic's one-label token classifier: (value,) of the state before each token."""


def check_head(head) -> Head:
    if not isinstance(head, Head):
        raise TypeError(f"head must be grl.workers.heads.POLICY or VALUE (a Head), got {head!r}")
    return head
