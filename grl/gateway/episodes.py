"""What an agent program's calls become for training: token ids the engine sampled, never re-tokenised.

A program talks in chat messages; the trainer needs the token ids of each episode with the sampled tokens
marked (`EpisodeLog.turns`: the `Turn`s GRL's own agents produce). Each call of an episode is recorded
with the prompt ids the engine saw and the ids it sampled. When a call sends the conversation back as the
gateway left it (the earlier messages as they were, then the assistant message exactly as the gateway
returned it, then new user or tool messages), its prompt is built by token arithmetic: the previous
prompt, the sampled ids, then only the ids the chat template puts between that reply and the next
(`ChatTokens.turn_delta`). The tools and tool_choice must be those of the call continued, and an
assistant message matches the reply with its reasoning removed (a program may strip earlier `<think>`
blocks; the record keeps the sampled ids, thinking included).

Lineages: a call continues the recorded call whose conversation it extends with the most messages, not only
the last call, so interleaved sub-agents each grow a sequence of their own (a `branch`: a new row of the
episode, its prompt still built by token arithmetic). A call that sends exactly a recorded call's request
again, `seed` included (a retry), is answered with the recorded reply and records nothing; a program that
wants another sample of the same conversation sends another `seed`. When the program edited its
history, the call's prompt is rendered whole and starts a sequence of its own: a prefix break. A prompt
longer than the context is cut from the left (`truncated`) and starts a sequence of its own. Each kind is
counted.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field

from grl.engines.base import SamplingParams
from grl.toolcalls import without_reasoning
from grl.rollout.chat import ChatTokens
from grl.rollout.types import Turn


def tools_key(tools: list | None, tool_choice) -> str:
    return json.dumps([tools, tool_choice], sort_keys=True)


NO_TOOLS = tools_key(None, None)


@dataclass
class Call:
    messages: list[dict]  # the request's messages, as sent
    returned: dict  # the assistant message the gateway answered with
    prompt_ids: list[int]
    completion_ids: list[int]
    log_probs: list[float]
    continues: bool  # the prompt extends a recorded call's prompt and completion token for token
    allowed: list | None = (
        None  # each token's kept set (top-k/top-p), else its grammar's (`allowed_replies`, forced tool call)
    )
    finish_reason: str = ""
    tools: str = NO_TOOLS  # the tools the template rendered and the tool_choice, as `tools_key` writes them
    parent: int | None = None  # the index of the call whose prompt and reply this one's prompt extends
    truncated: bool = False  # the prompt was cut from the left to fit the context
    request_seed: int | None = (
        None  # the request's own `seed`: a repeat with another seed asks for a new sample
    )


@dataclass
class EpisodeLog:
    """The calls of one episode. An episode the trainer opened (grl/gateway/programs.py) samples with the
    rollout's `sampling`, whatever the request asks, since the update scores the tokens under that very
    distribution; `seed` seeds its k-th call with `seed + k`; after `max_calls` calls, or once `closed`
    (the program ran out of time), calls are refused and counted in `refused`."""

    calls: list[Call] = field(default_factory=list)
    sampling: SamplingParams | None = None
    seed: int | None = None
    max_calls: int | None = None
    closed: bool = False
    refused: int = 0
    retries: int = 0
    # How long its calls waited for their answers, for the blame of a program timeout
    # (program_pool.timeout_blamed).
    waited_s: float = 0.0
    waiting_since: float | None = None  # time.monotonic() when the call in flight came in
    answered_at: float | None = None  # ... when the last call was answered
    lock: threading.Lock = field(
        default_factory=threading.Lock, repr=False, compare=False
    )  # one call at a time

    @property
    def prefix_breaks(self) -> int:
        """Calls after the first that continue no recorded call (the program edited its history)."""
        return sum(1 for call in self.calls[1:] if call.parent is None and not call.truncated)

    @property
    def branches(self) -> int:
        """Calls that continue a recorded call other than the one just before (a sub-agent's lineage)."""
        return sum(1 for i, call in enumerate(self.calls) if call.parent is not None and call.parent != i - 1)

    @property
    def truncations(self) -> int:
        return sum(1 for call in self.calls if call.truncated)

    def retried(
        self, messages: list[dict], tools: str = NO_TOOLS, request_seed: int | None = None
    ) -> Call | None:
        """The latest recorded call whose request this one repeats exactly."""
        for call in reversed(self.calls):
            if call.tools == tools and call.messages == messages and call.request_seed == request_seed:
                return call
        return None

    def prompt_for(
        self, messages: list[dict], chat: ChatTokens, tools: str = NO_TOOLS
    ) -> tuple[list[int], int | None]:
        """The prompt ids of a call with `messages` -> (ids, the index of the call they extend or None)."""
        best = None
        for i in range(len(self.calls) - 1, -1, -1):
            call = self.calls[i]
            longer = best is None or len(call.messages) > len(self.calls[best].messages)
            if longer and call.tools == tools and _extends(messages, call):
                best = i
        if best is None:
            return chat.first_prompt(messages), None
        before = self.calls[best]
        # The reply is the ids the engine sampled; the template renders only what follows it. The
        # assistant message is reduced to its text so that a rendered tool call is not added twice
        # (the sampled ids already hold it).
        masked = [
            *messages[: len(before.messages)],
            {"role": "assistant", "content": before.returned.get("content") or ""},
            *messages[len(before.messages) + 1 :],
        ]
        delta = chat.turn_delta(masked, before.completion_ids[-1] if before.completion_ids else None)
        return before.prompt_ids + before.completion_ids + delta, best

    def idle_s(self, now: float) -> float | None:
        """Seconds since its last call was answered: 0 while one is in flight, None before the first."""
        if self.waiting_since is not None:
            return 0.0
        return None if self.answered_at is None else now - self.answered_at

    def busy_s(self, now: float) -> float:
        """Seconds its calls waited for their answers, the one in flight included."""
        return self.waited_s + (now - self.waiting_since if self.waiting_since is not None else 0.0)

    def record(self, call: Call) -> None:
        self.calls.append(call)

    def turns(self) -> list[Turn]:
        """The calls as the turns of one training episode: a call that extends the one before adds only
        its new prompt ids; any other is a whole prompt of its own (`Turn.new_context`: the batch restarts
        its positions and lets it attend only to itself, as a separate row would)."""
        turns: list[Turn] = []
        for i, call in enumerate(self.calls):
            continues = i > 0 and call.parent == i - 1 and not call.truncated
            before = self.calls[i - 1] if continues else None
            seen = len(before.prompt_ids) + len(before.completion_ids) if before is not None else 0
            turns.append(
                Turn(
                    prompt_ids=list(call.prompt_ids[seen:]),
                    response_ids=list(call.completion_ids),
                    response_log_probs=list(call.log_probs) if call.log_probs else None,
                    reward=0.0,
                    finish_reason=call.finish_reason,
                    response_allowed=call.allowed,
                    new_context=bool(turns) and not continues,
                )
            )
        return turns


def _same(message: dict, other: dict) -> bool:
    """Two messages alike, an assistant's compared without its reasoning and tool-call ids."""
    if message.get("role") != other.get("role"):
        return False
    if message.get("role") != "assistant":
        return message == other
    return without_reasoning(message.get("content")) == without_reasoning(other.get("content")) and _calls(
        message
    ) == _calls(other)


def _extends(messages: list[dict], last: Call) -> bool:
    n = len(last.messages)
    if len(messages) <= n + 1 or not all(_same(a, b) for a, b in zip(messages[:n], last.messages)):
        return False
    return _same(messages[n], last.returned) and all(m.get("role") != "assistant" for m in messages[n + 1 :])


def _calls(message: dict) -> list[tuple[str, str]]:
    """A message's tool calls as (name, arguments), whatever ids and wrappers the client kept."""
    out = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        out.append((str(function.get("name")), _canonical(function.get("arguments"))))
    return out


def _canonical(arguments) -> str:
    """Arguments as one JSON text, whether sent as a JSON string or as the object."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True)
