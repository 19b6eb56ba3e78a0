"""The hf engine's prefix cache within its byte budget (grl/engines/prefix_store.py): a bounded engine
replies as the unbounded one does, token for token, while its store stays under the budget; the sequences a
call extends are let go as soon as their rows are in the model's cache; a chunk's working cache fits its
share."""

import torch

from grl.engines.base import EngineOptions, SamplingParams
from grl.engines.hf import HFEngine
from grl.engines.prefix_store import GIB, STORE_SHARE, PrefixStore, kv_bytes, rows_within

TURNS = 4
REPLY = 6
GREEDY = SamplingParams(greedy=True, max_new_tokens=REPLY)


def engine(tiny_path, kv_cache_gb=None, **kw) -> HFEngine:
    return HFEngine(tiny_path, EngineOptions(dtype="float32", device="cpu", kv_cache_gb=kv_cache_gb), **kw)


def play(hf: HFEngine, prompts, delta, turns=TURNS):
    """`turns` turns of multi-turn episodes: each next prompt extends the last prompt and its reply.
    -> every turn's replies, and the store's bytes after each of its writes."""
    held, put = [], hf.prefixes.put

    def recording_put(*args, **kw):
        put(*args, **kw)
        held.append(hf.prefixes.held_bytes)

    hf.prefixes.put = recording_put
    replies, current = [], [list(p) for p in prompts]
    for _ in range(turns):
        outs = hf.generate(current, GREEDY)
        replies.append(outs)
        current = [p + o.token_ids + delta for p, o in zip(current, outs)]
    hf.prefixes.put = put
    return replies, held


def test_a_bounded_engine_replies_as_the_unbounded_one_within_its_budget(tiny_path, tokenizer, prompts):
    delta = tokenizer("\nNext turn, please.", add_special_tokens=False)["input_ids"]
    rows = prompts[:8]
    free = engine(tiny_path)
    expected, _ = play(free, rows, delta)
    final = sum(len(p) for p in rows) + len(rows) * TURNS * (REPLY + len(delta))
    # a store for about half the rows' last turn
    budget = final // 2 * free.token_bytes / STORE_SHARE
    bounded = engine(tiny_path, kv_cache_gb=budget / GIB)
    got, held = play(bounded, rows, delta)
    assert bounded.prefixes.evicted > 0  # the budget did bind
    assert max(held) <= budget * STORE_SHARE
    for turn_got, turn_expected in zip(got, expected):
        assert [o.token_ids for o in turn_got] == [o.token_ids for o in turn_expected]
        for a, b in zip(turn_got, turn_expected):
            assert max((abs(x - y) for x, y in zip(a.log_probs, b.log_probs)), default=0.0) < 1e-5


def test_a_call_lets_each_sequence_go_once_its_rows_are_in_the_models_cache(tiny_path, tokenizer, prompts):
    """Unbounded too: six rows in chunks of two. Before, a call held the last call's sequences and its own
    to its end; now it never holds more than its own, written whole, come to."""
    delta = tokenizer(" Go on.", add_special_tokens=False)["input_ids"]
    hf = engine(tiny_path, max_batch_size=2)
    hf.generate(prompts[:6], GREEDY)
    first = hf.prefixes.held_bytes
    _, held = play(hf, [list(ids) + delta for ids in hf.prefixes.next], delta, turns=1)
    own = sum(kv_bytes(kv) for kv in hf.prefixes.next.values())
    assert hf.prefixes.held_bytes == own
    assert max(held) <= own < first + own


def test_a_chunks_working_cache_fits_its_share_of_the_budget(tiny_path, prompts, monkeypatch):
    rows = prompts[:6]
    whole = engine(tiny_path)
    longest = max(len(p) for p in rows) + REPLY
    working = 2 * longest * whole.token_bytes  # two of the longest rows
    hf = engine(tiny_path, kv_cache_gb=working / (1 - STORE_SHARE) / GIB)
    forward, batches = hf.model.forward, []
    monkeypatch.setattr(
        hf.model, "forward", lambda *a, **k: batches.append(len(k["input_ids"])) or forward(*a, **k)
    )
    bounded = hf.generate(rows, GREEDY)
    monkeypatch.undo()
    assert batches and max(batches) == 2
    assert [o.token_ids for o in bounded] == [o.token_ids for o in whole.generate(rows, GREEDY)]


def kv(n: int) -> list:
    return [(torch.zeros(1, n, 2), torch.zeros(1, n, 2))]


def test_the_budget_lets_go_first_what_no_row_extends_then_this_calls_oldest():
    per_token = kv_bytes(kv(1))
    store = PrefixStore(int(10 * per_token / STORE_SHARE))  # ten tokens
    store.begin([])
    store.put((1, 2), kv(2))
    store.put((7, 8), kv(2))
    store.end()
    store.begin([[1, 2, 3]])  # extends (1, 2); nothing extends (7, 8)
    store.put((1, 2, 3, 4), kv(4))
    assert set(store.last) == {(1, 2), (7, 8)} and store.evicted == 0
    store.put((5, 6, 7), kv(3))  # 11 tokens: the sequence no row extends goes
    assert set(store.last) == {(1, 2)} and store.evicted == 1
    store.done_with([(1, 2)])  # its row is in the model's cache
    assert store.last == {} and store.held_bytes == 7 * per_token
    store.put((9, 9, 9, 9), kv(4))  # 11 tokens again: this call's first-written goes
    assert list(store.next) == [(5, 6, 7), (9, 9, 9, 9)] and store.evicted == 2


def test_rows_within_the_store():
    assert rows_within(None, 100, 10) is None
    assert rows_within(1.0, 1000, 1000) == int(GIB * STORE_SHARE) // 10**6
    assert rows_within(1e-9, 1000, 1000) == 1  # one row always runs


def test_sleep_lets_the_cache_go_on_cpu(hf_tiny, prompts):
    hf_tiny.generate(prompts[:2], GREEDY)
    assert hf_tiny.prefixes.held_bytes > 0
    hf_tiny.sleep()
    assert hf_tiny.prefixes.held_bytes == 0 and not hf_tiny.prefixes.next
    hf_tiny.wake()
