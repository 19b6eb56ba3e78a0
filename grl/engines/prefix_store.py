"""The hf engine's prefix cache (grl/engines/hf.py), within a byte budget.

Between two generate calls the engine keeps every sequence's keys and values, so that a multi-turn episode's
next prompt computes only its new tokens. Unbounded, that store is every row's whole context, held twice
during a call (the last call's sequences while this call's are written): 256 rows of ten Sokoban turns took
a rank to 15.6 GiB. Here the store frees a sequence as soon as the last row that extends it has been laid
into its chunk's cache, and it never holds more than its budget: past it, the sequences no row of this call
extends go first (the oldest first), then this call's own, in the order they were written. A sequence let go
is only a cache miss: its row is prefilled whole next time, with the same reply.

The budget is the engine's `kv_cache_gb`: three quarters for the store, one quarter for a call's working cache
(the chunk the model runs, grl/engines/kv_slab.py), whose rows the engine sizes to fit
(`HFEngine._chunks`). The rollout keeps the rows it runs at once within it (`rows_within`), as vLLM's
scheduler keeps requests waiting while its cache is full, so that a run whose rows do not all fit waits rather
than evicts.
"""

from __future__ import annotations

from collections import Counter

GIB = 2**30
STORE_SHARE = 0.75  # of the budget; the rest is a call's working cache
CHUNK_ROWS = 64  # rows the hf engine runs in one forward, at most (its max_batch_size)
# Calls a cached sequence survives without being extended (its episode finished, or waits on its env).
KEEP_CALLS = 8

KV = list  # per layer (keys, values), each `[heads, len(ids), dim]`


def kv_bytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


def kv_token_bytes(layers: int, kv_width: int, element_size: int) -> int:
    """The keys and values one token leaves in the cache: every layer's, `kv_width` (key-value heads x head
    dim) wide each."""
    return layers * 2 * kv_width * element_size


def rows_within(budget_gib: float | None, row_tokens: int, token_bytes: int) -> int | None:
    """How many rows of `row_tokens` tokens (keys and values of `token_bytes` a token) the store of a
    `budget_gib` budget holds at once; None for no budget, at least 1."""
    if budget_gib is None:
        return None
    return max(1, int(budget_gib * GIB * STORE_SHARE) // max(1, row_tokens * token_bytes))


class PrefixStore:
    """`last`: the sequences the current call may extend (the previous call's, and older ones carried while
    unextended); `next`: the sequences this call writes for the next. `budget_bytes` None: unbounded."""

    def __init__(self, budget_bytes: int | None = None):
        self.limit = None if budget_bytes is None else int(budget_bytes * STORE_SHARE)
        self.last: dict[tuple[int, ...], KV] = {}
        self.next: dict[tuple[int, ...], KV] = {}
        self.ages: dict[tuple[int, ...], int] = {}  # calls a carried sequence has waited unextended
        self.extended: set[tuple[int, ...]] = set()
        self.evicted = 0  # sequences let go for the budget, over the engine's life
        self._rows_left: Counter = Counter()  # rows of this call still to extend each sequence of `last`
        self._held = 0

    @property
    def held_bytes(self) -> int:
        return self._held

    def clear(self) -> None:
        self.last, self.next, self.ages, self.extended = {}, {}, {}, set()
        self._rows_left, self._held = Counter(), 0

    def longest(self, prompt: list[int]) -> tuple[int, ...]:
        """The longest sequence of `last` that `prompt` extends, leaving at least one token to run (for the
        next-token logits); () when there is none."""
        best: tuple[int, ...] = ()
        for ids in self.last:
            if len(best) < len(ids) < len(prompt) and tuple(prompt[: len(ids)]) == ids:
                best = ids
        return best

    def begin(self, prompts: list[list[int]]) -> list[tuple[int, ...]]:
        """A call of `prompts` starts: the previous call's sequences become the ones to extend. -> the one
        each prompt extends (`longest`)."""
        self.last, self.next, self.extended = self.next, {}, set()
        prefixes = [self.longest(list(p)) for p in prompts]
        self._rows_left = Counter(ids for ids in prefixes if ids)
        return prefixes

    def put(self, ids: tuple[int, ...], kv: KV, now: bool = False) -> None:
        """Keep `kv` for the next call (`now`: for this one, a prompt several rows share), within budget."""
        into = self.last if now else self.next
        self._drop(ids, into)
        into[ids] = kv
        self._held += kv_bytes(kv)
        while self.limit is not None and self._held > self.limit and (victim := self._victim()):
            self._drop(*victim)
            self.evicted += 1

    def done_with(self, prefixes: list[tuple[int, ...]]) -> None:
        """The rows extending `prefixes` are in their chunk's cache: a sequence no row left to run extends
        is let go now, not at the end of the call."""
        for ids in prefixes:
            if not ids or ids not in self._rows_left:
                continue
            self._rows_left[ids] -= 1
            if self._rows_left[ids] <= 0:
                del self._rows_left[ids]
                self._drop(ids, self.last)

    def end(self) -> None:
        """Carry the sequences this call did not extend for a few more calls: an episode whose env step
        outlasted the call (a rollout without a turn barrier) still finds its cache next turn."""
        ages = {}
        for ids in list(self.last):
            kv = self.last.pop(ids)
            age = self.ages.get(ids, 0) + 1
            if ids not in self.extended and ids not in self.next and age <= KEEP_CALLS:
                self.next[ids], ages[ids] = kv, age
            else:
                self._held -= kv_bytes(kv)
        self.ages = ages

    def _victim(self) -> tuple[tuple[int, ...], dict] | None:
        """What the budget lets go first: a sequence of `last` no row of this call extends, the longest
        waiting first, then this call's own in the order they were written."""
        idle = [ids for ids in self.last if ids not in self._rows_left]
        if idle:
            return max(idle, key=lambda ids: self.ages.get(ids, 0)), self.last
        return (next(iter(self.next)), self.next) if self.next else None

    def _drop(self, ids: tuple[int, ...], where: dict) -> None:
        if (kv := where.pop(ids, None)) is not None:
            self._held -= kv_bytes(kv)
