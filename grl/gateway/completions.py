"""The body of an OpenAI chat completion the gateway answers (grl/gateway/server.py), and its log-probs."""

from __future__ import annotations

import time
import uuid

from grl.gateway.requests import BadRequest, ChatRequest


def chat_completion(
    model_name: str, tokenizer, request: ChatRequest, prompt: list[int], outputs: list, messages: list[dict]
) -> dict:
    """The OpenAI chat completion body of `outputs` (one per choice) and their assistant `messages`,
    with GRL's
    exact token ids and log-probs under `grl`."""
    choices = []
    for i, (out, message) in enumerate(zip(outputs, messages)):
        reason = "tool_calls" if message.get("tool_calls") else out.finish_reason
        choices.append(
            {
                "index": i,
                "message": message,
                "finish_reason": reason,
                "logprobs": token_logprobs(tokenizer, request, out),
            }
        )
    sampled = sum(len(out.token_ids) for out in outputs)
    return {
        **response_body("chatcmpl", "chat.completion", model_name, choices, len(prompt), sampled),
        "grl": {
            "prompt_token_ids": prompt,
            "completion_token_ids": [out.token_ids for out in outputs],
            "log_probs": [out.log_probs for out in outputs],
        },
    }


def response_body(
    id_prefix: str,
    kind: str,
    model_name: str,
    choices: list[dict],
    prompt_tokens: int,
    completion_tokens: int,
) -> dict:
    """What every OpenAI completion body holds (a chat completion's, a scoring's `text_completion`): a
    fresh id, the time, the model, the `choices` and the token usage."""
    return {
        "id": f"{id_prefix}-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def token_logprobs(tokenizer, request: ChatRequest, out) -> dict | None:
    """OpenAI's `logprobs` of a choice: each sampled token's text, log-prob and bytes."""
    if not request.logprobs:
        return None
    if out.log_probs is None or len(out.log_probs) != len(out.token_ids):
        raise BadRequest("logprobs: this engine did not return the sampled tokens' log-probs")
    entries = []
    for token, logprob in zip(out.token_ids, out.log_probs):
        piece = tokenizer.decode([token])
        entries.append(
            {"token": piece, "logprob": logprob, "bytes": list(piece.encode()), "top_logprobs": []}
        )
    return {"content": entries}
