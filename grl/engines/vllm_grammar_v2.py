"""The reply grammar as a logits processor of vLLM's V2 model runner (after vLLM 0.26; the module's
interface, `vllm.v1.worker.gpu.sample.logits_processor`, is absent from 0.26). grl/engines/vllm_grammar.py
names this class only where that interface imports."""

from __future__ import annotations

import numpy as np
import torch
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor

from grl.engines.constraint import AllowedSet
from grl.engines.kept_sets import KeptSets, pack_filters
from grl.engines.vllm_grammar import GrammarWalk, apply_packed, pack_masks, request_grammar, request_kept_sets


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
        self.walks: dict[
            int, GrammarWalk
        ] = {}  # request slot -> walk; a slot's entry is reset in add_request
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
            self.walks[req_idx] = GrammarWalk(grammar)
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

    def _constrain(
        self, logits: torch.Tensor, rows: np.ndarray, slot_of_row: np.ndarray, ends, lasts
    ) -> None:
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
