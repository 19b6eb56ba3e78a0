"""Whatever a client sends, the served gateway answers 200, 400 or 413 with one line, never 500: a prompt
longer
than the engine's context is cut from the left (or refused under `truncation="error"`), a body past
MAX_BODY_BYTES is 413, one nested past MAX_JSON_DEPTH, one that is not text or not finite is 400, and every
field of both APIs given a value of the wrong shape is refused."""

import json

import httpx
import pytest

from grl.gateway import Gateway
from grl.gateway.bodies import MAX_BODY_BYTES, MAX_JSON_DEPTH
from tests.gateway.served import serve

WORDS = " ".join(f"w{i}" for i in range(5000))  # about 15,000 tokens: longer than the tiny model's 4096
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
CHAT = {"messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "max_tokens": 2}
RESPONSES = {"input": "hi", "tools": [{"type": "function", "name": "f"}], "max_output_tokens": 2}
ODD = [
    None,
    True,
    5,
    -1,
    1.5,
    "x",
    "",
    [],
    {},
    [1],
    ["x"],
    [{}],
    {"a": 1},
    [[]],
    {"function": "x"},
    [{"type": "text", "text": 5}],
]


@pytest.fixture(scope="module")
def engine_sized(tiny):
    """Base URLs of gateways on the tiny model: one whose context is the engine's own, one that refuses long
    prompts instead of cutting them, and one that refuses every prompt once it is rendered (a 4-token context:
    requests are checked through to the chat template without waiting for the engine)."""
    tokenizer, engine = tiny
    cutting = Gateway(engine, tokenizer, "tiny", max_tokens=16)
    refusing = Gateway(engine, tokenizer, "tiny", max_tokens=16, truncation="error")
    tight = Gateway(engine, tokenizer, "tiny", max_tokens=2, context=4, truncation="error")
    with serve(cutting) as base, serve(refusing) as strict, serve(tight) as rendered_only:
        yield base, strict, rendered_only


def post(base: str, path: str, **kwargs) -> httpx.Response:
    return httpx.post(f"{base}/v1/{path}", timeout=120, **kwargs)


def refusal(response: httpx.Response, status: int = 400) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    assert "\n" not in message
    return message


def test_the_context_is_the_engines_and_a_longer_prompt_is_cut_on_the_left_or_refused(engine_sized, tiny):
    base, strict, _ = engine_sized
    tokenizer, engine = tiny
    assert (
        engine.context_length() == 4096
    )  # the tiny model's max_position_embeddings, not its tokenizer's 8192
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": WORDS + " THE END"}]
    chat, responses = (
        {"messages": messages, "max_tokens": 16},
        {"instructions": "Be brief.", "input": WORDS + " THE END"},
    )
    for path, body in (("chat/completions", chat), ("responses", responses)):
        reply = post(base, path, json=body)
        assert reply.status_code == 200, reply.text
        prompt = reply.json()["grl"]["prompt_token_ids"]
        assert (
            4096 - 16 - 8 < len(prompt) <= 4096 - 16
        )  # cut to what the reply leaves, not to a smaller bound
        text = tokenizer.decode(prompt)
        assert (
            "Be brief." in text[:200] and "THE END" in text[-200:] and "w0 w1 w2 " not in text
        )  # cut on the left
        assert "exceed the context of 4096" in refusal(post(strict, path, json=body))


def test_a_body_past_the_limit_is_413(engine_sized):
    base, _, _ = engine_sized
    huge = json.dumps({"messages": [{"role": "user", "content": "x" * MAX_BODY_BYTES}]}).encode()
    for path in ("chat/completions", "responses"):
        assert "more than the gateway takes" in refusal(post(base, path, content=huge), 413)

    def chunked():  # no Content-Length: the limit holds while the body is read
        yield from (huge[i : i + 2**16] for i in range(0, len(huge), 2**16))

    assert "more than the gateway takes" in refusal(post(base, "chat/completions", content=chunked()), 413)


@pytest.mark.parametrize(
    "raw, says",
    [
        (
            b"[" * 100_000 + b"]" * 100_000,
            f"the body nests deeper than {MAX_JSON_DEPTH} levels",
        ),  # Python's parser recurses
        (
            b'{"a": ' * MAX_JSON_DEPTH + b"1" + b"}" * MAX_JSON_DEPTH,
            "messages: a non-empty list",
        ),  # as deep as allowed
        (b'{"a": ' * (MAX_JSON_DEPTH + 1) + b"1" + b"}" * (MAX_JSON_DEPTH + 1), "the body nests deeper"),
        (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "the body holds a lone UTF-16 surrogate"),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
            "the body holds the number nan",
        ),
        (
            b'{"messages": [{"role": "user", "content": "hi"}], "parallel_tool_calls": 1e999}',
            "the body holds the number inf",
        ),
        (b"{not json", "the body is not JSON"),
        (b'{"messages": "\xff"}', "the body is not JSON"),
    ],
    ids=[
        "100k-deep",
        "at-the-depth",
        "past-the-depth",
        "surrogate",
        "nan",
        "infinite",
        "not-json",
        "not-utf8",
    ],
)
def test_a_body_that_is_too_deep_not_text_or_not_finite_is_refused_in_one_line(engine_sized, raw, says):
    base, _, _ = engine_sized
    for path in ("chat/completions", "responses"):
        message = refusal(post(base, path, content=raw))
        assert message.startswith(says) or path == "responses" and says.startswith("messages"), message


def test_a_field_of_the_wrong_shape_is_refused_never_a_server_error(engine_sized):
    *_, rendered_only = engine_sized
    bodies = [
        ("chat/completions", {**CHAT, key: value})
        for key in [*CHAT, "tool_choice", "n", "stop"]
        for value in ODD
    ]
    bodies += [
        ("chat/completions", {**CHAT, "messages": [{"role": "user", "content": value}]}) for value in ODD
    ]
    bodies += [
        ("chat/completions", {**CHAT, "tools": [{"type": "function", "function": value}]}) for value in ODD
    ]
    bodies += [
        ("chat/completions", {**CHAT, "tool_choice": {"type": "function", "function": value}})
        for value in ODD
    ]
    bodies += [
        ("responses", {**RESPONSES, key: value})
        for key in [*RESPONSES, "instructions", "tool_choice"]
        for value in ODD
    ]
    for item in (
        {"type": "message", "role": "user"},
        {"type": "reasoning"},
        {"type": "function_call_output", "call_id": "1"},
    ):
        for key in ("role", "content", "summary", "output"):
            bodies += [("responses", {**RESPONSES, "input": [{**item, key: value}]}) for value in ODD]
    rendered = 0
    with httpx.Client(
        base_url=f"{rendered_only}/v1", timeout=60
    ) as http:  # one connection: seconds for them all
        for path, body in bodies:
            message = refusal(http.post(path, json=body))  # 400, never 500
            rendered += message.startswith("messages: ") and "exceed the context of 4" in message
    assert 50 < rendered < len(bodies) - 100, (
        rendered
    )  # many bodies reach the template, many are refused before
