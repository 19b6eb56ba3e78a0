"""Prompt scoring in the OpenAI/vLLM completions format, for a served teacher (on-policy distillation).

`POST /v1/completions` with token-id prompts, `echo: true` and `max_tokens: 0` answers each prompt's
log-probs as vLLM's server does for that request: `choices[i].logprobs.token_logprobs` holds one entry per
prompt token, the first null, entry t = log p(token t | tokens < t) under the model's plain softmax
(temperature 1, no sampling filter). It generates nothing: every other use of the endpoint is refused with
one line. `POST /tokenize` is vLLM's, so that a client can check that the served tokenizer is its own and
that the context holds its episodes.
"""

# No `from __future__ import annotations`: FastAPI reads the routes' `request: Request`, a name local to
# `add_scoring_routes`, which it could not resolve from a string.

from grl.gateway.completions import response_body
from grl.gateway.requests import BadRequest

# vLLM's floor for a log-prob it reports (a -inf would be no JSON number).
MIN_LOG_PROB = -9999.0


class NotServed(BadRequest):
    """The gateway's engine does not score prompts: HTTP 501."""

    status = 501


def _is_id(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _zero(value) -> bool:
    return _is_id(value) and value == 0


def scored_prompts(body, vocab: int, context: int) -> list[list[int]]:
    """The token-id prompts of a scoring request, each checked; BadRequest names the field at fault."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if body.get("echo") is not True:
        raise BadRequest(
            "echo: must be true (this endpoint returns the prompt's log-probs, it generates nothing)"
        )
    if not _zero(body.get("max_tokens")):
        raise BadRequest(
            f"max_tokens: must be 0 (the prompt is scored, nothing generated), got {body.get('max_tokens')!r}"
        )
    for key in ("logprobs", "prompt_logprobs"):
        if body.get(key) is not None and not _zero(body[key]):
            raise BadRequest(
                f"{key}: only 0 (each token's own log-prob; no top alternatives), got {body[key]!r}"
            )
    temperature = body.get("temperature")
    if temperature is not None and (isinstance(temperature, bool) or temperature != 1):
        raise BadRequest(f"temperature: the prompt's log-probs are at temperature 1, got {temperature!r}")
    for key in ("n", "best_of"):
        if body.get(key) is not None and not (_is_id(body[key]) and body[key] == 1):
            raise BadRequest(
                f"{key}: one choice per prompt (send several prompts for several), got {body[key]!r}"
            )
    if body.get("stream"):
        raise BadRequest("stream: not supported for prompt scoring")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(_is_id(t) for t in prompt):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        prompts = prompt
    else:
        raise BadRequest("prompt: token ids (a list of ints, or a list of lists of ints); text is not scored")
    for i, ids in enumerate(prompts):
        where = "prompt" if len(prompts) == 1 and prompts[0] is prompt else f"prompt[{i}]"
        if not ids or not all(_is_id(t) for t in ids):
            raise BadRequest(f"{where}: a non-empty list of token ids (ints)")
        outside = next((t for t in ids if not 0 <= t < vocab), None)
        if outside is not None:
            raise BadRequest(f"{where}: token id {outside} is outside the vocabulary (0..{vocab - 1})")
        if len(ids) > context:
            raise BadRequest(f"{where}: {len(ids)} tokens exceed the context of {context}")
    return prompts


def prompt_completion(
    model_name: str, tokenizer, prompts: list[list[int]], log_probs: list[list[float]]
) -> dict:
    """The OpenAI legacy completion body of scored `prompts`: each prompt echoed as a choice."""
    choices = []
    for index, (ids, scores) in enumerate(zip(prompts, log_probs)):
        pieces = tokenizer.batch_decode([[t] for t in ids])
        offsets, at = [], 0
        for piece in pieces:
            offsets.append(at)
            at += len(piece)
        choices.append(
            {
                "index": index,
                "text": tokenizer.decode(ids),
                "logprobs": {
                    "tokens": pieces,
                    "token_logprobs": [None, *(max(s, MIN_LOG_PROB) for s in scores)],
                    "top_logprobs": None,
                    "text_offset": offsets,
                },
                "finish_reason": "length",
            }
        )
    tokens = sum(len(ids) for ids in prompts)
    return response_body("cmpl", "text_completion", model_name, choices, tokens, 0)


def score(gateway, body) -> dict:
    """A `POST /v1/completions` scoring request answered by `gateway`'s engine (blocks while it runs)."""
    prompts = scored_prompts(body, len(gateway.tokenizer), gateway.context)
    scorer = getattr(gateway.engine, "prompt_log_probs", None)  # the trainer's BatchingEngine has none
    if scorer is None:
        raise NotServed("prompt: this gateway's engine does not score prompts (grl serve's does)")
    try:
        log_probs = scorer(prompts)
    except NotImplementedError as err:
        raise NotServed(f"prompt: {err}") from None
    return prompt_completion(gateway.model_name, gateway.tokenizer, prompts, log_probs)


def tokenized(gateway, body) -> dict:
    """vLLM's `POST /tokenize` for a text prompt: its ids under the served tokenizer and the context."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    if "messages" in body:
        raise BadRequest(
            "messages: only a text prompt is tokenized here (render the chat and send it as prompt)"
        )
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise BadRequest("prompt: a string of text")
    special = body.get("add_special_tokens", True)
    strings = body.get("return_token_strs") or False
    if not isinstance(special, bool) or not isinstance(strings, bool):
        raise BadRequest("add_special_tokens, return_token_strs: true or false")
    tokens = gateway.tokenizer.encode(prompt, add_special_tokens=special)
    return {
        "count": len(tokens),
        "max_model_len": gateway.context,
        "tokens": tokens,
        "token_strs": gateway.tokenizer.convert_ids_to_tokens(tokens) if strings else None,
    }


def add_scoring_routes(app, gateway, refused, off_loop) -> None:
    """`POST /v1/completions` (run by `off_loop` off the event loop, as the chat path's generation is) and
    `POST /tokenize` on `app`; a BadRequest answers as `refused` makes it."""
    from fastapi import Request

    from grl.gateway.bodies import read_body

    async def completions(request: Request):
        try:
            return await off_loop(score, gateway, await read_body(request))
        except BadRequest as err:
            return refused(err)

    async def tokenize(request: Request):
        try:
            return tokenized(gateway, await read_body(request))
        except BadRequest as err:
            return refused(err)

    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/tokenize", tokenize, methods=["POST"])
