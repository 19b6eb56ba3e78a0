"""`stream: true`: a chat completion sent as server-sent events, cut from the reply the gateway already made
from the engine's sampled ids, so a streamed call is recorded exactly as an unstreamed one (the engine
samples a whole reply; the events only change how it travels). Each choice sends its role, then its
reasoning, its text (a piece per sampled token where the text is the tokens' own, else at once) and its
tool calls, in the order the OpenAI API sends them, then its finish reason; the last event carries the
usage (asked or not: clients ignore what they do not read) and the `grl` token ids, then `data: [DONE]`.
A Responses-API reply streams the same way, as that API's typed events (`response_events`)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


def chunks(response: dict, pieces_of: Callable[[list[int], str], list[str]] | None = None) -> Iterator[str]:
    """The events of `response`; `pieces_of(ids, text)` cuts a choice's text at its sampled tokens' ends."""
    base = {
        "id": response["id"],
        "object": "chat.completion.chunk",
        "created": response["created"],
        "model": response["model"],
    }

    def chunk(index: int, delta: dict, finish_reason=None, **extra) -> str:
        choice = {"index": index, "delta": delta, "finish_reason": finish_reason, **extra}
        return _event({**base, "choices": [choice]})

    for choice in response["choices"]:
        i, message = choice["index"], choice["message"]
        yield chunk(i, {"role": "assistant", "content": ""})
        if message.get("reasoning_content"):
            yield chunk(i, {"reasoning_content": message["reasoning_content"]})
        if message.get("content"):
            ids = response["grl"]["completion_token_ids"][i]
            plain = (
                not message.get("reasoning_content")
                and not message.get("tool_calls")
                and pieces_of is not None
            )
            for piece in pieces_of(ids, message["content"]) if plain else [message["content"]]:
                yield chunk(i, {"content": piece})
        for k, call in enumerate(message.get("tool_calls") or []):
            yield chunk(i, {"tool_calls": [{"index": k, **call}]})
        yield chunk(i, {}, choice["finish_reason"], logprobs=choice["logprobs"])
    yield _event({**base, "choices": [], "usage": response["usage"], "grl": response["grl"]})
    yield "data: [DONE]\n\n"


def response_events(
    response: dict, pieces_of: Callable[[list[int], str], list[str]] | None = None
) -> Iterator[str]:
    """A Responses-API reply (grl/gateway/responses.py `response_of`) as its server-sent events: created and
    in progress, then per output item its addition, its text (a piece per sampled token, as above) or
    arguments, and its end, then `response.completed` (or `.incomplete`) with the whole response."""
    count = iter(range(1 << 62))

    def event(kind: str, **fields) -> str:
        return f"event: {kind}\n" + _event({"type": kind, "sequence_number": next(count), **fields})

    opening = {**response, "status": "in_progress", "output": [], "incomplete_details": None}
    yield event("response.created", response=opening)
    yield event("response.in_progress", response=opening)
    ids = response["grl"]["completion_token_ids"][0]
    plain = pieces_of is not None and [item["type"] for item in response["output"]] == ["message"]
    for index, item in enumerate(response["output"]):
        where = {"output_index": index}
        if item["type"] == "message":
            yield event(
                "response.output_item.added", **where, item={**item, "status": "in_progress", "content": []}
            )
            for part_index, part in enumerate(item["content"]):
                at = {**where, "item_id": item["id"], "content_index": part_index}
                yield event("response.content_part.added", **at, part={**part, "text": ""})
                for piece in pieces_of(ids, part["text"]) if plain else [part["text"]]:
                    yield event("response.output_text.delta", **at, delta=piece, logprobs=[])
                yield event("response.output_text.done", **at, text=part["text"], logprobs=[])
                yield event("response.content_part.done", **at, part=part)
        elif item["type"] == "function_call":
            yield event(
                "response.output_item.added", **where, item={**item, "status": "in_progress", "arguments": ""}
            )
            at = {**where, "item_id": item["id"]}
            yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
            yield event(
                "response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"]
            )
        else:  # reasoning: sent whole
            yield event("response.output_item.added", **where, item=item)
        yield event("response.output_item.done", **where, item=item)
    ending = "response.completed" if response["status"] == "completed" else "response.incomplete"
    yield event(ending, response=response)
