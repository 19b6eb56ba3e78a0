"""An OpenAI-compatible chat endpoint in front of a GRL rollout engine.

`GET /v1/models` and `POST /v1/chat/completions` (messages, tools, tool_choice, temperature, top_p,
max_tokens / max_completion_tokens, n, seed, stop; no streaming). Requests are rendered with the
model's chat template and the tokens the engine sampled are returned beside the text (`grl` field:
prompt and completion ids, log-probs). Under `/episodes/<id>/v1/...` the calls of one episode are
recorded for training (grl/gateway/episodes.py). A request may name the replies it allows
(`allowed_replies`): the engine then decodes with the reply grammar GRL's agents use.

Bad requests get HTTP 400 with one line. The engine is used only through `engine.generate`: `grl serve`
gives a `SerialEngine` (the hf engine is not thread-safe), the trainer a `BatchingEngine`
(grl/gateway/batching.py) whose owner serves the concurrent calls of many programs in batches.
"""

import json
import re
import threading
import time
import uuid
from dataclasses import replace
from typing import Any

from grl.engines.base import Engine, SamplingParams
from grl.engines.constraint import GrammarError, compile_reply_grammar
from grl.gateway.episodes import Call, EpisodeLog
from grl.rollout.chat import ChatTokens

ROLES = ("system", "user", "assistant", "tool")
MAX_N = 16
MAX_WAITING_CALLS = 256  # calls answered at once (each waits on a thread for its generation)
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class BadRequest(ValueError):
    """A request the gateway refuses, with the one line it answers."""


def tool_calls_of(text: str) -> tuple[str | None, list[dict]]:
    """A reply's text outside Hermes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, and
    the blocks as OpenAI tool calls (a block that is not such JSON stays in the text)."""
    calls, kept, at = [], [], 0
    for match in _TOOL_CALL.finditer(text):
        try:
            body = json.loads(match.group(1).strip())
        except ValueError:
            continue
        name, arguments = (body.get("name"), body.get("arguments", {})) if isinstance(body, dict) else (None, None)
        if not isinstance(name, str):
            continue
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        calls.append(
            {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": arguments}}
        )
        kept.append(text[at : match.start()])
        at = match.end()
    kept.append(text[at:])
    content = "".join(kept).strip() if calls else text
    return (content or None), calls


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: a non-empty list of {role, content} is required")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise BadRequest(f"messages[{i}]: role must be one of {', '.join(ROLES)}")
        content = message.get("content")
        if isinstance(content, list):  # content parts: the text ones, in order
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text")
        if content is not None and not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content: a string, a list of text parts or null")
        kept = {"role": message["role"], "content": content}
        for extra in ("tool_calls", "tool_call_id", "name"):
            if message.get(extra) is not None:
                kept[extra] = message[extra]
        out.append(kept)
    return out


def _number(body: dict, key: str, default, low, high, kind=float):
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (low <= value <= high):
        raise BadRequest(f"{key}: a number in [{low}, {high}], got {value!r}")
    return kind(value)


class SerialEngine:
    """An engine that serves one `generate` at a time, whichever thread calls."""

    def __init__(self, engine: Engine):
        self.engine, self._lock = engine, threading.Lock()

    def generate(self, prompts, sampling, constraints=None):
        with self._lock:
            return self.engine.generate(prompts, sampling, constraints)


class Gateway:
    """The endpoint's logic, apart from HTTP: `models()`, `complete(body, episode)`.

    `open_episodes`: a call under an episode id nobody opened starts that episode (`grl serve`); the
    trainer opens its episodes itself (`open_episode`) and refuses the others."""

    def __init__(
        self, engine, tokenizer, model_name: str, max_tokens: int = 1024, context: int = 32768, open_episodes: bool = True
    ):
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.max_tokens, self.context, self.open_episodes = max_tokens, context, open_episodes
        self.episodes: dict[str, EpisodeLog] = {}
        self._episodes_lock = threading.Lock()

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "grl"}]}

    def open_episode(self, name: str, log: EpisodeLog) -> None:
        with self._episodes_lock:
            self.episodes[name] = log

    def close_episode(self, name: str) -> EpisodeLog | None:
        """Stop recording `name` (later calls are refused; one in flight is recorded first) and hand back its log."""
        with self._episodes_lock:
            log = self.episodes.pop(name, None)
        if log is not None:
            with log.lock:
                log.closed = True
        return log

    def episode(self, name: str) -> EpisodeLog:
        with self._episodes_lock:
            if self.open_episodes:
                return self.episodes.setdefault(name, EpisodeLog())
            if name not in self.episodes:
                raise BadRequest(f"episode {name!r}: not open (it ended, or the trainer never started it)")
            return self.episodes[name]

    def complete(self, body: Any, episode: str | None = None) -> dict:
        log = self.episode(episode) if episode is not None else None
        if log is None:
            return self._complete(body, None)
        with log.lock:  # a call extends the one before it, so an episode's calls go one after another
            if log.closed:
                raise BadRequest(f"episode {episode!r}: ended")
            if log.max_calls is not None and len(log.calls) >= log.max_calls:
                log.refused += 1
                raise BadRequest(f"episode {episode!r}: its {log.max_calls} calls are spent (agent_config.max_turns)")
            return self._complete(body, log)

    def _complete(self, body: Any, log: EpisodeLog | None) -> dict:
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        if body.get("stream"):
            raise BadRequest("stream: streaming is not supported by this endpoint; send stream=false")
        messages = _messages(body)
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise BadRequest("tools: a list of tool definitions")
        if body.get("tool_choice") not in (None, "auto", "none"):
            raise BadRequest("tool_choice: only auto and none are supported")
        n = _number(body, "n", 1, 1, MAX_N, int)
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        max_new = _number({"max_tokens": limit}, "max_tokens", self.max_tokens, 1, self.context, int)
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise BadRequest("stop: a string or a list of strings")
        temperature = _number(body, "temperature", 1.0, 0.0, 100.0)
        sampling = SamplingParams(
            temperature=temperature,
            top_p=_number(body, "top_p", 1.0, 1e-9, 1.0),
            max_new_tokens=max_new,
            stop=stop,
            greedy=temperature == 0,
            seed=_number(body, "seed", None, 0, 2**63 - 1, int),
        )
        if log is not None and log.sampling is not None:
            sampling = replace(
                log.sampling,
                max_new_tokens=min(max_new, log.sampling.max_new_tokens),
                stop=stop,
                seed=None if log.seed is None else log.seed + len(log.calls),
            )
        chat = ChatTokens(self.tokenizer, {"tools": tools} if tools and body.get("tool_choice") != "none" else None)
        if log is not None and n != 1:
            raise BadRequest("n: a call of a recorded episode samples one reply")
        try:
            prompt, continues = log.prompt_for(messages, chat) if log is not None else (chat.first_prompt(messages), False)
        except Exception as err:  # noqa: BLE001 - templates refuse conversations in many ways
            raise BadRequest(f"messages: the chat template cannot render them: {err}") from None
        if len(prompt) + sampling.max_new_tokens > self.context:
            raise BadRequest(
                f"messages: {len(prompt)} prompt tokens + max_tokens {sampling.max_new_tokens} exceed "
                f"the context of {self.context}"
            )
        constraints = self._constraints(body.get("allowed_replies"), chat, sampling.max_new_tokens, n)
        outputs = self.engine.generate([prompt] * n, sampling, constraints)
        choices = []
        for i, out in enumerate(outputs):
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            content, calls = tool_calls_of(text) if tools else (text, [])
            message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
            reason = "tool_calls" if calls else out.finish_reason
            choices.append({"index": i, "message": message, "finish_reason": reason, "logprobs": None})
            if log is not None:
                allowed = constraints[i].trace(out.token_ids) if constraints else None
                log.record(
                    Call(
                        messages,
                        message,
                        list(prompt),
                        list(out.token_ids),
                        list(out.log_probs or []),
                        continues,
                        allowed,
                        out.finish_reason,
                    )
                )
        sampled = sum(len(out.token_ids) for out in outputs)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {"prompt_tokens": len(prompt), "completion_tokens": sampled, "total_tokens": len(prompt) + sampled},
            "grl": {
                "prompt_token_ids": prompt,
                "completion_token_ids": [out.token_ids for out in outputs],
                "log_probs": [out.log_probs for out in outputs],
            },
        }

    def _constraints(self, allowed, chat: ChatTokens, max_new: int, n: int) -> list | None:
        if allowed is None:
            return None
        if not isinstance(allowed, list) or not allowed or not all(isinstance(a, str) and a.strip() for a in allowed):
            raise BadRequest("allowed_replies: a non-empty list of non-empty strings")
        try:
            grammar = compile_reply_grammar(chat.encode, chat.end_ids(), allowed, False, max_new)
        except GrammarError as err:
            raise BadRequest(f"allowed_replies: {err}") from None
        return [grammar] * n


def build_app(gateway: Gateway):
    """The FastAPI application serving `gateway` at /v1 and, per episode, at /episodes/<id>/v1."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    app = FastAPI(title="GRL gateway")
    threads = []  # the limiter of the threads that wait for the engine, made in the event loop on first use

    def refused(err: BadRequest) -> JSONResponse:
        return JSONResponse({"error": {"message": str(err), "type": "invalid_request_error"}}, status_code=400)

    async def body_of(request: Request):
        try:
            return await request.json()
        except ValueError:
            return None

    @app.get("/v1/models")
    @app.get("/episodes/{episode}/v1/models")
    def models(episode: str | None = None) -> dict:
        return gateway.models()

    @app.post("/v1/chat/completions")
    async def completions(request: Request):
        return await _complete(request, None)

    @app.post("/episodes/{episode}/v1/chat/completions")
    async def episode_completions(episode: str, request: Request):
        return await _complete(request, episode)

    async def _complete(request: Request, episode: str | None):
        import anyio

        body = await body_of(request)
        if not threads:  # anyio's default of 40 would cap how many programs' calls share an engine batch
            threads.append(anyio.CapacityLimiter(MAX_WAITING_CALLS))
        try:  # off the event loop: generation blocks for seconds
            return await anyio.to_thread.run_sync(gateway.complete, body, episode, limiter=threads[0])
        except BadRequest as err:
            return refused(err)

    return app
