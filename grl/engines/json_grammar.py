"""A JSON object as a node of a reply grammar (grl/engines/constraint.py): the free arguments of a tool call.

The node reads each token as its text (`token_texts`) and runs the text character by character through a
JSON recogniser whose state is a small tuple: `(open containers, mode, detail)`. A token is allowed when
its whole text keeps the object valid and, after it, the shortest way to close the object still fits in
the tokens left (`completion`: every closing character has a token of its own, checked when the node is
built). So a reply under this node always holds a complete object within its token limit, without a
forced phase: when only the closing fits, only closing tokens pass. The object is the whole node: a token
that would close it and go on is refused, and the walk leaves the node once the object is closed.

Strings refuse control characters and escapes of lone surrogates (`json.loads` would take them, a UTF-8
response could not be written). A token whose text is empty, not whole UTF-8 or a special token is never
allowed; an id beyond the tokenizer's (a padded embedding row) cannot be named in a denied set without
knowing the model's width, so it is read as empty text where strings allow everything else.
"""

from __future__ import annotations

from collections.abc import Sequence

State = tuple[str, str, str]  # (open containers "{[", mode, detail); modes below
START: State = ("", "T", "")  # T: before the object; D: after it
_WHITESPACE = frozenset(" \t\n\r")
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")
_ESCAPED = frozenset('"\\/bfnrt')
_LITERALS = ("true", "false", "null")
_ENDING_NUMBERS = frozenset("0IFX")  # number details after which the number may end
_CLOSING = {"{": "}", "[": "]"}
# characters `completion` counts on, each sampled as one token
_CLOSERS = '{}]":0n' + "".join({c for word in _LITERALS for c in word[1:]})
# the extra characters each mode needs to close, beyond one per open container
_MODE_EXTRA = {"T": 2, "D": 0, "O": 0, "A": 0, "E": 0, "K": 4, "C": 2, "V": 1}


def _value(stack: str, ch: str) -> State | None:
    if ch == '"':
        return (stack, "S", "v")
    if ch in "{[":
        return (stack + ch, "O" if ch == "{" else "A", "")
    if ch == "-" or ch in _DIGITS:
        return (stack, "N", "0" if ch == "0" else "-" if ch == "-" else "I")
    for word in _LITERALS:
        if ch == word[0]:
            return (stack, "L", word[1:])
    return None


def _ended(stack: str) -> State:
    """After a value (or a closed container) inside `stack`."""
    return (stack, "E", "") if stack else ("", "D", "")


def _number(detail: str, ch: str) -> str | None:
    digit = ch in _DIGITS
    if detail == "-":
        return ("0" if ch == "0" else "I") if digit else None
    if detail in "0I" and ch == ".":
        return "."
    if detail in "0IF" and ch in "eE":
        return "e"
    if detail in "I.F":
        return ("F" if detail != "I" else "I") if digit else None
    if detail == "e" and ch in "+-":
        return "s"
    return "X" if detail in "esX" and digit else None


def _string(stack: str, detail: str, ch: str) -> State | None:
    kind, escape = detail[0], detail[1:]
    if not escape:
        if ch == '"':
            return (stack, "C", "") if kind == "k" else _ended(stack)
        if ch == "\\":
            return (stack, "S", kind + "\\")
        return None if ch < " " else (stack, "S", detail)
    if escape == "\\":
        if ch == "u":
            return (stack, "S", kind + "u")
        return (stack, "S", kind) if ch in _ESCAPED else None
    digits = escape[1:]
    if ch not in _HEX or (digits in ("d", "D") and ch not in "01234567"):  # D800-DFFF: a lone surrogate
        return None
    return (stack, "S", kind) if len(digits) == 3 else (stack, "S", detail + ch)


def step(state: State, ch: str) -> State | None:
    """The state after character `ch`, or None where the object cannot go on with it."""
    stack, mode, detail = state
    if mode == "S":
        return _string(stack, detail, ch)
    if mode == "N":
        after = _number(detail, ch)
        if after is not None:
            return (stack, "N", after)
        return step(_ended(stack), ch) if detail in _ENDING_NUMBERS else None
    if mode == "L":
        if ch != detail[0]:
            return None
        return (stack, "L", detail[1:]) if len(detail) > 1 else _ended(stack)
    if mode == "T":
        return ("{", "O", "") if ch == "{" else None
    if mode == "D":
        return None
    if ch in _WHITESPACE:
        return state
    if mode in "OK":
        if ch == '"':
            return (stack, "S", "k")
        return _ended(stack[:-1]) if mode == "O" and ch == "}" else None
    if mode == "C":
        return (stack, "V", "") if ch == ":" else None
    if mode == "A" and ch == "]":
        return _ended(stack[:-1])
    if mode in "AV":
        return _value(stack, ch)
    if ch == ",":  # mode E
        return (stack, "K" if stack[-1] == "{" else "V", "")
    return _ended(stack[:-1]) if ch == _CLOSING[stack[-1]] else None


def completion(state: State) -> int:
    """How many characters the shortest close of the object from `state` takes."""
    stack, mode, detail = state
    if mode == "S":
        escape = detail[1:]
        extra = (1 if detail[0] == "v" else 3) + (
            0 if not escape else 1 if escape == "\\" else 5 - len(escape)
        )
    elif mode == "N":
        extra = 0 if detail in _ENDING_NUMBERS else 1
    elif mode == "L":
        extra = len(detail)
    else:
        extra = _MODE_EXTRA[mode]
    return extra + len(stack)


def run(state: State, text: str) -> State | None:
    for ch in text:
        state = step(state, ch)
        if state is None:
            return None
    return state


def token_texts(tokenizer) -> tuple[str, ...]:
    """Each token id's text as it reads inside a reply ("" for those never allowed: special tokens, partial
    UTF-8). Decoded after an anchor token, so tokenizers that drop a word's leading space alone keep it."""
    anchor = tokenizer("0", add_special_tokens=False)["input_ids"][-1]
    head = tokenizer.decode([anchor])
    special = set(getattr(tokenizer, "all_special_ids", [])) | set(tokenizer.get_added_vocab().values())
    texts = []
    for token in range(len(tokenizer)):
        text = "" if token in special else tokenizer.decode([anchor, token])[len(head) :]
        texts.append("" if "\ufffd" in text else text)
    return tuple(texts)


class JsonVocabulary:
    """A tokenizer's token texts (`token_texts`), indexed for `JsonObject`; built once, shared by its
    nodes."""

    def __init__(self, texts: Sequence[str]):
        self.texts = tuple(texts)
        singles = {text for text in self.texts if len(text) == 1}
        missing = [ch for ch in _CLOSERS if ch not in singles]
        if missing:
            raise ValueError(
                f"the tokenizer has no single-character token for {''.join(missing)!r}: JSON cannot be closed"
            )
        self.never = tuple(token for token, text in enumerate(self.texts) if not text)
        # inside a string, a token without these characters only lengthens it
        self.stringy = tuple(
            t for t, text in enumerate(self.texts) if text and any(ch in '"\\' or ch < " " for ch in text)
        )
        by_first: dict[str, list[int]] = {}
        for token, text in enumerate(self.texts):
            if text:
                by_first.setdefault(text[0], []).append(token)
        self.by_first = {ch: tuple(tokens) for ch, tokens in by_first.items()}


class JsonObject:
    """A grammar node: one JSON object, then the walk goes on at node `next`. Plain data (it pickles)."""

    def __init__(self, vocabulary: JsonVocabulary, next: int):
        self.vocabulary, self.next = vocabulary, next

    def advance(self, state: State, token: int) -> State | None:
        """The state after `token` (None: the token is outside the object)."""
        texts = self.vocabulary.texts
        return run(state, texts[token]) if token < len(texts) else state

    def allowed(self, state: State, room: int) -> tuple[int, tuple[int, ...]]:
        """The allowed set (see constraint.AllowedSet) at `state` when the object must close within `room`
        more tokens after the next one."""
        vocabulary = self.vocabulary

        def fits(token: int) -> bool:
            after = run(state, vocabulary.texts[token])
            return after is not None and completion(after) <= room

        if state[1] == "S" and len(state[2]) == 1 and completion(state) <= room:
            refused = set(vocabulary.never) | {t for t in vocabulary.stringy if not fits(t)}
            return (-len(refused), tuple(sorted(refused)))
        firsts = [ch for ch in vocabulary.by_first if step(state, ch) is not None]
        ids = sorted(t for ch in firsts for t in vocabulary.by_first[ch] if fits(t))
        return (len(ids), tuple(ids))
