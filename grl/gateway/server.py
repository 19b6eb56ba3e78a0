"""An OpenAI-compatible endpoint in front of a GRL rollout engine.

`GET /v1/models`, `POST /v1/chat/completions` (messages, tools, tool_choice, temperature, top_p,
max_tokens / max_completion_tokens, n, seed, stop, logprobs, parallel_tool_calls, stream; what it cannot
honour it refuses: grl/gateway/requests.py), `POST /v1/responses` (grl/gateway/responses.py), and vLLM's
prompt scoring, `POST /v1/completions` with `echo` and `max_tokens: 0`, and `POST /tokenize` (scoring.py).
Requests are rendered with the model's chat template and the tokens the engine sampled are returned
beside the text (`grl` field: prompt and completion ids, log-probs). A reply's reasoning and tool calls
are parsed in the model family's format (grl/toolcalls.py: the family is `tool_parser`, or read
from the chat template). `stream: true` answers the same reply as server-sent events
(grl/gateway/streaming.py). Under `/episodes/<id>/v1/...` the calls of one episode are recorded for
training (grl/gateway/episodes.py). A request may name the replies it allows (`allowed_replies`): the
engine then decodes with the reply grammar GRL's agents use; `tool_choice` `"required"` or a named
function decodes one call in the family's format (grl/gateway/grammars.py).

Bad requests get HTTP 400 with one line. The engine is used only through `engine.generate`: `grl serve`
gives a `SerialEngine` (the hf engine is not thread-safe: one generate at a time, the calls that wait
meanwhile
sharing the next), the trainer a `BatchingEngine` whose owner serves the concurrent calls of many programs;
both start the next engine call as soon as the engine is free (grl/gateway/batching.py). The HTTP routes:
grl/gateway/app.py.
"""

import threading
import time
from dataclasses import replace

from grl.engines.base import GenerationOutput, SamplingParams
from grl.engines.kept_sets import reply_sets
from grl.gateway.completions import chat_completion
from grl.gateway.episodes import NO_TOOLS, Call, EpisodeLog, tools_key
from grl.gateway.grammars import Grammars
from grl.gateway.requests import BadRequest, ChatRequest, chat_request
from grl.toolcalls import (
    FAMILIES,
    family_of,
    split_reasoning,
    split_tool_calls,
    thinks,
    with_parsed_arguments,
)
from grl.rollout.chat import ChatTokens, truncate_prompt

MAX_OPEN_EPISODES = 1024  # episodes `grl serve` records at once; a new one beyond drops the oldest
_MARKERS = ("<|python_tag|>", "[TOOL_CALLS]")  # special tokens that open a tool call in some families


def tool_calls_of(text: str, family: str = "hermes") -> tuple[str | None, list[dict]]:
    """A reply's text outside its tool calls, and the calls as OpenAI tool calls (grl/toolcalls.py)."""
    return split_tool_calls(text, family)


class _Chat(ChatTokens):
    """ChatTokens that render a tool call's JSON-string arguments as the object they encode: templates write
    `arguments | tojson`, which would quote an OpenAI client's string a second time (vLLM parses them too)."""

    def render(self, messages: list[dict], generation_prompt: bool) -> str:
        return super().render([with_parsed_arguments(m) for m in messages], generation_prompt)


class Gateway:
    """The endpoint's logic, apart from HTTP: `models()`, `complete(body, episode)`.

    `open_episodes`: a call under an episode id nobody opened starts that episode (`grl serve`); the
    trainer opens its episodes itself (`open_episode`) and refuses the others. `grl serve` records at most
    `max_open_episodes` at once (the oldest is dropped, counted in `evicted_episodes`); a program reads an
    episode's record back with `GET /episodes/<id>` and frees it with `DELETE`. `chat_template` replaces
    the tokenizer's; `tool_parser` names the tool-call family (one of `toolcalls.FAMILIES`; by default
    the one the template writes). `context`: the tokens a call (prompt and reply) may take, by default the
    engine's own (`engine.context_length()`: a longer call would be refused by vLLM). A prompt longer than
    `context`
    less the reply's tokens is cut from the left, keeping the system message, as GRL's agents cut theirs
    (`truncation: left`), or refused (`truncation: error`)."""

    def __init__(
        self,
        engine,
        tokenizer,
        model_name: str,
        max_tokens: int = 1024,
        context: int | None = None,
        open_episodes: bool = True,
        chat_template: str | None = None,
        tool_parser: str | None = None,
        truncation: str = "left",
        max_open_episodes: int = MAX_OPEN_EPISODES,
    ):
        self.engine, self.tokenizer, self.model_name = engine, tokenizer, model_name
        self.max_tokens, self.open_episodes = max_tokens, open_episodes
        self.template_kwargs = {"chat_template": chat_template} if chat_template else {}
        template = chat_template or getattr(tokenizer, "chat_template", None)
        self.tool_parser = tool_parser or family_of(template)
        if self.tool_parser not in FAMILIES:
            raise ValueError(f"tool_parser: {self.tool_parser!r} is not one of {', '.join(FAMILIES)}")
        if truncation not in ("left", "error"):
            raise ValueError(f"truncation: {truncation!r} is not one of left, error")
        self.thinks, self.truncation = thinks(template), truncation
        self.context = context if context is not None else engine.context_length()
        if self.context is None:
            raise ValueError("context: the engine does not report its context length; give the gateway one")
        self.grammars = Grammars(tokenizer, self.tool_parser)
        specials = set(getattr(tokenizer, "all_special_tokens", [])) - set(_MARKERS)
        self._specials = sorted(specials, key=len, reverse=True)
        self.episodes: dict[str, EpisodeLog] = {}  # in the order they opened
        self.max_open_episodes, self.evicted_episodes = max_open_episodes, 0
        self._episodes_lock = threading.Lock()

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "grl"}]}

    def open_episode(self, name: str, log: EpisodeLog) -> None:
        with self._episodes_lock:
            self.episodes[name] = log

    def close_episode(self, name: str) -> EpisodeLog | None:
        """Stop recording `name` (later calls are refused; one in flight is recorded first) and hand back its
        log."""
        with self._episodes_lock:
            log = self.episodes.pop(name, None)
        if log is not None:
            with log.lock:
                log.closed = True
        return log

    def readout(self, name: str, close: bool = False) -> dict:
        """An episode's record as JSON: each call's messages, reply and token ids; `close` also frees it."""
        with self._episodes_lock:
            log = self.episodes.get(name)
        if log is None:
            raise BadRequest(
                f"episode {name!r}: not recorded (never opened, closed, or dropped as the oldest)"
            )
        if close:
            self.close_episode(name)
        with log.lock:
            calls = [
                {
                    "messages": call.messages,
                    "reply": call.returned,
                    "prompt_token_ids": call.prompt_ids,
                    "completion_token_ids": call.completion_ids,
                    "log_probs": call.log_probs,
                    "finish_reason": call.finish_reason,
                    "continues": call.parent,
                    "truncated": call.truncated,
                }
                for call in log.calls
            ]
            counts = {"prefix_breaks": log.prefix_breaks, "branches": log.branches, "retries": log.retries}
        return {"episode": name, "calls": calls, "counts": counts}

    def episode(self, name: str) -> EpisodeLog:
        with self._episodes_lock:
            if self.open_episodes:
                if name not in self.episodes and len(self.episodes) >= self.max_open_episodes:
                    self.episodes.pop(
                        next(iter(self.episodes))
                    )  # the oldest: `grl serve` holds a bounded record
                    self.evicted_episodes += 1
                return self.episodes.setdefault(name, EpisodeLog())
            if name not in self.episodes:
                raise BadRequest(f"episode {name!r}: not open (it ended, or the trainer never started it)")
            return self.episodes[name]

    def chat(self, request: ChatRequest) -> ChatTokens:
        tools = {"tools": request.tools} if request.renders_tools else {}
        return _Chat(self.tokenizer, {**self.template_kwargs, **tools})

    def complete(self, body, episode: str | None = None) -> dict:
        request = chat_request(body, self.max_tokens, self.context)
        log = self.episode(episode) if episode is not None else None
        if log is None:
            return self._complete(request, None)
        with log.lock:  # a call extends the one before it, so an episode's calls go one after another
            log.waiting_since = time.monotonic()
            try:
                return self._complete_recorded(request, log, episode)
            finally:
                log.answered_at = time.monotonic()
                log.waited_s += log.answered_at - log.waiting_since
                log.waiting_since = None

    def _complete_recorded(self, request: ChatRequest, log: EpisodeLog, episode: str) -> dict:
        """A call of a recorded episode, under its lock."""
        if log.closed:
            raise BadRequest(f"episode {episode!r}: ended")
        if request.n != 1:
            raise BadRequest("n: a call of a recorded episode samples one reply")
        key = tools_key(request.tools, request.tool_choice) if request.renders_tools else NO_TOOLS
        retried = log.retried(request.messages, key, request.seed)
        if retried is not None:  # a client's retry of a call already answered: the same reply again
            log.retries += 1
            output = GenerationOutput(retried.completion_ids, retried.log_probs, retried.finish_reason)
            return chat_completion(
                self.model_name, self.tokenizer, request, retried.prompt_ids, [output], [retried.returned]
            )
        if log.max_calls is not None and len(log.calls) >= log.max_calls:
            log.refused += 1
            raise BadRequest(
                f"episode {episode!r}: its {log.max_calls} calls are spent (agent_config.max_turns)"
            )
        return self._complete(request, log, key)

    def _sampling(self, request: ChatRequest, log: EpisodeLog | None) -> SamplingParams:
        if log is not None and log.sampling is not None:
            return replace(
                log.sampling,
                max_new_tokens=min(request.max_tokens, log.sampling.max_new_tokens),
                stop=request.stop,
                seed=None if log.seed is None else log.seed + len(log.calls),
            )
        return SamplingParams(
            temperature=request.temperature,
            top_p=request.top_p,
            max_new_tokens=request.max_tokens,
            stop=request.stop,
            greedy=request.temperature == 0,
            seed=request.seed,
        )

    def _prompt(
        self, request: ChatRequest, chat: ChatTokens, log, key: str, max_new: int
    ) -> tuple[list[int], int | None, bool]:
        """(prompt ids, the recorded call they extend, whether they were cut to fit the context)."""
        try:
            if log is not None:
                prompt, parent = log.prompt_for(request.messages, chat, key)
            else:
                prompt, parent = chat.first_prompt(request.messages), None
        except Exception as err:  # noqa: BLE001 - templates refuse conversations in many ways
            raise BadRequest(f"messages: the chat template cannot render them: {err}") from None
        room = self.context - max_new
        if len(prompt) <= room:
            return prompt, parent, False
        if self.truncation == "error" or room <= 0:
            raise BadRequest(
                f"messages: {len(prompt)} prompt tokens + max_tokens {max_new} exceed the context of "
                f"{self.context}"
            )
        return truncate_prompt(prompt, room, chat.system_prefix_length(request.messages, prompt)), None, True

    def _complete(self, request: ChatRequest, log: EpisodeLog | None, key: str = NO_TOOLS) -> dict:
        sampling = self._sampling(request, log)
        chat = self.chat(request)
        prompt, parent, truncated = self._prompt(request, chat, log, key, sampling.max_new_tokens)
        constraints = self.grammars.for_request(request, chat, sampling.max_new_tokens)
        outputs = self.engine.generate([prompt] * request.n, sampling, constraints)
        messages = [self.reply(out.token_ids, request) for out in outputs]
        if log is not None:
            for i, (out, message) in enumerate(zip(outputs, messages)):
                log.record(
                    Call(
                        request.messages,
                        message,
                        list(prompt),
                        list(out.token_ids),
                        list(out.log_probs or []),
                        parent is not None,
                        reply_sets(out, constraints[i] if constraints else None),
                        out.finish_reason,
                        tools=key,
                        parent=parent,
                        truncated=truncated,
                        request_seed=request.seed,
                    )
                )
        return chat_completion(self.model_name, self.tokenizer, request, prompt, outputs, messages)

    def reply(self, token_ids: list[int], request: ChatRequest) -> dict:
        """The assistant message of sampled `token_ids`: cut before a stop string, its reasoning and tool
        calls parsed in the family's format; special tokens other than a family's tool-call tag are left
        out of the text first (a real Llama's reply ends in its `<|eot_id|>`)."""
        text = self._plain(self.tokenizer.decode(token_ids, skip_special_tokens=False))
        cuts = [text.find(s) for s in request.stop if s in text]
        text = text[: min(cuts)] if cuts else text
        reasoning, text = split_reasoning(text) if self.thinks else (None, text)
        content, calls = split_tool_calls(text, self.tool_parser) if request.renders_tools else (text, [])
        if not request.parallel_tool_calls:
            calls = calls[:1]
        if content is not None and not calls:  # a call tag that opened nothing parsable is not text either
            for marker in _MARKERS:
                content = content.replace(marker, "")
        message = {"role": "assistant", "content": content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = calls
        return message

    def pieces(self, token_ids: list[int], content: str) -> list[str]:
        """`content` cut where its sampled tokens end (a stream's text deltas); what does not decode to a
        prefix of it token by token (a stop string, a half UTF-8 character) goes out with the next piece."""
        out, sent = [], ""
        for k in range(1, len(token_ids) + 1):
            text = self._plain(self.tokenizer.decode(token_ids[:k], skip_special_tokens=False))[
                : len(content)
            ]
            if len(text) > len(sent) and content.startswith(text) and not text.endswith("\ufffd"):
                out.append(text[len(sent) :])
                sent = text
        return out + ([content[len(sent) :]] if len(sent) < len(content) else [])

    def _plain(self, text: str) -> str:
        for token in self._specials:
            text = text.replace(token, "")
        return text
