"""Agents past what the engine's KV budget holds wait for others to finish (grl/rollout/multi_turn.py,
`_rows_at_once`), and play the episodes they would have played all at once."""

from grl.engines.base import Engine, EngineOptions
from grl.engines.hf import HFEngine
from grl.engines.prefix_store import GIB, STORE_SHARE
from tests.rollout.test_multi_turn import CONSTRAINED_TOKENS, GREEDY, rollout, scripted

MAX_PROMPT = 1024


class CallSizes(Engine):
    """The real engine, with the size of every generate call."""

    def __init__(self, inner: HFEngine):
        self.inner, self.sizes = inner, []

    def rows_within(self, row_tokens: int) -> int | None:
        return self.inner.rows_within(row_tokens)

    def generate(self, prompt_token_ids, sampling, constraints=None):
        self.sizes.append(len(prompt_token_ids))
        return self.inner.generate(prompt_token_ids, sampling, constraints)


def played(engine: Engine, tokenizer):
    result = rollout(engine, tokenizer, max_prompt_length=MAX_PROMPT).run(
        [scripted(groups=4, size=2, max_turns=4)], base_seed=5, sampling=GREEDY
    )
    return [
        (e.group_id, e.member, [(t.prompt_ids, t.response_ids, t.reward) for t in e.turns])
        for e in result.episodes
    ]


def test_agents_past_the_engines_cache_wait_and_play_the_same_episodes(tokenizer):
    options = EngineOptions(dtype="float32", device="cpu")
    free = CallSizes(HFEngine("tiny", options))
    row = (MAX_PROMPT + CONSTRAINED_TOKENS) * free.inner.token_bytes
    three = CallSizes(
        HFEngine("tiny", EngineOptions(**{**vars(options), "kv_cache_gb": 3.5 * row / STORE_SHARE / GIB}))
    )
    assert free.rows_within(MAX_PROMPT + CONSTRAINED_TOKENS) is None
    assert three.rows_within(MAX_PROMPT + CONSTRAINED_TOKENS) == 3
    expected = played(free, tokenizer)
    got = played(three, tokenizer)
    assert free.sizes[0] == 8 and max(three.sizes) == 3
    assert len(three.sizes) > len(free.sizes)  # the waiting agents played later
    assert got == expected
