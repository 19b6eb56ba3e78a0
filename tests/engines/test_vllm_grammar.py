"""The reply grammar as a vLLM logits processor, for vLLM's two model runners, checked on CPU
with vLLM's own loaders and per-slot request buffers.

vLLM 0.32 runs the V2 model runner on every CUDA machine with Triton, and the V2 loader
refuses a V1-interface processor: the fault that stopped every GPU engine in its constructor
while CPU (no Triton backend, so the V1 runner) passed. These tests pin each class to its own
loader and check the V2 `apply` against the grammar walk the hf engine uses.
"""

import os
import random
from dataclasses import dataclass, field
from unittest import mock

import numpy as np
import pytest
import torch

from grl.engines.constraint import ReplyGrammar, allowed_sets_tensors, compile_reply_grammar, constrain_logits
from vllm import SamplingParams as VllmSamplingParams  # noqa: E402
from vllm.v1.sample.logits_processor import build_logitsprocs, validate_logits_processors_parameters  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import (  # noqa: E402
    LogitsContext,
    build_custom_logits_processors,
    build_custom_logits_processors_params_validator,
)

from grl.engines.vllm_grammar import (  # noqa: E402
    GRAMMAR_ARG,
    V1_PROCESSOR,
    V2_PROCESSOR,
    GrammarLogitsProcessor,
    grammar_processors,
)
from grl.engines.vllm_grammar_v2 import GrammarLogitsProcessorV2  # noqa: E402

SLOTS = 4  # fewer slots than requests: slots are recycled between grammar and free requests


@pytest.fixture(scope="module")
def engine_args(tiny_path):
    return dict(
        model=tiny_path,
        tokenizer=tiny_path,
        dtype="float32",
        seed=0,
        enforce_eager=True,
        logprobs_mode="processed_logprobs",
    )


@pytest.fixture(scope="module")
def vllm_config(engine_args):
    from vllm.engine.arg_utils import EngineArgs

    with mock.patch.dict(os.environ):  # vLLM's CPU platform sets process-wide variables (LD_PRELOAD, ...)
        return EngineArgs(**engine_args).create_engine_config()


@pytest.fixture(scope="module")
def request_state(tokenizer):
    """The V2 runner's per-slot buffers on CPU. No pinned memory here: vLLM's own fallback for
    platforms without it (device copies instead of UVA) takes over."""
    from vllm.v1.worker.gpu import buffer_utils
    from vllm.v1.worker.gpu.states import RequestState

    with mock.patch.object(buffer_utils, "is_uva_available", lambda: False):
        return RequestState(
            SLOTS, 512, 512, 0, len(tokenizer), torch.device("cpu"), use_dense_all_token_ids=True
        )


def params(grammar=None):
    return VllmSamplingParams(max_tokens=64, extra_args=None if grammar is None else {GRAMMAR_ARG: grammar})


def real_grammars(tokenizer):
    """Grammars of real env states, compiled the way the rollout compiles them."""
    import grl.envs

    from grl.rollout.chat import ChatTokens

    encode = ChatTokens(tokenizer).encode
    end = [tokenizer.eos_token_id] + sorted(set(tokenizer.all_special_ids) - {tokenizer.eos_token_id})
    grammars = []
    for name, config, seed, think, budget in [
        (
            "sokoban",
            {"dim_room": [6, 6], "num_boxes": 1, "max_steps": 100, "search_depth": 100},
            1,
            False,
            24,
        ),
        ("tetris", {"dim_x": 4, "dim_y": 4, "box_type": 1, "max_steps": 100}, 2, True, 20),
        ("blocksworld", {}, 3, False, 24),
        ("sokoban", {"dim_room": [6, 6], "num_boxes": 1, "max_steps": 100, "search_depth": 100}, 4, True, 16),
    ]:
        env = grl.envs.make(name, **config)
        env.reset(seed)
        grammars.append(compile_reply_grammar(encode, end, env.valid_actions(), think, budget))
        env.close()
    return grammars


# ---------------------------------------------------------------------------- loaders


def test_each_class_passes_its_own_loader_and_v2_refuses_the_v1_class(vllm_config, request_state):
    v1 = build_logitsprocs(vllm_config, torch.device("cpu"), False, False, [V1_PROCESSOR])
    assert [type(p) for p in v1.all if isinstance(p, GrammarLogitsProcessor)] == [GrammarLogitsProcessor]
    v2 = build_custom_logits_processors(vllm_config, request_state, False, [V2_PROCESSOR])
    assert [type(p) for p in v2] == [GrammarLogitsProcessorV2]
    # The original fault: the V2 frontend validator (built in vllm.LLM's constructor) and the V2
    # runner's loader both refuse the V1 class.
    with pytest.raises(ValueError, match="not a subclass of vllm.v1.worker.gpu.sample.logits_processor"):
        build_custom_logits_processors_params_validator([V1_PROCESSOR])
    with pytest.raises(ValueError, match="not a subclass of vllm.v1.worker.gpu.sample.logits_processor"):
        build_custom_logits_processors(vllm_config, request_state, False, [V1_PROCESSOR])
    with pytest.raises(ValueError, match="must be a subclass of LogitsProcessor"):
        build_logitsprocs(vllm_config, torch.device("cpu"), False, False, [V2_PROCESSOR])


def test_both_validators_refuse_a_grammar_that_is_not_one(tokenizer):
    from vllm.exceptions import VLLMValidationError

    bad = VllmSamplingParams(max_tokens=4, extra_args={GRAMMAR_ARG: "Up"})
    with pytest.raises(VLLMValidationError, match="expected a ReplyGrammar, got str"):
        build_custom_logits_processors_params_validator([V2_PROCESSOR])(bad)
    with pytest.raises((ValueError, VLLMValidationError), match="expected a ReplyGrammar, got str"):
        validate_logits_processors_parameters([V1_PROCESSOR], bad)
    build_custom_logits_processors_params_validator([V2_PROCESSOR])(params(real_grammars(tokenizer)[0]))


def test_the_runner_choice_is_vllms_and_no_grammar_means_no_processor(engine_args, monkeypatch):
    import vllm.config.vllm as vllm_config_module

    with mock.patch.dict(os.environ):
        assert grammar_processors(engine_args, grammar=False) == []
        assert grammar_processors(engine_args, grammar=True) == [V1_PROCESSOR]  # CPU: no Triton backend
        # What a CUDA machine with Triton has: vLLM picks the V2 runner, so the V2 class.
        monkeypatch.setattr(vllm_config_module, "HAS_TRITON", True)
        assert grammar_processors(engine_args, grammar=True) == [V2_PROCESSOR]
        assert grammar_processors(engine_args, grammar=False) == []
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")  # a user's override is vLLM's choice too
        assert grammar_processors(engine_args, grammar=True) == [V1_PROCESSOR]


# ---------------------------------------------------------------------------- V2 apply


@dataclass
class Request:
    grammar: object
    prompt: list[int]
    length: int  # tokens a request without a grammar runs for
    outputs: list[int] = field(default_factory=list)

    def walk(self):
        """The hf engine's walk: the allowed set asked for before each token it samples."""
        walker = self.grammar.walker()
        for token in self.outputs:
            walker.allowed()
            walker.advance(token)
        return walker

    def finished(self) -> bool:
        return len(self.outputs) >= self.length if self.grammar is None else self.walk().done

    def closing_free_text(self) -> bool:
        """Part-way through the forced closing tokens of free text: a walk that catches up on
        these outputs at once must find where the forcing began."""
        if self.grammar is None:
            return False
        walker = self.walk()
        return 0 < len(walker.forcing) < len(getattr(self.grammar.nodes[walker.node], "close", ()))


def admit(state, slot: int, request: Request) -> None:
    """What RequestState.add_request and apply_staged_writes leave in the slot's buffers
    (a resumed request's prefill holds its earlier outputs)."""
    tokens = request.prompt + request.outputs
    state.prompt_len.np[slot] = len(request.prompt)
    state.all_token_ids.gpu[slot, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
    state.total_len.gpu[slot] = len(tokens)


def commit(state, slot: int, token: int) -> None:
    """What the runner's post-sampling update writes for one sampled token."""
    end = int(state.total_len.gpu[slot])
    state.all_token_ids.gpu[slot, end] = token
    state.total_len.gpu[slot] = end + 1


def context(state, order: list[int]) -> LogitsContext:
    slots = torch.tensor(order, dtype=torch.int64)
    lengths = state.total_len.gpu[slots]
    return LogitsContext(
        expanded_idx_mapping=slots,
        idx_mapping=slots,
        idx_mapping_np=np.array(order),
        expanded_local_pos=torch.zeros(len(order), dtype=torch.int32),
        input_ids=state.all_token_ids.gpu[slots, lengths - 1],
        pos=lengths - 1,
        seq_lens_upper_bound_np=lengths.numpy(),
    )


def test_v2_apply_masks_exactly_the_grammars_allowed_sets(vllm_config, request_state, tokenizer, prompts):
    """Requests with real grammars and without one share a batch whose order changes every step;
    they join and leave (slots recycled), and one is preempted and resumed in another slot with its
    earlier outputs. Every row must be masked exactly as the hf engine masks it, and rows without
    a grammar left as they were."""
    state = request_state
    processor = build_custom_logits_processors(vllm_config, state, False, [V2_PROCESSOR])[0]
    grammars = real_grammars(tokenizer)
    rng, generator = random.Random(0), torch.Generator().manual_seed(0)
    queue = [
        Request(None if i % 4 == 3 else grammars[i % len(grammars)], prompts[i], rng.randint(3, 12))
        for i in range(12)
    ]
    free, active = list(range(SLOTS)), {}
    seen = {"rows": 0, "forced": 0, "free text": 0, "reused across kinds": 0, "resumed": 0}
    kind_of_slot = {}

    def add(slot, request):
        if slot in kind_of_slot and kind_of_slot[slot] != (request.grammar is None):
            seen["reused across kinds"] += 1
        kind_of_slot[slot] = request.grammar is None
        admit(state, slot, request)
        assert processor.add_request(slot, params(request.grammar)) == (request.grammar is not None)
        active[slot] = request

    while queue or active:
        for _ in range(rng.randint(0, 2)):
            if queue and free:
                add(free.pop(rng.randrange(len(free))), queue.pop(0))
        if not active:
            continue
        resumable = [s for s, r in active.items() if r.closing_free_text()]
        if not seen["resumed"] and resumable and free:  # preempted, then resumed in another slot
            request = active.pop(resumable[0])
            free.append(resumable[0])
            add(free.pop(0), request)
            seen["resumed"] += 1
        order = list(active)
        rng.shuffle(order)
        logits = torch.randn(len(order), len(tokenizer), generator=generator)
        masked = processor.apply(logits.clone(), context(state, order))
        for row, slot in enumerate(order):
            request = active[slot]
            want = logits[row : row + 1]
            if request.grammar is not None:
                size, ids = request.walk().allowed()
                want = constrain_logits(want, *allowed_sets_tensors([(size, ids)]))
                seen["forced"] += size == 1
                seen["free text"] += size < 0
            assert torch.equal(masked[row : row + 1], want), (slot, request.outputs)
            seen["rows"] += 1
            token = int(torch.multinomial(masked[row].softmax(-1), 1, generator=generator))
            request.outputs.append(token)
            commit(state, slot, token)
            if request.finished():
                del active[slot]
                free.append(slot)
    print(f"\nV2 grammar processor: {seen}")
    assert all(count > 0 for count in seen.values()), seen


def test_v2_apply_filters_top_k_top_p_inside_the_grammar_and_records_each_kept_set(
    vllm_config, request_state, tokenizer, prompts
):
    """Requests with and without a grammar, with and without top-k/top-p, share a batch whose order changes
    every step, and slots are recycled: a filtering row keeps what `filter_logits` keeps of its grammar-masked
    logits, the others are as the grammar alone leaves them, and each request's KeptSets ends up holding the
    set of every position it sampled."""
    from grl.engines.kept_sets import FILTER_ARG, KeptSets, filter_logits, kept_sets

    state = request_state
    processor = build_custom_logits_processors(vllm_config, state, False, [V2_PROCESSOR])[0]
    grammars = real_grammars(tokenizer)
    generator = torch.Generator().manual_seed(1)
    queue = [(Request(grammars[i % 4] if i % 3 else None, prompts[i], 6), i % 2 == 0) for i in range(8)]
    free, active, done = list(range(SLOTS)), {}, []
    while queue or active:
        while queue and free:
            slot, (request, filtering) = free.pop(0), queue.pop(0)
            request.kept = KeptSets(0.8, 5, 0.7) if filtering else None
            request.want = []
            admit(state, slot, request)
            extra = {GRAMMAR_ARG: request.grammar} if request.grammar else {}
            sampling = VllmSamplingParams(
                max_tokens=64, extra_args={**extra, FILTER_ARG: request.kept} if filtering else extra or None
            )
            assert processor.add_request(slot, sampling) == (request.grammar is not None or filtering)
            active[slot] = request
        order = list(active)[::-1] if len(done) % 2 else list(active)
        logits = torch.randn(len(order), len(tokenizer), generator=generator)
        masked = processor.apply(logits.clone(), context(state, order))
        for row, slot in enumerate(order):
            request = active[slot]
            want = logits[row : row + 1]
            if request.grammar is not None and not request.walk().done:
                want = constrain_logits(want, *allowed_sets_tensors([request.walk().allowed()]))
            if request.kept is not None:
                filtered = filter_logits(want, 0.8, 5, 0.7)
                want = want.masked_fill(~torch.isfinite(filtered), float("-inf"))
                request.want += kept_sets(filtered)
            assert torch.equal(masked[row : row + 1], want), (slot, request.outputs)
            token = int(torch.multinomial(masked[row].softmax(-1), 1, generator=generator))
            request.outputs.append(token)
            commit(state, slot, token)
            if request.finished() or len(request.outputs) >= 10:
                done.append(active.pop(slot))
                free.append(slot)
    filtering = [r for r in done if r.kept is not None]
    assert {r.grammar is None for r in filtering} == {True, False}
    assert all(r.kept.for_reply(len(r.outputs)) == r.want for r in filtering)


# ---------------------------------------------------------------------------- against a reference


def reference_mask(row: torch.Tensor, allowed) -> torch.Tensor:
    """The slow, obvious masking: token by token, -inf unless the allowed set admits it."""
    size, ids = allowed
    members = set(ids)
    values = row.tolist()
    return torch.tensor(
        [
            value if size == 0 or (token in members) == (size > 0) else float("-inf")
            for token, value in enumerate(values)
        ],
        dtype=row.dtype,
    )


def test_mask_rows_matches_the_reference():
    """The V1 path's masking, and the index form both runners use, on hand-made sets: allowed,
    denied (free text), unconstrained, one forced token, an id at either end of the vocabulary."""
    from grl.engines.vllm_grammar import mask_rows, pack_masks

    vocab = 50
    logits = torch.randn(7, vocab, generator=torch.Generator().manual_seed(0))
    sets = [(3, (4, 9, 17)), (-2, (0, 49)), (1, (7,)), (-1, (3,)), (2, (48, 1)), (1, (49,)), (-3, (5, 6, 0))]
    rows = [0, 1, 3, 4, 5, 2, 6]  # not in row order; row 6 twice the work of a small set
    got = logits.clone()
    mask_rows(got, rows, sets)
    want = logits.clone()
    for row, allowed in zip(rows, sets):
        want[row] = reference_mask(logits[row], allowed)
    assert torch.equal(got, want)
    untouched = logits.clone()
    mask_rows(untouched, [2], [(0, ())])  # unconstrained: nothing to do
    assert torch.equal(untouched, logits)
    short = np.empty(3, np.int64)  # too small: a new array comes back, the short one untouched
    packed, p, q, f = pack_masks(rows, sets, short)
    assert packed is not short and (p, q, f) == (7, 6, 4) and len(packed) >= 2 * (p + q) + f


def walk_to(grammar, outputs):
    """The hf engine's walk over `outputs`, asking for the allowed set before each token."""
    walker = grammar.walker()
    for token in outputs:
        walker.allowed()
        walker.advance(token)
    return walker


def random_reply(grammar, rng: random.Random, vocab: int, extra: int) -> list[int]:
    """A reply sampled inside the grammar to its end, then `extra` tokens past it (what an
    engine that schedules a step ahead may still commit for a finished request)."""
    walker, reply = grammar.walker(), []
    while not walker.done:
        size, ids = walker.allowed()
        token = rng.choice(ids) if size > 0 else rng.randrange(vocab)
        while size < 0 and token in ids:
            token = rng.randrange(vocab)
        reply.append(token)
        walker.advance(token)
    return reply + [rng.randrange(vocab) for _ in range(extra)]


def test_v2_apply_matches_the_reference_on_random_states(vllm_config, tokenizer, prompts):
    """Random states of a 12-slot batch, round after round (some cut short, their slots refilled
    mid-reply, as after an abort): requests with and without a grammar,
    some admitted with part of their reply already written (a resumed request: several tokens to
    catch up on at once), the rest sampling one token a step; rows finish their reply, some get
    tokens past its end; a random subset of the requests is in each step's batch, in random order.
    Every row must come out as the reference masks it from the allowed set of its grammar walk."""
    from vllm.v1.worker.gpu import buffer_utils
    from vllm.v1.worker.gpu.states import RequestState

    slots, vocab = 12, len(tokenizer)
    with mock.patch.object(buffer_utils, "is_uva_available", lambda: False):
        state = RequestState(slots, 512, 512, 0, vocab, torch.device("cpu"), use_dense_all_token_ids=True)
    processor = build_custom_logits_processors(vllm_config, state, False, [V2_PROCESSOR])[0]
    # One answer among 500 single tokens: a step with a few of these outgrows the index buffer
    # the processor starts with.
    wide = ReplyGrammar([{token: 1 for token in range(100, 600)}, {tokenizer.eos_token_id: 2}, {}], 8)
    grammars = real_grammars(tokenizer) + [wide]
    rng, generator = random.Random(1), torch.Generator().manual_seed(1)
    seen = dict.fromkeys(
        [
            "no grammar",
            "finished",
            "past the end",
            "forced",
            "choice",
            "free text",
            "caught up",
            "left out of a step",
            "refilled mid-reply",
            "refilled without a grammar",
        ],
        0,
    )
    unfinished = set()  # slots left mid-reply by the last round
    for _ in range(8):
        replies, ends, active = {}, {}, {}
        for slot in range(slots):
            grammar = None if rng.random() < 0.3 else rng.choice(grammars)
            seen["refilled mid-reply"] += slot in unfinished
            seen["refilled without a grammar"] += slot in unfinished and grammar is None
            extra = rng.choice([0, 0, 2])
            reply = (
                random_reply(grammar, rng, vocab, extra)
                if grammar is not None
                else [rng.randrange(vocab) for _ in range(rng.randint(1, 6))]
            )
            ends[slot] = len(reply) - extra  # where the grammar's reply ends
            written = rng.choice([0, 0, rng.randint(0, len(reply))])
            request = Request(grammar, prompts[rng.randrange(len(prompts))], len(reply), reply[:written])
            admit(state, slot, request)
            assert processor.add_request(slot, params(grammar)) == (grammar is not None)
            seen["caught up"] += grammar is not None and written > 1
            replies[slot], active[slot] = reply, request
        steps = rng.choice([4, 1000])  # a short round leaves replies unfinished: the next refills their slots
        for _ in range(steps):
            if not active:
                break
            order = [slot for slot in active if rng.random() < 0.8]
            seen["left out of a step"] += len(active) - len(order)
            if not order:
                continue
            rng.shuffle(order)
            logits = torch.randn(len(order), vocab, generator=generator)
            masked = processor.apply(logits.clone(), context(state, order))
            for row, slot in enumerate(order):
                request = active[slot]
                allowed = (
                    (0, ())
                    if request.grammar is None
                    else walk_to(request.grammar, request.outputs).allowed()
                )
                assert torch.equal(masked[row], reference_mask(logits[row], allowed)), (slot, request.outputs)
                size = allowed[0]
                if request.grammar is None:
                    seen["no grammar"] += 1
                elif walk_to(request.grammar, request.outputs).done:
                    seen["finished" if len(request.outputs) == ends[slot] else "past the end"] += 1
                else:
                    seen["forced" if size == 1 else "choice" if size > 1 else "free text"] += 1
                if len(request.outputs) == len(replies[slot]):
                    del active[slot]
                    continue
                token = replies[slot][len(request.outputs)]
                request.outputs.append(token)
                commit(state, slot, token)
        unfinished = {
            slot
            for slot, request in active.items()
            if request.grammar is not None and not walk_to(request.grammar, request.outputs).done
        }
    print(f"\nV2 grammar processor against the reference: {seen}")
    assert all(count > 0 for count in seen.values()), seen
    assert len(processor._index_host) > 32 * slots  # the buffer grew, and the steps after used it
