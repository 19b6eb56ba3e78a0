"""Prompt log-probs, as a served teacher gives them: the hf engine's against one unpadded forward pass per
prompt, and `grl serve`'s `POST /v1/completions` (`echo`, `max_tokens: 0`) and `POST /tokenize` over HTTP in
the shape vLLM's server answers, refusing every other use with one line naming the field."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch

from grl.engines import SamplingParams
from grl.engines.hf_scoring import prompt_log_probs
from grl.gateway import Gateway
from grl.gateway.batching import BatchingEngine
from tests.gateway.served import serve
from tests.gateway.templates import QWEN25

TEXTS = [
    "Hi",
    "The quick brown fox jumps over the lazy dog.",
    "What is 2 + 3? Four, says the model, which is wrong.",
    "A much longer prompt: " + "the sea is calm and the boats are out; " * 12,
    "Paris is in France",
]


@pytest.fixture(scope="module")
def hf(tiny):
    return tiny[1].engine  # the HFEngine behind the gateway's SerialEngine, fp32 on the CPU


@pytest.fixture(scope="module")
def prompts(tiny):
    tokenizer = tiny[0]
    return [tokenizer.encode(text, add_special_tokens=False) for text in TEXTS]


def reference(model, prompt: list[int]) -> list[float]:
    """One forward pass of the prompt alone (no padding, no batch), fp32 log-softmax, gathered at the next
    token."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].float()
    log_probs = logits.log_softmax(-1)
    return [log_probs[t - 1, prompt[t]].item() for t in range(1, len(prompt))]


def assert_close(got: list[float], want: list[float], tol: float = 1e-5) -> None:
    assert len(got) == len(want)
    assert max((abs(a - b) for a, b in zip(got, want)), default=0.0) < tol


def test_hf_prompt_log_probs_equal_a_forward_per_prompt(hf, prompts):
    assert len({len(p) for p in prompts}) == len(prompts)  # lengths differ: the batch is padded
    got = hf.prompt_log_probs(prompts)
    for prompt, scores in zip(prompts, got):
        assert_close(scores, reference(hf.model, prompt))


def test_hf_prompt_log_probs_in_row_chunks_and_position_segments(hf, prompts, monkeypatch):
    """Chunks of two rows, and a logits budget of a few positions a forward (the KV-cached segments a long
    episode over a large vocabulary runs in), score as one forward per prompt does."""
    monkeypatch.setattr(hf, "max_batch_size", 2)
    vocab = hf.model.config.vocab_size
    for budget in (2 * 3 * vocab, 1):  # three positions of two rows a forward; one position a forward
        got = prompt_log_probs(hf, prompts + [[prompts[1][0]]], logits_budget=budget)
        assert got[-1] == []  # a one-token prompt has nothing to score
        for prompt, scores in zip(prompts, got):
            assert_close(scores, reference(hf.model, prompt))


def test_hf_prompt_log_probs_leave_the_prefix_cache_and_refuse_an_empty_prompt(hf, prompts):
    hf.generate(prompts[:2], SamplingParams(greedy=True, max_new_tokens=4))  # fills the prefix cache

    def state():
        store = hf.prefixes
        held = (store.next, store.last, store.extended, store.ages)
        return [id(part) for part in held], {ids: id(kv) for ids, kv in store.next.items()}, store.held_bytes

    before = state()
    assert before[1]
    hf.prompt_log_probs(prompts)
    assert state() == before
    with pytest.raises(ValueError, match="prompt_log_probs: prompt 1 is empty"):
        hf.prompt_log_probs([prompts[0], []])


def scoring(prompt, **fields) -> dict:
    return {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": 0,
        "echo": True,
        "logprobs": 0,
        "temperature": 1.0,
        **fields,
    }


def test_served_completions_echo_the_prompt_log_probs(served, hf, prompts, tiny):
    tokenizer = tiny[0]
    _, base = served
    one = httpx.post(f"{base}/v1/completions", json=scoring(prompts[2]), timeout=60).json()
    assert (one["object"], one["model"], len(one["choices"])) == ("text_completion", "tiny", 1)
    choice = one["choices"][0]
    assert (choice["index"], choice["finish_reason"], choice["text"]) == (
        0,
        "length",
        tokenizer.decode(prompts[2]),
    )
    logprobs = choice["logprobs"]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"] is None
    assert_close(logprobs["token_logprobs"][1:], reference(hf.model, prompts[2]))
    assert logprobs["tokens"] == [tokenizer.decode([t]) for t in prompts[2]]
    assert logprobs["text_offset"] == [
        sum(len(piece) for piece in logprobs["tokens"][:i]) for i in range(len(prompts[2]))
    ]
    assert one["usage"] == {
        "prompt_tokens": len(prompts[2]),
        "completion_tokens": 0,
        "total_tokens": len(prompts[2]),
    }

    several = httpx.post(f"{base}/v1/completions", json=scoring(prompts), timeout=60).json()
    assert [c["index"] for c in several["choices"]] == list(range(len(prompts)))
    for prompt, choice in zip(prompts, several["choices"]):
        scores = choice["logprobs"]["token_logprobs"]
        assert scores[0] is None
        assert_close(scores[1:], reference(hf.model, prompt))
    assert several["usage"]["prompt_tokens"] == sum(len(p) for p in prompts)


def test_concurrent_scoring_calls_each_get_their_own_prompts(served, hf, prompts):
    """Calls that wait on the engine share its next call (grl/gateway/batching.py), beside a chat call."""
    _, base = served
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

    def post(i):
        if i == len(prompts):
            return httpx.post(f"{base}/v1/chat/completions", json=chat, timeout=60)
        return httpx.post(f"{base}/v1/completions", json=scoring(prompts[i]), timeout=60)

    with ThreadPoolExecutor(len(prompts) + 1) as pool:
        answers = list(pool.map(post, range(len(prompts) + 1)))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    for prompt, answer in zip(prompts, answers):
        assert_close(
            answer.json()["choices"][0]["logprobs"]["token_logprobs"][1:], reference(hf.model, prompt)
        )


@pytest.mark.parametrize(
    "change, says",
    [
        ({"prompt": "some text"}, "prompt: token ids"),
        ({"prompt": ["some", "text"]}, "prompt: token ids"),
        ({"prompt": []}, "prompt: token ids"),
        ({"prompt": [[5, 6], []]}, "prompt[1]: a non-empty list of token ids"),
        ({"prompt": [[5, 6], [7, 1.5]]}, "prompt[1]: a non-empty list of token ids"),
        ({"prompt": [5, 10**6]}, "prompt: token id 1000000 is outside the vocabulary (0..49151)"),
        ({"prompt": [5, -1]}, "prompt: token id -1 is outside the vocabulary"),
        ({"prompt": [5] * 2049}, "prompt: 2049 tokens exceed the context of 2048"),
        ({"max_tokens": 4}, "max_tokens: must be 0"),
        ({"max_tokens": None}, "max_tokens: must be 0"),
        ({"echo": False}, "echo: must be true"),
        ({"logprobs": 1}, "logprobs: only 0"),
        ({"logprobs": 5}, "logprobs: only 0"),
        ({"prompt_logprobs": 2}, "prompt_logprobs: only 0"),
        ({"temperature": 0.7}, "temperature: the prompt's log-probs are at temperature 1"),
        ({"temperature": 0}, "temperature: the prompt's log-probs are at temperature 1"),
        ({"n": 2}, "n: one choice per prompt"),
        ({"stream": True}, "stream: not supported"),
    ],
)
def test_served_completions_refuse_what_is_not_prompt_scoring(served, change, says):
    _, base = served
    response = httpx.post(f"{base}/v1/completions", json={**scoring([5, 6, 7]), **change}, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(says) and "\n" not in error["message"], error["message"]


def test_served_completions_without_a_body_object_or_a_scoring_engine(served, tiny):
    _, base = served
    response = httpx.post(f"{base}/v1/completions", json=[1, 2], timeout=60)
    assert (response.status_code, response.json()["error"]["message"]) == (
        400,
        "the body must be a JSON object",
    )
    tokenizer, engine = tiny
    # The trainer's gateway: its engine generates for the rollout's episodes and scores nothing.
    trainer_side = Gateway(
        BatchingEngine(engine.engine), tokenizer, "tiny", context=2048, chat_template=QWEN25
    )
    with serve(trainer_side) as other:
        response = httpx.post(f"{other}/v1/completions", json=scoring([5, 6, 7]), timeout=60)
    assert response.status_code == 501
    assert response.json()["error"]["message"].startswith("prompt: this gateway's engine does not score")


def test_served_tokenize_returns_the_tokenizer_ids_and_the_context(served, tiny):
    tokenizer = tiny[0]
    _, base = served
    text = "<|im_start|>user\nHello there, what is 2 + 3?<|im_end|>"
    plain = httpx.post(
        f"{base}/tokenize", json={"model": "tiny", "prompt": text, "add_special_tokens": False}, timeout=60
    ).json()
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert plain == {"count": len(ids), "max_model_len": 2048, "tokens": ids, "token_strs": None}
    default = httpx.post(
        f"{base}/tokenize", json={"prompt": text, "return_token_strs": True}, timeout=60
    ).json()
    assert default["tokens"] == tokenizer.encode(text)  # add_special_tokens defaults to true, as in vLLM
    assert default["token_strs"] == tokenizer.convert_ids_to_tokens(default["tokens"])
    for body, says in [
        ({"prompt": [1, 2]}, "prompt: a string of text"),
        (
            {"prompt": "hi", "add_special_tokens": "no"},
            "add_special_tokens, return_token_strs: true or false",
        ),
        ({"messages": [{"role": "user", "content": "hi"}]}, "messages: only a text prompt is tokenized"),
    ]:
        response = httpx.post(f"{base}/tokenize", json=body, timeout=60)
        assert (response.status_code, response.json()["error"]["message"][: len(says)]) == (400, says)
