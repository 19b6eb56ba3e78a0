"""Tool calls and reasoning per model family, against the families' real chat templates
(tests/gateway/templates.py)
on the tiny model's tokenizer: a tool call a template writes for an assistant turn parses back to the same
call,
a conversation continued after a tool call or a thinking reply is the recorded ids plus exactly what the
template puts after them, and the parsers read every family's format."""

import json

import pytest

from grl.gateway import Gateway
from grl.gateway.episodes import Call, EpisodeLog, tools_key
from grl.gateway.requests import chat_request
from grl.toolcalls import family_of, split_tool_calls
from tests.gateway.templates import LLAMA31, QWEN3, QWEN3_CODER_MARKERS, QWEN25

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "description": "run Python code",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    },
]
QUESTION = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What is 2 + 3?"},
]
CALLS = [("python", {"code": "print(2 + 3)"}), ("search", {"q": "sum of 2 and 3"})]


def openai_calls(calls) -> list[dict]:
    """Tool calls as an OpenAI client sends them back: ids, and arguments as a JSON string."""
    return [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for i, (name, args) in enumerate(calls)
    ]


def gateway_for(tokenizer, template: str) -> Gateway:
    return Gateway(
        None, tokenizer, "tiny", max_tokens=64, context=4096, chat_template=template
    )  # replies only: no engine


def request(**fields):
    return chat_request({"messages": QUESTION, "tools": TOOLS, **fields}, 64, 4096)


def sampled(gateway: Gateway, text: str) -> list[int]:
    """The ids a model of the family samples for reply `text`: the text, then its end-of-turn token."""
    return gateway.chat(request()).encode(text) + [gateway.tokenizer.eos_token_id]


def assistant_text(tokenizer, template: str, calls, end: str, **kwargs) -> str:
    """What `template` writes for an assistant turn holding `calls`, between the generation prompt and
    `end`."""
    head = tokenizer.apply_chat_template(
        QUESTION, tools=TOOLS, chat_template=template, tokenize=False, add_generation_prompt=True, **kwargs
    )
    whole = tokenizer.apply_chat_template(
        [
            *QUESTION,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls
                ],
            },
        ],
        tools=TOOLS,
        chat_template=template,
        tokenize=False,
        **kwargs,
    )
    assert whole.startswith(head), (head, whole)
    return whole[len(head) :].split(end)[0]


def test_the_family_is_read_from_the_chat_template(tiny):
    tokenizer, _ = tiny
    assert [
        family_of(t)
        for t in (
            QWEN25,
            QWEN3,
            LLAMA31,
            QWEN3_CODER_MARKERS,
            "{{ '[TOOL_CALLS]' }}",
            tokenizer.chat_template,
        )
    ] == [
        "hermes",
        "hermes",
        "llama3_json",
        "qwen3_coder",
        "mistral",
        "hermes",
    ]
    assert gateway_for(tokenizer, LLAMA31).tool_parser == "llama3_json"
    with pytest.raises(ValueError, match="tool_parser: 'nope' is not one of"):
        Gateway(None, tokenizer, "tiny", tool_parser="nope")


@pytest.mark.parametrize(
    "template, calls, end, kwargs",
    [
        (QWEN25, CALLS, "<|im_end|>", {}),
        (QWEN3, CALLS, "<|im_end|>", {"enable_thinking": False}),
        (QWEN3, CALLS[:1], "<|im_end|>", {}),
        (LLAMA31, CALLS[:1], "<|eot_id|>", {}),  # Llama 3.1's template refuses parallel calls
    ],
    ids=["qwen2.5-parallel", "qwen3-no-thinking-parallel", "qwen3-thinking", "llama3.1"],
)
def test_a_tool_call_the_template_writes_parses_back_to_the_same_call(tiny, template, calls, end, kwargs):
    tokenizer, _ = tiny
    gateway = gateway_for(tokenizer, template)
    text = assistant_text(tokenizer, template, calls, end, **kwargs)
    reply = gateway.reply(sampled(gateway, text), request())
    assert [
        (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reply["tool_calls"]
    ] == calls
    assert not (reply["content"] or "").strip() and all(
        c["id"].startswith("call_") for c in reply["tool_calls"]
    )
    assert (
        gateway.reply(sampled(gateway, text), request(parallel_tool_calls=False))["tool_calls"][0][
            "function"
        ]["name"]
        == "python"
    )
    assert len(gateway.reply(sampled(gateway, text), request(parallel_tool_calls=False))["tool_calls"]) == 1
    assert "tool_calls" not in gateway.reply(
        sampled(gateway, text), request(tool_choice="none")
    )  # no tools shown: plain text


@pytest.mark.parametrize(
    "template, kwargs, expected_tail",
    [
        (
            QWEN25,
            {},
            "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
        ),
        (
            QWEN3,
            {"enable_thinking": False},
            "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
        ),
        (
            LLAMA31,
            {},
            "<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n5<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        ),
    ],
    ids=["qwen2.5", "qwen3-no-thinking", "llama3.1"],
)  # the reply ends in the tiny tokenizer's <|im_end|>: Qwen's end of turn, not Llama's
def test_a_tool_result_continues_the_recorded_ids_with_what_the_template_writes_after_the_call(
    tiny, template, kwargs, expected_tail
):
    tokenizer, _ = tiny
    gateway = Gateway(None, tokenizer, "tiny", context=4096, chat_template=template)
    gateway.template_kwargs.update(kwargs)
    chat = gateway.chat(request())
    first = chat.first_prompt(QUESTION)
    text = assistant_text(
        tokenizer, template, CALLS[:1], "<|eot_id|>" if template is LLAMA31 else "<|im_end|>", **kwargs
    )
    ids = chat.encode(text) + [tokenizer.eos_token_id]
    returned = gateway.reply(ids, request())
    log = EpisodeLog(
        [Call(QUESTION, returned, first, ids, [0.0] * len(ids), False, tools=tools_key(TOOLS, None))]
    )
    history = [
        *QUESTION,
        {"role": "assistant", "content": returned["content"], "tool_calls": openai_calls(CALLS[:1])},
    ]
    history.append({"role": "tool", "tool_call_id": "call_0", "content": "5"})
    prompt, parent = log.prompt_for(history, chat, tools_key(TOOLS, None))
    assert parent == 0 and prompt[: len(first) + len(ids)] == first + ids
    assert tokenizer.decode(prompt[len(first) + len(ids) :]) == expected_tail
    if (
        template is QWEN25
    ):  # it renders the call in history as the model wrote it: the whole rendering is the same ids
        assert prompt == chat.first_prompt(history)
    # a different tool list is another prompt: the call is rendered whole
    assert log.prompt_for(history, chat, tools_key(TOOLS[:1], None))[1] is None


@pytest.mark.parametrize(
    "sent_back",
    [
        {"role": "assistant", "content": "5"},  # reasoning stripped, as Qwen advises
        {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n5"},  # reasoning kept in the text
        {"role": "assistant", "content": "5", "reasoning_content": "Add them."},  # as the gateway returned it
    ],
    ids=["stripped", "in-content", "reasoning_content"],
)
def test_qwen3_thinking_continues_whether_the_program_keeps_the_reasoning_or_strips_it(tiny, sent_back):
    tokenizer, _ = tiny
    gateway = gateway_for(tokenizer, QWEN3)
    chat = gateway.chat(chat_request({"messages": QUESTION}, 64, 4096))
    first = chat.first_prompt(QUESTION)
    ids = chat.encode("<think>\nAdd them.\n</think>\n\n5") + [tokenizer.eos_token_id]
    returned = gateway.reply(ids, chat_request({"messages": QUESTION}, 64, 4096))
    assert returned == {"role": "assistant", "content": "5", "reasoning_content": "Add them."}
    log = EpisodeLog([Call(QUESTION, returned, first, ids, [0.0] * len(ids), False)])
    history = [*QUESTION, sent_back, {"role": "user", "content": "And 3 + 4?"}]
    prompt, parent = log.prompt_for(history, chat)
    # the record keeps the thinking the model sampled; only the new user turn is rendered
    assert parent == 0 and prompt == first + ids + chat.encode(
        "\n<|im_start|>user\nAnd 3 + 4?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert log.prompt_for([*QUESTION, {"role": "assistant", "content": "6"}, history[-1]], chat)[1] is None


def test_a_reply_cut_while_thinking_is_all_reasoning(tiny):
    tokenizer, _ = tiny
    gateway = gateway_for(tokenizer, QWEN3)
    plain = chat_request({"messages": QUESTION}, 64, 4096)
    cut = gateway.reply(gateway.chat(plain).encode("<think>\nFirst I add"), plain)
    assert cut == {"role": "assistant", "content": "", "reasoning_content": "First I add"}
    assert "reasoning_content" not in gateway_for(tokenizer, QWEN25).reply(
        gateway.chat(plain).encode("5"), plain
    )


@pytest.mark.parametrize(
    "family, text, content",
    [
        (
            "hermes",
            'Run both.\n<tool_call>\n{"name": "python", "parameters": {"code": "print(2 + 3)"}}\n'
            "</tool_call>\n"
            '<tool_call>\n{"name": "search", "arguments": {"q": "sum of 2 and 3"}}\n</tool_call>',
            "Run both.",
        ),
        (
            "llama3_json",
            '<|python_tag|>{"name": "python", "parameters": {"code": "print(2 + 3)"}}; '
            '{"name": "search", "parameters": {"q": "sum of 2 and 3"}}',
            None,
        ),
        (
            "llama3_json",
            '{"name": "python", "parameters": {"code": "print(2 + 3)"}}\n'
            '{"name": "search", "arguments": {"q": "sum of 2 and 3"}}',
            None,
        ),
        (
            "mistral",
            '[TOOL_CALLS][{"name": "python", "arguments": {"code": "print(2 + 3)"}}, '
            '{"name": "search", "arguments": {"q": "sum of 2 and 3"}}]',
            None,
        ),
        (
            "qwen3_coder",
            "I will run it.\n<tool_call>\n<function=python>\n<parameter=code>\nprint(2 + "
            "3)\n</parameter>\n</function>\n"
            "</tool_call>\n<tool_call>\n<function=search>\n<parameter=q>\nsum of 2 and 3\n</parameter>\n"
            "</function>\n</tool_call>",
            "I will run it.",
        ),
    ],
    ids=["hermes-parameters", "llama-python-tag", "llama-bare", "mistral", "qwen3-coder"],
)
def test_each_family_parses_parallel_calls(family, text, content):
    rest, calls = split_tool_calls(text, family)
    assert rest == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == CALLS


@pytest.mark.parametrize(
    "family, text",
    [
        ("hermes", "<tool_call>not json</tool_call>"),
        ("hermes", '<tool_call>\n{"name": "python", "arguments": {"code": "pri'),  # cut at max_tokens
        ("llama3_json", "The answer is 5."),
        ("llama3_json", '{"answer": 5}'),
        ("mistral", "[TOOL_CALLS][{broken"),
        ("qwen3_coder", "<tool_call>\n<function=python>\n<parameter=code>\nprint("),
    ],
)
def test_what_is_not_a_call_stays_text(family, text):
    assert split_tool_calls(text, family) == (text, [])
