"""The OpenAI-compatible gateway, served for real (uvicorn on 127.0.0.1) and called with the `openai` client:
the reply is the engine's own tokens, an episode that continues its conversation is one training row of
exactly those tokens, an edited history is a counted prefix break, and bad requests are one line."""

import json
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from grl.engines.base import SamplingParams
from grl.gateway import Gateway, tool_calls_of
from grl.rollout.batch import episode_tokens
from grl.rollout.chat import ChatTokens
from grl.rollout.types import Episode
from tests.gateway.served import client, free_port, serve
from tests.gateway.templates import QWEN25

ROOT = Path(__file__).resolve().parents[2]
QUESTION = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What is 2 + 3?"},
]


@pytest.fixture(scope="module")
def served(tiny):
    tokenizer, engine = tiny
    gateway = Gateway(engine, tokenizer, "tiny", max_tokens=16, context=2048)
    with serve(gateway) as base:
        yield gateway, base


def grl_ids(response) -> dict:
    return response.model_extra["grl"]


def trained_row(log):
    """The episode's tokens as the trainer flattens them (grl/rollout/batch.py)."""
    return episode_tokens(Episode("program", 0, 0, log.turns(), score=0.0), use_turn_scores=False)


def test_models_names_the_served_model(served):
    _, base = served
    assert [m.id for m in client(base).models.list().data] == ["tiny"]


def test_a_reply_is_the_engines_own_sampled_tokens(served):
    gateway, base = served
    response = client(base).chat.completions.create(
        model="tiny", messages=QUESTION, max_tokens=8, temperature=0
    )
    ids = grl_ids(response)
    prompt = ChatTokens(gateway.tokenizer).first_prompt(QUESTION)
    direct = gateway.engine.generate([prompt], SamplingParams(temperature=0, greedy=True, max_new_tokens=8))[
        0
    ]
    assert ids["prompt_token_ids"] == prompt and ids["completion_token_ids"] == [direct.token_ids]
    assert response.choices[0].message.content == gateway.tokenizer.decode(
        direct.token_ids, skip_special_tokens=True
    )
    assert response.usage.prompt_tokens == len(prompt) and response.usage.completion_tokens == len(
        direct.token_ids
    )


def test_a_program_that_continues_its_conversation_trains_on_one_row_of_the_sampled_ids(served):
    gateway, base = served
    talk = client(base, "/episodes/continued/v1")
    first = talk.chat.completions.create(
        model="tiny", messages=QUESTION, max_tokens=6, temperature=1.0, seed=3
    )
    history = QUESTION + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And 3 + 4?"},
    ]
    second = talk.chat.completions.create(
        model="tiny", messages=history, max_tokens=6, temperature=1.0, seed=4
    )
    log = gateway.episodes["continued"]
    one, two = grl_ids(first), grl_ids(second)
    assert [c.continues for c in log.calls] == [False, True] and log.prefix_breaks == 0
    # The second prompt holds the first reply as sampled, then only what the template puts after it.
    sampled_first = one["completion_token_ids"][0]
    assert (
        two["prompt_token_ids"][: len(one["prompt_token_ids"]) + len(sampled_first)]
        == one["prompt_token_ids"] + sampled_first
    )
    between = two["prompt_token_ids"][len(one["prompt_token_ids"]) + len(sampled_first) :]
    assert "And 3 + 4?" in gateway.tokenizer.decode(between)
    row = trained_row(log)
    assert row.input_ids == two["prompt_token_ids"] + two["completion_token_ids"][0]
    assert set(row.context_ids) == {1}  # one sequence: the second call attends to the first
    trained = [t for t, m in zip(row.input_ids, row.loss_mask) if m]
    assert trained == sampled_first + two["completion_token_ids"][0]
    assert [p for p, m in zip(row.rollout_log_probs, row.loss_mask) if m] == pytest.approx(
        one["log_probs"][0] + two["log_probs"][0]
    )


def test_an_edited_history_starts_a_row_of_its_own_and_is_counted(served):
    gateway, base = served
    talk = client(base, "/episodes/edited/v1")
    first = talk.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=6, temperature=0)
    edited = QUESTION + [
        {"role": "assistant", "content": first.choices[0].message.content + " (edited)"},
        {"role": "user", "content": "Again?"},
    ]
    second = talk.chat.completions.create(model="tiny", messages=edited, max_tokens=6, temperature=0)
    log = gateway.episodes["edited"]
    assert log.prefix_breaks == 1
    row = trained_row(log)
    second_ids = grl_ids(second)["prompt_token_ids"] + grl_ids(second)["completion_token_ids"][0]
    # The second call is a sequence of its own: its positions restart and it attends only to itself.
    assert [t for t, c in zip(row.input_ids, row.context_ids) if c == 2] == second_ids
    assert row.position_ids[-len(second_ids) :] == list(range(len(second_ids)))
    assert grl_ids(second)["prompt_token_ids"] == ChatTokens(gateway.tokenizer).first_prompt(edited)


def test_allowed_replies_decode_with_the_agents_grammar(served):
    _, base = served
    moves = ["Left", "Right", "Down"]
    response = client(base).chat.completions.create(
        model="tiny",
        messages=QUESTION,
        max_tokens=16,
        temperature=1.0,
        n=6,
        seed=0,
        extra_body={"allowed_replies": moves},
    )
    assert {c.message.content for c in response.choices} <= {f"<answer>{m}</answer>" for m in moves}
    assert all(c.finish_reason == "stop" for c in response.choices)


def test_hermes_tool_calls_become_openai_tool_calls():
    text = 'Let me run it.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(5)"}}\n</tool_call>'
    content, calls = tool_calls_of(text)
    assert content == "Let me run it." and len(calls) == 1
    assert calls[0]["function"] == {"name": "python", "arguments": json.dumps({"code": "print(5)"})}
    assert tool_calls_of("<tool_call>not json</tool_call>") == ("<tool_call>not json</tool_call>", [])


def test_tools_reach_the_chat_template(tiny):
    """Qwen2.5's template writes the tools into the system turn: the prompt is that rendering, not the
    tool-less one."""
    tokenizer, engine = tiny
    gateway = Gateway(engine, tokenizer, "tiny", max_tokens=4, context=2048, chat_template=QWEN25)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "python",
                "description": "run Python code",
                "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
            },
        }
    ]
    with serve(gateway) as base:
        response = client(base).chat.completions.create(
            model="tiny", messages=QUESTION, tools=tools, max_tokens=4, temperature=0
        )
    rendered = tokenizer.apply_chat_template(
        QUESTION, tools=tools, chat_template=QWEN25, tokenize=False, add_generation_prompt=True
    )
    assert "<tools>" in rendered and '"name": "python"' in rendered
    assert grl_ids(response)["prompt_token_ids"] == ChatTokens(tokenizer).encode(rendered)


@pytest.mark.parametrize(
    "change, says",
    [
        ({"messages": []}, "messages: a non-empty list"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0]: role must be one of"),
        ({"response_format": {"type": "json_object"}}, "response_format: only"),
        ({"top_logprobs": 3}, "top_logprobs: not supported"),
        ({"tool_choice": "required"}, "tool_choice: 'required' needs a non-empty tools list"),
        ({"n": 0}, "n: a number in [1, 16]"),
        ({"temperature": "hot"}, "temperature: a number"),
        ({"max_tokens": 10**9}, "max_tokens: a number in [1, 2048]"),
        ({"allowed_replies": []}, "allowed_replies: a non-empty list"),
    ],
)
def test_a_bad_request_is_refused_in_one_line(served, change, says):
    _, base = served
    body = {"model": "tiny", "messages": QUESTION, **change}
    response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message.startswith(says) and "\n" not in message
    assert httpx.post(f"{base}/v1/chat/completions", content=b"{not json", timeout=60).status_code == 400


class CallsAtOnce:
    """Wraps an engine's `generate` (the engine stays real) and records the most calls inside it at once.
    Each call lingers a moment first, so two calls that nothing serialises would be seen together."""

    def __init__(self, generate):
        self._generate, self._lock = generate, threading.Lock()
        self.inside = self.most = self.calls = 0

    def __call__(self, *args, **kwargs):
        with self._lock:
            self.inside += 1
            self.calls += 1
            self.most = max(self.most, self.inside)
        try:
            time.sleep(0.02)
            return self._generate(*args, **kwargs)
        finally:
            with self._lock:
                self.inside -= 1


def test_concurrent_callers_share_generates_one_at_a_time(served, monkeypatch):
    """`grl serve`'s engine runs one generate at a time, and the calls that wait meanwhile share the next
    (grl/gateway/batching.py): 32 calls from 16 threads take fewer than 32 generates."""
    gateway, base = served
    engine = gateway.engine.engine  # the real engine behind the gateway's SerialEngine
    counted = CallsAtOnce(engine.generate)
    monkeypatch.setattr(engine, "generate", counted)
    talk = client(base)
    with ThreadPoolExecutor(16) as pool:
        replies = list(
            pool.map(
                lambda i: talk.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": f"count {i}"}],
                    max_tokens=4,
                    temperature=0,
                ),
                range(32),
            )
        )
    assert len(replies) == 32 and all(r.choices[0].finish_reason in ("stop", "length") for r in replies)
    assert counted.calls < 32 and counted.most == 1, (counted.calls, counted.most)


@pytest.mark.slow
def test_grl_serve_answers_on_loopback_and_stops_on_sigterm():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "grl.cli", "serve", "tiny", "--engine", "hf", "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline, listed = time.monotonic() + 120, None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                listed = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).json()
                break
            except httpx.HTTPError:
                time.sleep(0.5)
        assert listed == {"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "grl"}]}
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    # uvicorn shuts down gracefully, then lets the signal end the process as it would have
    assert (
        proc.returncode in (0, -signal.SIGTERM) and f"grl serve: tiny at http://127.0.0.1:{port}/v1" in out
    ), out
