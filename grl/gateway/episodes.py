"""What an agent program's calls become for training: token ids the engine sampled, never re-tokenised.

A program talks in chat messages; the trainer needs one row of token ids per episode with the sampled
tokens marked. Each call of an episode is recorded with the prompt ids the engine saw and the ids it
sampled. When a call sends the conversation back as the gateway left it (the earlier messages as they
were, then the assistant message exactly as the gateway returned it, then new user or tool messages), its
prompt is built by token arithmetic: the previous prompt, the sampled ids, then only the ids the chat
template puts between that reply and the next (`ChatTokens.turn_delta`). The episode stays one row.
When the program edited its history, the call's prompt is rendered whole and starts a new row: a
prefix break, counted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grl.rollout.chat import ChatTokens


@dataclass
class Call:
    messages: list[dict]  # the request's messages, as sent
    returned: dict  # the assistant message the gateway answered with
    prompt_ids: list[int]
    completion_ids: list[int]
    log_probs: list[float]
    continues: bool  # the prompt extends the previous call's prompt and completion token for token


@dataclass
class Row:
    """One training row: `ids`, and for each id whether the engine sampled it (and its log-prob)."""

    ids: list[int]
    sampled: list[bool]
    log_probs: list[float | None]


@dataclass
class EpisodeLog:
    calls: list[Call] = field(default_factory=list)

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
            masked = [*messages[:len(last.messages)], {"role": "assistant", "content": last.returned.get("content") or ""},
                      *messages[len(last.messages) + 1:]]
            delta = chat.turn_delta(masked, last.completion_ids[-1] if last.completion_ids else None)
            return last.prompt_ids + last.completion_ids + delta, True
        return chat.first_prompt(messages), False

    def record(self, call: Call) -> None:
        self.calls.append(call)

    def rows(self) -> list[Row]:
        """One row per run of calls that extend each other; the sampled ids marked."""
        rows: list[Row] = []
        for call in self.calls:
            if not (call.continues and rows):
                rows.append(Row(list(call.prompt_ids), [False] * len(call.prompt_ids), [None] * len(call.prompt_ids)))
            else:
                row = rows[-1]
                between = call.prompt_ids[len(row.ids):]
                row.ids += between
                row.sampled += [False] * len(between)
                row.log_probs += [None] * len(between)
            row = rows[-1]
            row.ids += call.completion_ids
            row.sampled += [True] * len(call.completion_ids)
            row.log_probs += list(call.log_probs)
        return rows


def _extends(messages: list[dict], last: Call) -> bool:
    n = len(last.messages)
    if len(messages) <= n + 1 or messages[:n] != last.messages:
        return False
    reply = messages[n]
    return (reply.get("role") == "assistant" and (reply.get("content") or "") == (last.returned.get("content") or "")
            and _calls(reply) == _calls(last.returned) and all(m.get("role") != "assistant" for m in messages[n + 1:]))


def _calls(message: dict) -> list[tuple[str, str]]:
    """A message's tool calls as (name, arguments), whatever ids and wrappers the client kept."""
    out = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", {}) if isinstance(call, dict) else {}
        out.append((str(function.get("name")), str(function.get("arguments"))))
    return out
