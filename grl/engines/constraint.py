"""Valid-action decoding: a token-level grammar for one reply, shared by every engine and the trainer.

A reply under constraint is

    [<think> free text </think>] <answer> one of the valid actions </answer> <end of turn>

The think part exists when the task enables it. Each valid action is spelled by its *canonical* tokens:
`"<answer>" + action + "</answer>"` encoded on its own, then the tokenizer's end-of-turn token. The
answers form a trie, so at every position the allowed next tokens are the children of the trie node
reached so far; a position with one child is forced. Other tokenizations of the same text are not
allowed: one spelling per answer keeps the grammar a small trie and makes it the same in every engine.

Free text (the think part, or a `{text}` slot inside an action such as WebShop's `search[{text}]`) may
use any token but the special ones; it ends when its closing tokens (the canonical tokens of
`</think>`, or of the text after the slot) have just been sampled. When only enough tokens are left
to close it and finish the longest answer, the closing tokens are forced, so a reply always parses
within its token limit, whichever answer the model then picks.

One action per answer: the later actions of a multi-action answer would act on states the env has
not reached yet, so no grammar built from `valid_actions()` could promise they are valid.

The walk through a grammar is a pure function of the tokens sampled so far, so the allowed set of
every sampled token can be rebuilt after the fact (`ReplyGrammar.trace`): the trainer scores each
token with the same masked softmax that sampled it (`constrain_logits`). An allowed set is stored as
a signed size and a short id list: `+n` ids allowed, `-n` ids denied (free text), 0 unconstrained.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain

from grl.engines.json_grammar import START as JSON_START, JsonObject, JsonVocabulary

SLOT = "{text}"  # a free-text slot inside a valid action, e.g. WebShop's "search[{text}]"
SLOT_ROOM = 8  # tokens a slot keeps for its text, however long the think part ran
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

AllowedSet = tuple[int, tuple[int, ...]]  # (signed size, ids): +n allowed, -n denied, 0 anything
UNCONSTRAINED: AllowedSet = (0, ())


class GrammarError(ValueError):
    """A grammar cannot be built from these answers (e.g. none fits the token budget)."""


@dataclass(frozen=True)
class _Free:
    """Free text up to `close`; then the walk goes on at node `next`. `room`: tokens of text kept
    for it when an earlier free part is closed for lack of budget."""

    close: tuple[int, ...]
    next: int
    deny: tuple[int, ...]
    room: int = 0


class ReplyGrammar:
    """An automaton over token ids. Nodes are either trie nodes (`dict token -> node`; an empty
    dict is the end) or free-text nodes (`_Free`). Plain data: it pickles to an engine process."""

    def __init__(
        self,
        nodes: list[dict[int, int] | _Free | JsonObject],
        max_tokens: int,
        left_out: tuple[str, ...] = (),
    ):
        self.nodes = nodes
        self.max_tokens = max_tokens
        self.left_out = left_out  # valid actions too long for max_tokens
        self.reserve = self._reserves()

    def _reserves(self) -> list[int]:
        """Tokens that finishing the reply from each node may take, whichever answer is chosen
        (free text counted empty): a free part is closed while that many are left. Every node
        points to nodes built after it, so a reverse sweep settles them."""
        reserve = [0] * len(self.nodes)
        for index in range(len(self.nodes) - 1, -1, -1):
            node = self.nodes[index]
            if isinstance(node, _Free):
                reserve[index] = node.room + len(node.close) + reserve[node.next]
            elif isinstance(node, JsonObject):
                reserve[index] = 2 + reserve[node.next]  # "{}"
            elif node:
                reserve[index] = 1 + max(reserve[child] for child in node.values())
        return reserve

    def walker(self) -> GrammarWalker:
        return GrammarWalker(self)

    def trace(self, token_ids: Sequence[int]) -> list[AllowedSet]:
        """The allowed set at each position of a reply sampled under this grammar. Raises
        ValueError if a token was not allowed (the engine did not honour the grammar)."""
        walker, sets = self.walker(), []
        for position, token in enumerate(token_ids):
            allowed = walker.allowed()
            size, ids = allowed
            if (size > 0 and token not in ids) or (size < 0 and token in ids):
                raise ValueError(
                    f"token {token} at position {position} is outside the grammar's allowed set {ids}"
                )
            sets.append(allowed)
            walker.advance(token)
        return sets


class GrammarWalker:
    """Where one reply stands in its grammar."""

    def __init__(self, grammar: ReplyGrammar):
        self.grammar = grammar
        self.node = 0
        self.used = 0  # tokens sampled so far
        self.free_tokens: list[int] = []  # tokens of the current free-text part
        self.forcing: list[int] = []  # closing tokens still to force
        self.json = JSON_START  # where a JSON node's object stands
        # a JSON node's allowed sets, by (node, state, tokens left): they cost a pass over the vocabulary
        self.cache: dict = {}

    @property
    def done(self) -> bool:
        node = self.grammar.nodes[self.node]
        return not self.forcing and isinstance(node, dict) and not node

    def _start_forcing(self) -> None:
        """Inside free text with only the budget left that closing it and the longest answer take:
        the closing tokens come next. Run before both `allowed` and `advance`, so the walk is a
        function of the tokens alone, however often the allowed set was asked for (an engine that
        resumes a request catches up on several tokens at once)."""
        node = self.grammar.nodes[self.node]
        if (
            not self.forcing
            and isinstance(node, _Free)
            and self.grammar.max_tokens - self.used <= self.grammar.reserve[self.node] - node.room
        ):
            self.forcing = list(node.close)

    def allowed(self) -> AllowedSet:
        self._start_forcing()
        if self.forcing:
            return (1, (self.forcing[0],))
        node = self.grammar.nodes[self.node]
        if isinstance(node, _Free):
            return (-len(node.deny), node.deny)
        if isinstance(node, JsonObject):
            room = self.grammar.max_tokens - self.used - 1 - self.grammar.reserve[node.next]
            key = (self.node, self.json, room)
            if key not in self.cache:
                self.cache[key] = node.allowed(self.json, room)
            return self.cache[key]
        if not node:  # the end: the engine stops on the end-of-turn token, so this is never sampled
            return UNCONSTRAINED
        ids = tuple(sorted(node))
        return (len(ids), ids)

    def advance(self, token: int) -> None:
        self._start_forcing()
        self.used += 1
        node = self.grammar.nodes[self.node]
        if self.forcing:
            self.forcing.pop(0)
            if not self.forcing:
                self._leave_free(node)
            return
        if isinstance(node, _Free):
            self.free_tokens.append(token)
            if tuple(self.free_tokens[-len(node.close) :]) == node.close:
                self._leave_free(node)
        elif isinstance(node, JsonObject):
            self.json = node.advance(self.json, token)
            if self.json is None:
                raise ValueError(f"token {token} does not continue the JSON object")
            if self.json[1] == "D":
                self.node, self.json = node.next, JSON_START
        elif node:
            self.node = node[token]

    def _leave_free(self, node: _Free) -> None:
        self.node = node.next
        self.free_tokens = []

    def forced(self) -> tuple[list[int], bool]:
        """The tokens forced from here on (each the only one allowed) and whether they finish the
        reply; the walk itself does not move. Engines skip the model for them: under the grammar
        their probability is 1."""
        probe = GrammarWalker(self.grammar)
        probe.node, probe.used = self.node, self.used
        probe.free_tokens, probe.forcing = list(self.free_tokens), list(self.forcing)
        probe.json, probe.cache = self.json, self.cache
        run = []
        while not probe.done:
            size, ids = probe.allowed()
            if size != 1:
                break
            run.append(ids[0])
            probe.advance(ids[0])
        return run, probe.done


def compile_reply_grammar(
    encode: Callable[[str], list[int]],
    end_ids: Sequence[int],
    actions: Sequence[str],
    think: bool,
    max_tokens: int,
) -> ReplyGrammar:
    """The grammar of a reply that holds one of `actions` (see the module doc).

    `encode` turns text into token ids without special tokens; `end_ids[0]` ends the turn (the chat
    template's end-of-turn token) and every id of `end_ids` is denied inside free text. Actions whose
    tokens do not fit in `max_tokens` are left out; if none fits, GrammarError.
    """
    end, deny = int(end_ids[0]), tuple(sorted({int(i) for i in end_ids}))
    nodes: list = [{}]

    def new(node) -> int:
        nodes.append(node)
        return len(nodes) - 1

    def chain(start: int, ids: Sequence[int]) -> int:
        """Insert `ids` below trie node `start`; -> the node reached."""
        at = start
        for token in ids:
            node = nodes[at]
            if isinstance(node, _Free):
                raise GrammarError("an answer continues where another answer has a free-text slot")
            if token not in node:
                node[token] = new({})
            at = node[token]
        return at

    answer_root = 0
    overhead = 0
    if think:
        think_close = tuple(encode(THINK_CLOSE))
        opened = chain(0, encode(THINK_OPEN))
        answer_root = new({})
        nodes[opened] = _Free(think_close, answer_root, deny)
        overhead = len(encode(THINK_OPEN)) + len(think_close)

    fitted, left_out = 0, []
    for action in dict.fromkeys(a for a in actions if isinstance(a, str) and a.strip()):
        if SLOT in action:
            before, after = action.split(SLOT, 1)
            head = encode(ANSWER_OPEN + before)
            close = tuple(encode(after)) if after else tuple(encode(ANSWER_CLOSE))
            tail = (encode(ANSWER_CLOSE) if after else []) + [end]
            if overhead + len(head) + SLOT_ROOM + len(close) + len(tail) > max_tokens:
                left_out.append(action)
                continue
            slot_at = chain(answer_root, head)
            if nodes[slot_at]:
                raise GrammarError(f"the free-text slot of {action!r} starts where another answer goes on")
            rest = new({})
            chain(rest, tail)
            nodes[slot_at] = _Free(close, rest, deny, SLOT_ROOM)
        else:
            ids = encode(ANSWER_OPEN + action + ANSWER_CLOSE) + [end]
            if overhead + len(ids) > max_tokens:
                left_out.append(action)
                continue
            chain(answer_root, ids)
        fitted += 1
    if fitted == 0:
        raise GrammarError(f"none of the {len(actions)} valid actions fits in {max_tokens} reply tokens")
    return ReplyGrammar(nodes, max_tokens, tuple(left_out))


def compile_call_grammar(
    encode: Callable[[str], list[int]],
    end_ids: Sequence[int],
    frames: Sequence[tuple[str, str | None, str]],
    vocabulary: JsonVocabulary,
    max_tokens: int,
) -> ReplyGrammar:
    """The grammar of a reply that is one tool call in one of `frames`, then the end of turn. A frame is
    `(head, close, tail)`: `head` and `tail` spelled by their canonical tokens and between them a JSON
    object (`close` None; grl/engines/json_grammar.py) or free text up to `close`. Frames that do not fit
    in `max_tokens` are left out; if none fits, GrammarError."""
    end, deny = int(end_ids[0]), tuple(sorted({int(i) for i in end_ids}))
    nodes: list = [{}]
    left_out = []
    for head, close, tail in frames:
        head_ids, tail_ids = encode(head), encode(tail) + [end]
        close_ids = tuple(encode(close)) if close is not None else ()
        if len(head_ids) + (len(close_ids) if close is not None else 2) + len(tail_ids) > max_tokens:
            left_out.append(head)
            continue
        at = 0
        for token in head_ids:
            if not isinstance(nodes[at], dict):
                raise GrammarError(f"the call {head!r} goes on where another call's arguments are")
            at = nodes[at].setdefault(token, len(nodes))
            if at == len(nodes):
                nodes.append({})
        if nodes[at]:
            raise GrammarError(f"the arguments of {head!r} start where another call goes on")
        rest = len(nodes)
        nodes.append({})
        for token in tail_ids:
            nodes[-1][token] = len(nodes)
            nodes.append({})
        nodes[at] = JsonObject(vocabulary, rest) if close is None else _Free(close_ids, rest, deny)
    if len(left_out) == len(frames):
        raise GrammarError(f"no tool call fits in {max_tokens} reply tokens")
    return ReplyGrammar(nodes, max_tokens, tuple(left_out))


# ---------------------------------------------------------------------------- tensors


def allowed_sets_tensors(sets: Sequence[AllowedSet]):
    """Per-position allowed sets -> (sizes `[N]` long, ids `[N, K]` long, zero-padded)."""
    import numpy as np
    import torch

    # Filled in numpy and wrapped once: a tensor per row costs more than the row's few ids.
    counts = np.fromiter((len(members) for _, members in sets), np.int64, len(sets))
    width = int(counts.max()) if len(sets) else 0
    sizes = np.fromiter((size for size, _ in sets), np.int64, len(sets))
    ids = np.zeros((len(sets), max(width, 1)), np.int64)
    listed = np.arange(ids.shape[1])[None, :] < counts[:, None]  # row-major, as the ids are chained
    ids[listed] = np.fromiter(
        chain.from_iterable(members for _, members in sets), np.int64, int(counts.sum())
    )
    return torch.from_numpy(sizes), torch.from_numpy(ids)


def constrain_logits(logits, sizes, ids):
    """Logits `[N, V]` with every token outside its row's allowed set at -inf (see the module doc
    for `sizes` `[N]` and `ids` `[N, K]`). A softmax of the result is the masked distribution."""
    import torch

    vocab = logits.shape[-1]
    count = sizes.abs()
    listed = torch.arange(ids.shape[-1], device=ids.device)[None, :] < count[:, None]
    spare = torch.full_like(ids, vocab)  # listed entries go to their column, padding to a spare one
    marked = torch.zeros((logits.shape[0], vocab + 1), dtype=torch.bool, device=logits.device)
    marked.scatter_(1, torch.where(listed, ids, spare), True)
    return _outside_to_minus_inf(logits, sizes, marked[:, :vocab])


def constrain_logits_flat(logits, sizes, ids):
    """`constrain_logits` with the sets' ids given flat: `ids` `[sum |sizes|]` lists row 0's set,
    then row 1's, and so on (the batch's compact form, grl/rollout/allowed_sets.py)."""
    import torch

    rows = set_owners(sizes, len(ids))
    marked = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
    marked[rows, ids.long()] = True
    return _outside_to_minus_inf(logits, sizes, marked)


def set_owners(sizes, total: int):
    """The position each id of the flat sets belongs to: position i repeated `|sizes[i]|` times."""
    import torch

    return torch.repeat_interleave(
        torch.arange(len(sizes), device=sizes.device), sizes.abs(), output_size=total
    )


def _outside_to_minus_inf(logits, sizes, marked):
    """`marked` `[N, V]`: the ids each row lists (its allowed ones if its size is positive, else its denied
    ones)."""
    import torch

    allowed = torch.where((sizes > 0)[:, None], marked, ~marked)
    return logits.masked_fill(~allowed, float("-inf"))
