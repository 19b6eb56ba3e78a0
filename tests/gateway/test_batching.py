"""Continuous batching of concurrent calls (grl/gateway/batching.py), on the tiny model's real engine: a call
that arrives during a generate is in the next engine call, beside the calls of its kind that waited, whether
the rollout's thread serves them (`BatchingEngine`) or a waiting caller does (`SerialEngine`, `grl serve`);
each call gets the replies to its own prompts. Engine calls are counted, never timed."""

import threading
import time
from dataclasses import replace

import pytest

from grl.engines.base import SamplingParams
from grl.gateway import BadRequest
from grl.gateway.batching import BatchingEngine, SerialEngine


class HookedEngine:
    """The real engine, recording each generate's prompts and running `during` inside the first one."""

    def __init__(self, engine, during=None):
        self.engine, self.during, self.batches = engine, during, []

    def generate(self, prompts, sampling, constraints=None):
        self.batches.append([list(p) for p in prompts])
        if self.during is not None:
            during, self.during = self.during, None
            during()
        return self.engine.generate(prompts, sampling, constraints)


def greedy(max_new: int) -> SamplingParams:
    return SamplingParams(greedy=True, max_new_tokens=max_new)


def queue_call(
    batching: BatchingEngine, prompt: list[int], sampling: SamplingParams, answers: dict
) -> threading.Thread:
    """A handler's thread calling `batching.generate`; returns once the call is queued."""
    queued = batching._queue.qsize() + 1

    def call():
        try:
            answers[tuple(prompt)] = batching.generate([prompt], sampling)
        except BadRequest as err:
            answers[tuple(prompt)] = str(err)

    thread = threading.Thread(target=call)
    thread.start()
    while batching._queue.qsize() < queued and thread.is_alive():
        time.sleep(0.001)
    return thread


PROMPTS = {"a": [1, 5, 9, 14], "b": [2, 7, 3], "c": [4, 4, 8, 10, 11], "d": [3, 9, 9, 2]}


def test_a_call_arriving_during_a_generate_joins_the_waiting_calls_of_its_kind(tiny):
    """A (2 tokens) and B (3 tokens) wait; A's kind goes first, and C (3 tokens) arrives during A's generate:
    the next engine call serves B and C together, where waves served A, then B, then C in a wave of its
    own."""
    engine = tiny[1]
    answers, threads = {}, []
    hooked = HookedEngine(
        engine, during=lambda: threads.append(queue_call(batching, PROMPTS["c"], greedy(3), answers))
    )
    batching = BatchingEngine(hooked)
    batching.serving(True)
    try:
        threads.append(queue_call(batching, PROMPTS["a"], greedy(2), answers))
        threads.append(queue_call(batching, PROMPTS["b"], greedy(3), answers))
        served = 0
        while served < 3:
            served += batching.serve(wait=0.1)
    finally:
        batching.serving(False)
    for thread in threads:
        thread.join(timeout=30)
    assert hooked.batches == [[PROMPTS["a"]], [PROMPTS["b"], PROMPTS["c"]]]
    for name, max_new in (("a", 2), ("b", 3), ("c", 3)):  # each call's reply is its own prompt's, as if alone
        alone = engine.generate([PROMPTS[name]], greedy(max_new))
        assert [out.token_ids for out in answers[tuple(PROMPTS[name])]] == [out.token_ids for out in alone]


def test_a_call_left_waiting_when_the_rollout_ends_is_refused(tiny):
    hooked = HookedEngine(tiny[1])
    batching = BatchingEngine(hooked)
    batching.serving(True)
    answers = {}
    threads = [
        queue_call(batching, PROMPTS["a"], greedy(2), answers),
        queue_call(batching, PROMPTS["b"], greedy(3), answers),
    ]
    assert batching.serve(wait=0.1) == 1
    batching.serving(False)
    for thread in threads:
        thread.join(timeout=30)
    assert len(answers[tuple(PROMPTS["a"])]) == 1
    assert answers[tuple(PROMPTS["b"])] == "the rollout ended before this call was served"
    with pytest.raises(ValueError, match="gather_s"):
        BatchingEngine(hooked, gather_s=-1)


def test_callers_of_a_serial_engine_share_the_next_generate(tiny):
    """During A's generate, B (seeded), C (unseeded) and D (seeded) call: B and D share the next generate and
    C
    has one of its own (an engine call seeds all its requests or none), where a lock served one call a
    generate."""
    engine = tiny[1]
    sampled = SamplingParams(temperature=1.0, max_new_tokens=4)
    later = {"b": replace(sampled, seed=7), "c": sampled, "d": replace(sampled, seed=8)}
    answers, threads = {}, []

    def call(name: str, sampling: SamplingParams) -> None:
        answers[name] = serial.generate([PROMPTS[name]], sampling)

    def during_a() -> None:
        for count, (name, sampling) in enumerate(later.items(), 1):
            threads.append(threading.Thread(target=call, args=(name, sampling)))
            threads[-1].start()
            while len(serial._waiting) < count:
                time.sleep(0.001)

    hooked = HookedEngine(engine, during=during_a)
    serial = SerialEngine(hooked)
    call("a", greedy(2))
    for thread in threads:
        thread.join(timeout=30)
    assert hooked.batches == [[PROMPTS["a"]], [PROMPTS["b"], PROMPTS["d"]], [PROMPTS["c"]]]
    for name in ("b", "d"):  # a seeded call samples what it would alone
        alone = engine.generate([PROMPTS[name]], later[name])
        assert [out.token_ids for out in answers[name]] == [out.token_ids for out in alone]
    assert len(answers["c"]) == 1 and len(answers["c"][0].token_ids) <= 4
