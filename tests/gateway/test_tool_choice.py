"""`tool_choice` `"required"` and a named function, enforced by a grammar on the reply: the untrained tiny
model,
which never writes a tool call of its own, answers with a call the real `openai` client reads, in the family's
format of the real Qwen2.5 and Llama 3.1 templates; the recorded ids are those sampled, under the grammar's
allowed sets. The JSON object grammar itself is checked against `json.loads` over every token it allows."""

import json
import random

import httpx
import pytest

from grl.engines.constraint import compile_call_grammar
from grl.engines.json_grammar import START, JsonVocabulary, completion, run, token_texts
from grl.gateway import Gateway
from grl.rollout.chat import ChatTokens
from grl.toolcalls import FAMILIES, call_frames, split_tool_calls
from tests.gateway.served import client, serve
from tests.gateway.templates import LLAMA31

QUESTION = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What is the weather in Paris?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}},
]
NAMED = {"type": "function", "function": {"name": "search"}}


def ask(base: str, path: str = "/v1", **change):
    body = {
        "model": "tiny",
        "messages": QUESTION,
        "tools": TOOLS,
        "max_tokens": 40,
        "temperature": 0,
        **change,
    }
    return client(base, path).chat.completions.create(**body)


def test_the_untrained_model_calls_a_tool_only_when_tool_choice_requires_it(served):
    _, base = served
    free = ask(base, tool_choice="auto").choices[0]
    assert not free.message.tool_calls  # the control: on its own it writes text
    for choice, names in (("required", {"weather", "search"}), (NAMED, {"search"})):
        reply = ask(base, tool_choice=choice).choices[0]
        assert reply.finish_reason == "tool_calls" and reply.message.content is None
        [call] = reply.message.tool_calls
        assert call.function.name in names
        assert isinstance(json.loads(call.function.arguments), dict)


def test_a_sampled_forced_call_is_recorded_with_its_grammar(served):
    gateway, base = served
    reply = ask(base, "/episodes/forced/v1", tool_choice=NAMED, temperature=1.0, seed=3)
    [call] = reply.choices[0].message.tool_calls
    assert call.function.name == "search"
    recorded = gateway.episodes["forced"].calls[0]
    assert reply.model_extra["grl"]["completion_token_ids"] == [recorded.completion_ids]
    assert len(recorded.allowed) == len(recorded.completion_ids) and any(
        size > 0 for size, _ in recorded.allowed
    )


def test_llama_3_1_gets_its_own_call_format(tiny):
    tokenizer, engine = tiny
    gateway = Gateway(engine, tokenizer, "tiny", max_tokens=40, context=2048, chat_template=LLAMA31)
    assert gateway.tool_parser == "llama3_json"
    with serve(gateway) as base:
        reply = ask(base, tool_choice=NAMED)
    [call] = reply.choices[0].message.tool_calls
    ids = reply.model_extra["grl"]["completion_token_ids"][0]
    assert call.function.name == "search" and tokenizer.decode(ids).startswith(
        '{"name": "search", "parameters": {'
    )


def test_a_call_that_cannot_fit_is_refused_in_one_line(served):
    _, base = served

    body = {"model": "tiny", "messages": QUESTION, "tools": TOOLS, "tool_choice": "required", "max_tokens": 4}
    response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("tool_choice: no tool call fits in 4 reply tokens")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_reply_the_grammar_allows_is_one_parsable_call(tiny, family):
    """Random walks, each token drawn uniformly from the allowed set: a slow, blind sampler that reaches
    escapes, numbers, literals and nesting; each reply ends within its budget and parses to one call."""
    tokenizer, _ = tiny
    chat = ChatTokens(tokenizer, {})
    vocabulary = JsonVocabulary(token_texts(tokenizer))
    rng = random.Random(family)
    frames = call_frames(family, ["weather", "search"])
    for budget in (32, 48, 64):
        grammar = compile_call_grammar(chat.encode, chat.end_ids(), frames, vocabulary, budget)
        walker, tokens = grammar.walker(), []
        while not walker.done:
            size, ids = walker.allowed()
            token = rng.choice(ids) if size > 0 else rng.randrange(len(tokenizer))
            while size < 0 and token in ids:
                token = rng.randrange(len(tokenizer))
            tokens.append(token)
            walker.advance(token)
        assert len(tokens) <= budget and tokens[-1] == chat.end_ids()[0]
        content, calls = split_tool_calls(tokenizer.decode(tokens[:-1]), family)
        assert content is None and [c["function"]["name"] for c in calls] in (["weather"], ["search"])
        if family != "qwen3_coder":
            assert isinstance(json.loads(calls[0]["function"]["arguments"]), dict)


@pytest.mark.parametrize(
    "text, valid",
    [
        ('{"a": [1, -2.5e+3, true, null, {"b": "x\\u00e9\\n"}]}', True),
        ('{"a": 01}', False),
        ('{"a": "\\ud800"}', False),  # a lone surrogate
        ('{"a" 1}', False),
        ('{"a": "tab\there"}', False),  # a raw control character
        ("{}", True),
        ('{"a": 1,}', False),
    ],
)
def test_the_json_recogniser_agrees_with_json_loads(text, valid):
    state = run(START, text)
    assert (state is not None and state[1] == "D") == valid
    if valid:  # every prefix can still close, in the characters `completion` counts
        assert all(completion(run(START, text[:k])) <= len(text) - k for k in range(len(text)))
