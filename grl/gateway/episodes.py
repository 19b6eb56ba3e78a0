"""What an agent program's calls become for training: token ids the engine sampled, never re-tokenised.

A program talks in chat messages; the trainer needs the token ids of each episode with the sampled tokens
marked (`EpisodeLog.turns`: the `Turn`s GRL's own agents produce). Each call of an episode is recorded
with the prompt ids the engine saw and the ids it sampled. When a call sends the conversation back as the
gateway left it (the earlier messages as they were, then the assistant message exactly as the gateway
returned it, then new user or tool messages), its prompt is built by token arithmetic: the previous
prompt, the sampled ids, then only the ids the chat template puts between that reply and the next
(`ChatTokens.turn_delta`). The episode stays one sequence. When the program edited its history, the
call's prompt is rendered whole and starts a sequence of its own: a prefix break, counted.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from grl.engines.base import SamplingParams
from grl.rollout.chat import ChatTokens
from grl.rollout.types import Turn


@dataclass
class Call:
    messages: list[dict]  # the request's messages, as sent
    returned: dict  # the assistant message the gateway answered with
    prompt_ids: list[int]
    completion_ids: list[int]
    log_probs: list[float]
    continues: bool  # the prompt extends the previous call's prompt and completion token for token
    allowed: list | None = None  # under `allowed_replies`: each sampled token's allowed set (ReplyGrammar.trace)
    finish_reason: str = ""


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
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)  # one call at a time

    @property
    def prefix_breaks(self) -> int:
        return sum(1 for call in self.calls[1:] if not call.continues)

    def prompt_for(self, messages: list[dict], chat: ChatTokens) -> tuple[list[int], bool]:
        """The prompt ids of a call with `messages` -> (ids, whether they extend the previous call)."""
        last = self.calls[-1] if self.calls else None
        if last is not None and _extends(messages, last):
            # The reply is the ids the engine sampled; the template renders only what follows it. The
            # assistant message is reduced to its text so that a rendered tool call is not added twice
            # (the sampled ids already hold it).
            masked = [
                *messages[: len(last.messages)],
                {"role": "assistant", "content": last.returned.get("content") or ""},
                *messages[len(last.messages) + 1 :],
            ]
            delta = chat.turn_delta(masked, last.completion_ids[-1] if last.completion_ids else None)
            return last.prompt_ids + last.completion_ids + delta, True
        return chat.first_prompt(messages), False

    def record(self, call: Call) -> None:
        self.calls.append(call)

    def turns(self) -> list[Turn]:
        """The calls as the turns of one training episode: a call that extends the one before adds only
        its new prompt ids; one that does not is a whole prompt of its own (`Turn.new_context`: the batch
        restarts its positions and lets it attend only to itself, as a separate row would)."""
        turns: list[Turn] = []
        for before, call in zip([None, *self.calls], self.calls):
            continues = call.continues and before is not None
            seen = len(before.prompt_ids) + len(before.completion_ids) if continues else 0
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


def _extends(messages: list[dict], last: Call) -> bool:
    n = len(last.messages)
    if len(messages) <= n + 1 or messages[:n] != last.messages:
        return False
    reply = messages[n]
    return (
        reply.get("role") == "assistant"
        and (reply.get("content") or "") == (last.returned.get("content") or "")
        and _calls(reply) == _calls(last.returned)
        and all(m.get("role") != "assistant" for m in messages[n + 1 :])
    )


def _calls(message: dict) -> list[tuple[str, str]]:
    """A message's tool calls as (name, arguments), whatever ids and wrappers the client kept."""
    out = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        out.append((str(function.get("name")), str(function.get("arguments"))))
    return out
