"""The Responses API through the real `openai` client: a response is the chat call of the same conversation,
an
episode continued with the returned output items (as the OpenAI Agents SDK sends them back) is one sequence,
function calls and their outputs render as the chat template's tool calls and tool messages, a streamed
response
is the unstreamed one sent as the API's events, and what the gateway cannot honour is refused in one line."""

import httpx
import pytest

from tests.gateway.served import client

TOOL = {
    "type": "function",
    "name": "python",
    "description": "run Python code",
    "parameters": {"type": "object", "properties": {}},
}
CHAT_TOOL = {"type": "function", "function": {k: v for k, v in TOOL.items() if k != "type"}}


def test_a_response_is_the_chat_call_of_the_same_conversation(served):
    _, base = served
    response = client(base).responses.create(
        model="tiny",
        instructions="You answer briefly.",
        input="What is 2 + 3?",
        tools=[TOOL],
        max_output_tokens=8,
        temperature=0,
    )
    chat = client(base).chat.completions.create(
        model="tiny",
        messages=[
            {"role": "system", "content": "You answer briefly."},
            {"role": "user", "content": "What is 2 + 3?"},
        ],
        tools=[CHAT_TOOL],
        max_tokens=8,
        temperature=0,
    )
    assert response.output_text == chat.choices[0].message.content
    assert response.model_extra["grl"]["prompt_token_ids"] == chat.model_extra["grl"]["prompt_token_ids"]
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")


def test_a_streamed_response_is_the_unstreamed_one_and_records_the_same_ids(served):
    gateway, base = served
    ask = {
        "model": "tiny",
        "instructions": "You answer briefly.",
        "input": "What is 2 + 3?",
        "max_output_tokens": 8,
    }
    plain = client(base).responses.create(**ask, temperature=0)
    events = list(client(base, "/episodes/streamed/v1").responses.create(**ask, temperature=0, stream=True))
    kinds = [event.type for event in events]
    assert (
        kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == f"response.{plain.status}"
    )
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == plain.output_text  # a piece per sampled token
    final = events[-1].response
    assert final.output_text == plain.output_text and final.usage.output_tokens == plain.usage.output_tokens
    recorded = gateway.episodes["streamed"].calls[0]
    assert final.model_extra["grl"]["completion_token_ids"] == [recorded.completion_ids]
    assert recorded.completion_ids == plain.model_extra["grl"]["completion_token_ids"][0]


def test_a_streamed_function_call_reaches_the_clients_stream_helper(served):
    _, base = served
    ask = {
        "model": "tiny",
        "input": "What is 2 + 3?",
        "tools": [TOOL],
        "tool_choice": "required",
        "max_output_tokens": 40,
    }
    with client(base).responses.stream(**ask, temperature=0) as stream:
        arguments = "".join(
            event.delta for event in stream if event.type == "response.function_call_arguments.delta"
        )
        final = stream.get_final_response()
    [call] = final.output
    assert call.type == "function_call" and call.name == "python" and call.arguments == arguments
    plain = client(base).responses.create(**ask, temperature=0)
    assert plain.output[0].arguments == arguments and final.status == plain.status == "completed"


def test_an_episode_continued_with_the_returned_items_is_one_sequence(served):
    gateway, base = served
    talk = client(base, "/episodes/agent/v1")
    items = [{"role": "user", "content": "What is 2 + 3?"}]
    first = talk.responses.create(
        model="tiny",
        instructions="Be brief.",
        input=items,
        tools=[TOOL],
        max_output_tokens=6,
        temperature=1.0,
    )
    items += [item.model_dump(exclude_none=True) for item in first.output] + [
        {"role": "user", "content": "And 3 + 4?"}
    ]
    second = talk.responses.create(
        model="tiny",
        instructions="Be brief.",
        input=items,
        tools=[TOOL],
        max_output_tokens=6,
        temperature=1.0,
    )
    log = gateway.episodes["agent"]
    assert [c.parent for c in log.calls] == [None, 0] and log.prefix_breaks == 0
    one, two = first.model_extra["grl"], second.model_extra["grl"]
    seen = one["prompt_token_ids"] + one["completion_token_ids"][0]
    assert two["prompt_token_ids"][: len(seen)] == seen


def test_function_calls_and_their_outputs_render_as_tool_calls_and_tool_messages(served):
    _, base = served
    items = [
        {"role": "user", "content": "What is 2 + 3?"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "python",
            "arguments": '{"code": "print(2 + 3)"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "5"},
    ]
    response = client(base).responses.create(
        model="tiny", input=items, tools=[TOOL], max_output_tokens=2, temperature=0
    )
    messages = [
        {"role": "user", "content": "What is 2 + 3?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "python", "arguments": '{"code": "print(2 + 3)"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
    chat = client(base).chat.completions.create(
        model="tiny", messages=messages, tools=[CHAT_TOOL], max_tokens=2, temperature=0
    )
    prompt = response.model_extra["grl"]["prompt_token_ids"]
    assert prompt == chat.model_extra["grl"]["prompt_token_ids"]
    text = served[0].tokenizer.decode(prompt)
    assert '<tool_call>\n{"name": "python", "arguments": {"code": "print(2 + 3)"}}\n</tool_call>' in text
    assert "<tool_response>\n5\n</tool_response>" in text


@pytest.mark.parametrize(
    "change, says",
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id: the gateway stores no responses"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]: only function tools"),
        (
            {"input": [{"type": "image_generation_call"}]},
            "input[0]: image_generation_call items are not supported",
        ),
        ({"text": {"format": {"type": "json_object"}}}, "text.format: only"),
    ],
)
def test_what_responses_cannot_honour_is_refused_in_one_line(served, change, says):
    _, base = served
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 2, **change}
    response = httpx.post(f"{base}/v1/responses", json=body, timeout=60)
    assert response.status_code == 400 and response.json()["error"]["message"].startswith(says)
