"""Token ids of a multi-turn chat, built so that nothing sampled is re-tokenised.

An episode is one growing list of token ids: the first prompt, then for every
turn the ids the engine sampled followed by the ids the chat template puts
between that reply and the next one (closing the assistant turn, the new user
message, the generation prompt). Those between-turn ids are a *delta*: the
conversation is rendered with a placeholder in place of the latest reply and
only the text after the placeholder is tokenised. The reply itself is never
rendered or re-encoded, so the engine's prompt at turn k is exactly the
episode's ids so far.
"""

from __future__ import annotations

_PLACEHOLDER = "<<<GRL_REPLY_PLACEHOLDER_5e1f>>>"


class ChatTokens:
    """Chat-template arithmetic on token ids for one tokenizer."""

    def __init__(self, tokenizer, chat_template_kwargs: dict | None = None):
        self.tokenizer = tokenizer
        self.template_kwargs = dict(chat_template_kwargs or {})
        self._tool_role: bool | None = None  # whether the template renders a `tool` message (tool output)

    def end_ids(self) -> list[int]:
        """The end-of-turn token first, then every other special token: what closes a constrained reply,
        and what its free text may not hold."""
        eos = self.tokenizer.eos_token_id
        return [eos] + sorted(set(getattr(self.tokenizer, "all_special_ids", [])) - {eos})

    def encode(self, text: str) -> list[int]:
        # Templates write their own special tokens (BOS included) as text.
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render(self, messages: list[dict], generation_prompt: bool) -> str:
        if any(m.get("role") == "tool" for m in messages) and not self._renders_tool_role():
            messages = [{**m, "role": "user"} if m.get("role") == "tool" else m for m in messages]
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **self.template_kwargs
        )

    def _renders_tool_role(self) -> bool:
        """Tool output goes in the template's tool role where it has one, else in a user message."""
        if self._tool_role is None:
            probe = [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "y"},
                {"role": "tool", "content": _PLACEHOLDER},
            ]
            try:
                self._tool_role = _PLACEHOLDER in self.tokenizer.apply_chat_template(
                    probe, tokenize=False, add_generation_prompt=True, **self.template_kwargs
                )
            except Exception:  # noqa: BLE001 - templates reject roles they do not know in many ways
                self._tool_role = False
        return self._tool_role

    def first_prompt(self, messages: list[dict]) -> list[int]:
        return self.encode(self.render(messages, generation_prompt=True))

    def system_prefix_length(self, messages: list[dict], prompt_ids: list[int]) -> int:
        """How many leading ids of `prompt_ids` are the system message (0 when
        there is none or the template does not render it as a clean prefix)."""
        if not messages or messages[0].get("role") != "system":
            return 0
        try:
            ids = self.encode(self.render(messages[:1], generation_prompt=False))
        except Exception:  # noqa: BLE001 - some templates refuse a conversation without a user turn
            return 0
        return len(ids) if prompt_ids[: len(ids)] == ids else 0

    def turn_delta(self, messages: list[dict], last_sampled_id: int | None) -> list[int]:
        """Ids between the latest assistant reply and the next one.

        `messages` is the conversation after the agent appended its reply and
        the next user message(s). If the engine's last sampled token already is
        the token the template closes a turn with (e.g. `<|im_end|>`), it is
        not added twice; otherwise the delta closes the turn.
        """
        reply_at = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        if reply_at is None:
            raise ValueError("the agent's messages hold no assistant reply to continue from")
        masked = [dict(m) for m in messages]
        masked[reply_at]["content"] = _PLACEHOLDER
        text = self.render(masked, generation_prompt=True)
        cut = text.rfind(_PLACEHOLDER)
        if cut < 0:
            raise ValueError("the chat template dropped the assistant reply; cannot derive the turn delta")
        ids = self.encode(text[cut + len(_PLACEHOLDER) :])
        if ids and last_sampled_id is not None and ids[0] == last_sampled_id:
            ids = ids[1:]
        return ids


def truncate_prompt(ids: list[int], max_length: int, keep_prefix: int, mode: str = "left") -> list[int]:
    """Fit `ids` into `max_length`.

    `left` drops the oldest tokens after the first `keep_prefix` ones (the
    system prompt); if the prefix alone does not fit, it keeps the newest
    tokens. `right` keeps the first `max_length` tokens. `error` raises.
    """
    if len(ids) <= max_length:
        return ids
    if mode == "right":
        return ids[:max_length]
    if mode == "error":
        raise ValueError(f"prompt of {len(ids)} tokens exceeds max_prompt_length {max_length}")
    if keep_prefix >= max_length:
        return ids[-max_length:]
    return ids[:keep_prefix] + ids[len(ids) - (max_length - keep_prefix) :]
