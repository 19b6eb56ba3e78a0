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

from grl.engines.constraint import allowed_sets_tensors, compile_reply_grammar, constrain_logits

pytest.importorskip("vllm")

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
    GrammarLogitsProcessorV2,
    grammar_processors,
)

SLOTS = 4  # fewer slots than requests: slots are recycled between grammar and free requests


@pytest.fixture(scope="module")
def engine_args(tiny_path):
    return dict(model=tiny_path, tokenizer=tiny_path, dtype="float32", seed=0, enforce_eager=True,
                logprobs_mode="processed_logprobs")


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
        return RequestState(SLOTS, 512, 512, 0, len(tokenizer), torch.device("cpu"), use_dense_all_token_ids=True)


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
            ("sokoban", {"dim_room": [6, 6], "num_boxes": 1, "max_steps": 100, "search_depth": 100}, 1, False, 24),
            ("tetris", {"dim_x": 4, "dim_y": 4, "box_type": 1, "max_steps": 100}, 2, True, 20),
            ("blocksworld", {}, 3, False, 24),
            ("sokoban", {"dim_room": [6, 6], "num_boxes": 1, "max_steps": 100, "search_depth": 100}, 4, True, 16)]:
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
    state.all_token_ids.gpu[slot, :len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
    state.total_len.gpu[slot] = len(tokens)


def commit(state, slot: int, token: int) -> None:
    """What the runner's post-sampling update writes for one sampled token."""
    end = int(state.total_len.gpu[slot])
    state.all_token_ids.gpu[slot, end] = token
    state.total_len.gpu[slot] = end + 1


def context(state, order: list[int]) -> LogitsContext:
    slots = torch.tensor(order, dtype=torch.int64)
    lengths = state.total_len.gpu[slots]
    return LogitsContext(expanded_idx_mapping=slots, idx_mapping=slots, idx_mapping_np=np.array(order),
                         expanded_local_pos=torch.zeros(len(order), dtype=torch.int32),
                         input_ids=state.all_token_ids.gpu[slots, lengths - 1], pos=lengths - 1,
                         seq_lens_upper_bound_np=lengths.numpy())


def test_v2_apply_masks_exactly_the_grammars_allowed_sets(vllm_config, request_state, tokenizer, prompts):
    """Requests with real grammars and without one share a batch whose order changes every step;
    they join and leave (slots recycled), and one is preempted and resumed in another slot with its
    earlier outputs. Every row must be masked exactly as the hf engine masks it, and rows without
    a grammar left as they were."""
    state = request_state
    processor = build_custom_logits_processors(vllm_config, state, False, [V2_PROCESSOR])[0]
    grammars = real_grammars(tokenizer)
    rng, generator = random.Random(0), torch.Generator().manual_seed(0)
    queue = [Request(None if i % 4 == 3 else grammars[i % len(grammars)], prompts[i], rng.randint(3, 12))
             for i in range(12)]
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
            want = logits[row:row + 1]
            if request.grammar is not None:
                size, ids = request.walk().allowed()
                want = constrain_logits(want, *allowed_sets_tensors([(size, ids)]))
                seen["forced"] += size == 1
                seen["free text"] += size < 0
            assert torch.equal(masked[row:row + 1], want), (slot, request.outputs)
            seen["rows"] += 1
            token = int(torch.multinomial(masked[row].softmax(-1), 1, generator=generator))
            request.outputs.append(token)
            commit(state, slot, token)
            if request.finished():
                del active[slot]
                free.append(slot)
    print(f"\nV2 grammar processor: {seen}")
    assert all(count > 0 for count in seen.values()), seen
