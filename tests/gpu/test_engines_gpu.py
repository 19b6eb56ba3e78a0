"""Engines on a CUDA device: sleep/wake memory release and the colocated
(hybrid) weight sync. vLLM runs in this process, beside an actor model."""

import importlib.util

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm")

QUESTIONS = [
    "What is 2 + 3?",
    "Name a primary colour.",
    "Say hello in French.",
    "What is the capital of Italy?",
    "How many legs does a spider have?",
    "What do bees make?",
    "What colour is grass?",
    "Translate 'thank you' into Spanish.",
]
GIB = 1024**3


@pytest.fixture(scope="module")
def model_path():
    from grl.models import resolve_model_path

    return resolve_model_path("embedded")


@pytest.fixture(scope="module")
def prompts(model_path):
    from grl.models import load_tokenizer

    tokenizer = load_tokenizer(model_path)
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in QUESTIONS
    ]


@pytest.fixture(scope="module")
def vllm_engine(model_path):
    from grl.engines import make_engine

    # The only sleep-mode engine of the tests/gpu process: sleep mode turns on vLLM's CuMem allocator, a
    # process-wide singleton whose pool must be empty when an engine loads its weights
    # (vllm/v1/worker/gpu_worker.py, "one instance per process"), and shutdown does not promise to empty
    # it. Every test that sleeps shares this engine; test_vllm_grammar_gpu.py builds its own without.
    engine = make_engine(
        "vllm", model_path, dtype="float32", device="cuda", gpu_memory_utilization=0.3, free_cache_engine=True
    )
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def hf_engine(model_path):
    from grl.engines import make_engine

    engine = make_engine("hf", model_path, dtype="float32", device="cuda")
    yield engine
    engine.shutdown()


def greedy(max_new_tokens=32):
    from grl.engines import SamplingParams

    return SamplingParams(greedy=True, max_new_tokens=max_new_tokens)


def free_bytes():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


@needs_vllm
def test_vllm_sleep_gives_memory_back(vllm_engine, prompts):
    before = vllm_engine.generate(prompts, greedy())
    awake_free = free_bytes()
    vllm_engine.sleep()
    asleep_free = free_bytes()
    total = torch.cuda.mem_get_info()[1]
    # gpu_memory_utilization=0.3 reserved ~30% of the device for weights and KV cache.
    assert asleep_free - awake_free > 0.2 * total
    vllm_engine.wake()
    assert abs(free_bytes() - awake_free) < 1 * GIB
    assert [o.token_ids for o in vllm_engine.generate(prompts, greedy())] == [o.token_ids for o in before]


@needs_vllm
def test_colocated_sync_from_an_actor_model(vllm_engine, hf_engine, prompts, model_path):
    from grl.models import load_causal_lm

    actor = load_causal_lm(model_path, "float32", "cuda").to("cuda")
    before = vllm_engine.generate(prompts, greedy())
    generator = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for param in actor.parameters():
            param.add_(0.02 * param.std() * torch.randn(param.shape, generator=generator, device="cuda"))
    # The hybrid-engine order: sleep for the update, wake the weights, load, then the KV cache.
    vllm_engine.sleep()
    vllm_engine.update_weights(actor.state_dict())
    vllm_engine.wake()
    hf_engine.update_weights(actor.named_parameters())
    ours, reference = vllm_engine.generate(prompts, greedy()), hf_engine.generate(prompts, greedy())
    # Two engines, two sets of kernels (vLLM's attention and fused layers against transformers'): their
    # fp32 sums round differently, so a near-tie between the two best tokens may flip one reply, and
    # the rest of that reply with it. vLLM repeats only its own outputs (the same batch on the same
    # kernels; VLLM_BATCH_INVARIANT extends that across batch shapes), never another library's: the
    # tolerance of test_vllm_grammar_gpu.py. The engine against itself, below and in the sleep tests,
    # runs the same batch and must match exactly.
    assert sum(a.token_ids == b.token_ids for a, b in zip(ours, reference)) >= len(prompts) - 1
    assert [o.token_ids for o in ours] != [o.token_ids for o in before]
    original = load_causal_lm(model_path, "float32", "cuda").state_dict()
    vllm_engine.update_weights(original)
    hf_engine.update_weights(original)
    assert [o.token_ids for o in vllm_engine.generate(prompts, greedy())] == [o.token_ids for o in before]


@needs_vllm
def test_vllm_level_2_sleep_and_reload_give_the_same_replies(vllm_engine, prompts, model_path):
    """The path of every colocated step that syncs (grl/trainer/agent_trainer.py): sleep without the
    weights (vLLM level 2 drops them and keeps only the model's buffers), stream the same weights back
    in, and let the next generate take the KV cache back. vLLM has reports of silently wrong outputs
    after level 2; anything it fails to restore changes a reply or a log-prob here."""
    from grl.engines.weights import TensorStream
    from grl.models import load_causal_lm

    weights = load_causal_lm(model_path, "float32", "cuda").state_dict()
    vllm_engine.update_weights(weights)  # known weights, whatever an earlier test left in the engine
    before = vllm_engine.generate(prompts, greedy())
    awake_free = free_bytes()
    vllm_engine.sleep(discard_weights=True)
    # A no-op sleep (sleep mode off) would pass the comparison below without testing level 2.
    assert free_bytes() - awake_free > 0.2 * torch.cuda.mem_get_info()[1]
    with pytest.raises(RuntimeError, match="discard_weights=True"):
        vllm_engine.wake()  # the memory holds no weights until update_weights
    # Lazily, one tensor at a time, as the trainer's sync streams them (grl/workers/streaming.py).
    vllm_engine.update_weights(
        TensorStream({name: tuple(t.shape) for name, t in weights.items()}, weights.items())
    )
    after = vllm_engine.generate(prompts, greedy())
    # Same engine, weights, batch and kernels: greedy decoding repeats itself exactly, and fp32
    # log-probs agree far below what a wrong weight or buffer would move them.
    assert [o.token_ids for o in after] == [o.token_ids for o in before]
    for a, b in zip(after, before):
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), rtol=0, atol=1e-4)


def test_hf_sleep_moves_weights_off_the_device(hf_engine, prompts):
    before = hf_engine.generate(prompts[:2], greedy(16))
    allocated = torch.cuda.memory_allocated()
    hf_engine.sleep()
    assert torch.cuda.memory_allocated() < allocated - 0.3 * GIB  # 135M fp32 weights: ~0.5 GiB
    hf_engine.wake()
    assert [o.token_ids for o in hf_engine.generate(prompts[:2], greedy(16))] == [o.token_ids for o in before]
