"""A request's JSON body, read within bounds: at most `MAX_BODY_BYTES` (HTTP 413 beyond, before more is read)
and
`MAX_JSON_DEPTH` levels of arrays and objects (HTTP 400: Python's parser and the chat template's `tojson`
recurse
once per level, and a RecursionError would answer 500), text only (a lone UTF-16 surrogate, which JSON's
`\\ud800`
escape can spell, is no character: the tokenizer refuses it and no reply could echo it) and finite numbers
(`NaN`, or `1e999` read as infinity, would make the echoing reply invalid JSON)."""

from __future__ import annotations

import json
import math

from grl.gateway.requests import BadRequest

# A 32k-token context is about 130 kB of text; this leaves room for long tool results and definitions.
MAX_BODY_BYTES = 4 * 2**20
MAX_JSON_DEPTH = 64  # OpenAI requests nest about 8 deep; a tool's parameter schema adds its own levels


class BodyTooLarge(BadRequest):
    """A body over MAX_BODY_BYTES: HTTP 413."""

    status = 413


def too_large(size: int | str) -> BodyTooLarge:
    return BodyTooLarge(f"the body holds {size} bytes, more than the gateway takes ({MAX_BODY_BYTES} bytes)")


async def read_body(request):
    """The JSON value of a Starlette `request`'s body, read no further than MAX_BODY_BYTES."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large(declared)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise too_large(f"more than {len(raw)}")
    return parse_body(bytes(raw))


def parse_body(raw: bytes):
    """`raw` as JSON, refused with one line (BadRequest) when it is not JSON, nests deeper than MAX_JSON_DEPTH
    or
    holds a string that is not text or a number that is not finite."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise BadRequest(
            f"the body nests deeper than {MAX_JSON_DEPTH} levels of arrays and objects"
        ) from None
    except ValueError as err:  # UnicodeDecodeError included
        raise BadRequest(f"the body is not JSON: {err}"[:200]) from None
    _check_tree(body)
    return body


def _check_tree(body) -> None:
    """Walked with a stack of its own, not recursion: each level and string of `body` checked once."""
    pending = [(body, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, str):
            if not value.isascii():
                try:
                    value.encode()
                except UnicodeEncodeError:
                    raise BadRequest(
                        "the body holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), not "
                        "text"
                    ) from None
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise BadRequest(f"the body holds the number {value}: JSON numbers are finite")
        if not isinstance(value, (list, dict)):
            continue
        if depth > MAX_JSON_DEPTH:
            raise BadRequest(f"the body nests deeper than {MAX_JSON_DEPTH} levels of arrays and objects")
        items = value.values() if isinstance(value, dict) else value
        pending.extend((item, depth + 1) for item in items)
        if isinstance(value, dict):
            pending.extend((key, depth) for key in value)  # keys are text too
