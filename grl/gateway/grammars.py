"""The grammars a chat request may decode under: the replies it allows (`allowed_replies`, the grammar GRL's
agents use) or, for `tool_choice` `"required"` or a named function, one tool call in the model family's
format.

A forced call is the family's opening with the function's name spelled out (any of the tools for
`"required"`), then the arguments as a JSON object that always closes within `max_tokens`
(grl/engines/json_grammar.py; qwen3_coder: free text up to `</function>`), then the family's closing and the
end of turn: exactly one call, whatever `parallel_tool_calls` says, and no text or thinking around it."""

from __future__ import annotations

from grl.engines.constraint import GrammarError, ReplyGrammar, compile_call_grammar, compile_reply_grammar
from grl.engines.json_grammar import JsonVocabulary, token_texts
from grl.gateway.requests import BadRequest, ChatRequest
from grl.rollout.chat import ChatTokens
from grl.toolcalls import call_frames


def forced_names(request: ChatRequest) -> list[str] | None:
    """The functions a reply must call one of, or None when `tool_choice` forces no call."""
    choice = request.tool_choice
    if choice == "required":
        return [
            t.get("function", {}).get("name")
            for t in request.tools or []
            if isinstance(t.get("function"), dict)
        ]
    if isinstance(choice, dict):
        return [choice["function"]["name"]]
    return None


class Grammars:
    """Builds a request's grammars; the tokenizer's token texts, which a JSON object is decoded over, once."""

    def __init__(self, tokenizer, family: str):
        self.tokenizer, self.family = tokenizer, family
        self._vocabulary: JsonVocabulary | None = None

    def vocabulary(self) -> JsonVocabulary:
        if self._vocabulary is None:
            self._vocabulary = JsonVocabulary(token_texts(self.tokenizer))
        return self._vocabulary

    def for_request(self, request: ChatRequest, chat: ChatTokens, max_new: int) -> list[ReplyGrammar] | None:
        """One grammar per reply of `request` (all the same), or None when it decodes freely."""
        names, allowed = forced_names(request), request.allowed_replies
        if names is not None and allowed is not None:
            raise BadRequest(
                "allowed_replies: not with tool_choice 'required' or a named function (one grammar per reply)"
            )
        if names is not None:
            names = [name for name in names if isinstance(name, str) and name]
            if not names:
                raise BadRequest("tool_choice: 'required' needs tools with function names")
            try:
                frames = call_frames(self.family, names)
                grammar = compile_call_grammar(
                    chat.encode, chat.end_ids(), frames, self.vocabulary(), max_new
                )
            except (GrammarError, ValueError) as err:
                raise BadRequest(f"tool_choice: {err} (max_tokens {max_new})") from None
            return [grammar] * request.n
        if allowed is None:
            return None
        if (
            not isinstance(allowed, list)
            or not allowed
            or not all(isinstance(a, str) and a.strip() for a in allowed)
        ):
            raise BadRequest("allowed_replies: a non-empty list of non-empty strings")
        try:
            grammar = compile_reply_grammar(chat.encode, chat.end_ids(), allowed, False, max_new)
        except GrammarError as err:
            raise BadRequest(f"allowed_replies: {err}") from None
        return [grammar] * request.n
