"""vLLM on a CUDA device with and without the reply grammar. With Triton, vLLM 0.32 runs its V2 model
runner there, so the grammar goes through GrammarLogitsProcessorV2 inside a real engine, which CPU
machines check only piece by piece (tests/engines/test_vllm_grammar.py). Replies stay inside their
grammar with the log-probs of the masked distribution (a CPU forward pass is the reference), greedy
replies match the hf engine's, and requests without a grammar come out as an engine built without one
gives them (within the noise of kernels that depend on the batch)."""

import importlib.util

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm"),
]

SOKOBAN = ["Up", "Down", "Left", "Right"]
BLOCKS = ["move 1 to 0", "move 1 to 3", "move 2 to 0", "move 2 to 1", "move 12 to 0"]
N = 8


@pytest.fixture(scope="module")
def model_path():
    from grl.models import resolve_model_path

    return resolve_model_path("embedded")


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from grl.models import load_tokenizer

    return load_tokenizer(model_path)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    from tests.engines.prompts import chat_prompts

    return chat_prompts(tokenizer, N)


@pytest.fixture(scope="module")
def grammars(tokenizer):
    """Sokoban moves, BlocksWorld moves, and moves after free think text, as the rollout compiles them."""
    from grl.engines.constraint import compile_reply_grammar

    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    end = [tokenizer.eos_token_id] + sorted(set(tokenizer.all_special_ids) - {tokenizer.eos_token_id})
    kinds = [
        compile_reply_grammar(encode, end, SOKOBAN, False, 24),
        compile_reply_grammar(encode, end, BLOCKS, False, 24),
        compile_reply_grammar(encode, end, SOKOBAN, True, 20),
    ]
    return [kinds[i % len(kinds)] for i in range(N)]


def vllm_engine(model_path, grammar):
    from grl.engines import make_engine

    # No sleep mode, which nothing here needs: it loads the weights through vLLM's CuMem allocator, one
    # pool per process that refuses a model while it holds another's memory ("CuMem allocator can only
    # be used for one instance per process", vllm/v1/worker/gpu_worker.py). These two engines live at
    # once, and after test_engines_gpu.py's sleep-mode engine in the same pytest process.
    return make_engine(
        "vllm",
        model_path,
        dtype="float32",
        device="cuda",
        gpu_memory_utilization=0.25,
        free_cache_engine=False,
        grammar=grammar,
    )


@pytest.fixture(scope="module")
def with_grammar(model_path):
    engine = vllm_engine(model_path, grammar=True)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def without_grammar(model_path):
    engine = vllm_engine(model_path, grammar=False)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def hf_cuda(model_path):
    from grl.engines import make_engine

    engine = make_engine("hf", model_path, dtype="float32", device="cuda")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def cpu_model(model_path):
    from grl.models import load_causal_lm

    return load_causal_lm(model_path, "float32", "cpu").eval()


def sampling(**kwargs):
    from grl.engines import SamplingParams

    return SamplingParams(max_new_tokens=24, **kwargs)


def test_greedy_replies_under_grammars_match_hf(with_grammar, hf_cuda, prompts, grammars, tokenizer):
    ours = with_grammar.generate(prompts, sampling(greedy=True), grammars)
    theirs = hf_cuda.generate(prompts, sampling(greedy=True), grammars)
    for out, grammar in zip(ours, grammars):
        grammar.trace(out.token_ids)  # raises on a token outside the allowed set
        assert out.token_ids[-1] == tokenizer.eos_token_id and out.finish_reason == "stop"
    # Different kernels on the two engines round the fp32 sums differently: a near-tie may flip one
    # reply, not more. vLLM repeats only its own outputs, never another library's; the tolerance of
    # test_engines_gpu.py's comparison with hf.
    assert sum(a.token_ids == b.token_ids for a, b in zip(ours, theirs)) >= N - 1


def test_sampled_replies_carry_the_masked_log_probs(with_grammar, cpu_model, prompts, grammars):
    from tests.engines.prompts import teacher_forced_log_probs

    params = sampling(temperature=0.7, seed=4)
    for prompt, out, grammar in list(
        zip(prompts, with_grammar.generate(prompts, params, grammars), grammars)
    )[:4]:
        allowed = grammar.trace(out.token_ids)
        want = teacher_forced_log_probs(cpu_model, prompt, out.token_ids, params, allowed)
        assert torch.allclose(torch.tensor(out.log_probs), want, atol=2e-3)


# Two engines running different batches (8 free requests there, 4 free beside 4 grammar requests here) run
# different kernels on a GPU: the batch's shape picks GEMM tiles and attention splits, so the same request's
# fp32 log-probs differ in their last digits, and greedy decoding may part at a near-tie. A grammar leaking
# into a free request would renormalise its log-probs over a few allowed tokens: nats, not this noise.
KERNEL_NOISE = 1e-3


def parting(a: list[int], b: list[int]) -> int:
    """The first position at which two replies differ (the shorter one's length if one holds the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_free_requests_beside_grammar_requests_are_left_alone(
    with_grammar, without_grammar, prompts, grammars
):
    """Exact: every grammar reply stays inside its grammar and the grammar changed some reply. Within the
    kernels' noise: each free reply has the log-probs an engine without grammars gives it, up to and at
    the token where the two may part, so a parting is a near-tie (both engines' choices equally likely)."""
    mixed = [grammar if i % 2 == 0 else None for i, grammar in enumerate(grammars)]
    ours = with_grammar.generate(prompts, sampling(greedy=True), mixed)
    plain = without_grammar.generate(prompts, sampling(greedy=True))
    for out, grammar in zip(ours, mixed):
        if grammar is not None:
            grammar.trace(out.token_ids)  # raises on a token outside the allowed set
    for i in (i for i, grammar in enumerate(mixed) if grammar is None):
        a, b = ours[i], plain[i]
        checked = min(parting(a.token_ids, b.token_ids) + 1, len(a.token_ids), len(b.token_ids))
        assert torch.allclose(
            torch.tensor(a.log_probs[:checked]), torch.tensor(b.log_probs[:checked]), atol=KERNEL_NOISE
        ), i
    assert any(ours[i].token_ids != plain[i].token_ids for i in range(N) if mixed[i] is not None)
    with pytest.raises(ValueError, match="grammar=False"):
        without_grammar.generate(prompts[:1], sampling(greedy=True), grammars[:1])
