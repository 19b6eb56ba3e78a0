"""Valid-action decoding: the grammar, the masked softmax, and the hf engine under a grammar,
checked against enumeration, Python loops and teacher forcing."""

import random

import pytest
import torch

from grl.agents.parse import parse_reply
from grl.engines import SamplingParams
from grl.engines.constraint import (
    GrammarError,
    allowed_sets_tensors,
    compile_reply_grammar,
    constrain_logits,
    constrain_logits_flat,
)
from prompts import teacher_forced_log_probs

SOKOBAN = ["Up", "Down", "Left", "Right"]
BLOCKS = ["move 1 to 0", "move 1 to 3", "move 2 to 0", "move 2 to 1", "move 12 to 0"]


def make_grammar(tokenizer, actions, think=False, max_tokens=24):
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    end = [tokenizer.eos_token_id] + sorted(set(tokenizer.all_special_ids) - {tokenizer.eos_token_id})
    return compile_reply_grammar(encode, end, actions, think, max_tokens)


def trie_paths(grammar, node=0, prefix=()):
    """Every token path from `node` to the end (trie nodes only)."""
    children = grammar.nodes[node]
    if not children:
        yield prefix
    for token, child in children.items():
        yield from trie_paths(grammar, child, prefix + (token,))


def random_walk(grammar, vocab, rng):
    """Tokens drawn uniformly from each allowed set (free text: any token not denied)."""
    walker, ids = grammar.walker(), []
    while not walker.done:
        size, members = walker.allowed()
        if size > 0:
            token = rng.choice(members)
        else:
            token = rng.randrange(vocab)
            while token in members:
                token = rng.randrange(vocab)
        ids.append(token)
        walker.advance(token)
        assert len(ids) <= grammar.max_tokens
    return ids


@pytest.mark.parametrize("actions", [SOKOBAN, BLOCKS, ["click[buy now]", "click[< prev]", "click[b07x]"]])
def test_every_path_spells_exactly_the_valid_answers(tokenizer, actions):
    grammar = make_grammar(tokenizer, actions)
    spelled = [tokenizer.decode(path) for path in trie_paths(grammar)]
    assert sorted(spelled) == sorted(f"<answer>{a}</answer>{tokenizer.eos_token}" for a in actions)
    for path in trie_paths(grammar):
        assert [size for size, _ in grammar.trace(list(path))][-1] >= 1  # every token was allowed


@pytest.mark.parametrize("actions", [SOKOBAN, ["search[{text}]", "click[back to search]"]])
def test_free_text_always_closes_within_the_budget(tokenizer, actions):
    rng = random.Random(0)
    grammar = make_grammar(tokenizer, actions, think=True, max_tokens=40)
    for _ in range(30):
        ids = random_walk(grammar, len(tokenizer), rng)
        assert ids[-1] == tokenizer.eos_token_id and len(ids) <= 40
        parsed = parse_reply(tokenizer.decode(ids, skip_special_tokens=True), enable_think=True)
        assert parsed.format_ok, tokenizer.decode(ids)
        if actions is SOKOBAN:
            assert parsed.answer in SOKOBAN
        else:
            assert parsed.answer == "click[back to search]" or parsed.answer.startswith("search[")
        assert len(grammar.trace(ids)) == len(ids)
    with pytest.raises(ValueError, match="outside the grammar"):
        grammar.trace([tokenizer.eos_token_id])


@pytest.mark.parametrize("actions", [SOKOBAN, ["search[{text}]", "click[back to search]"]])
def test_the_walk_depends_on_the_tokens_alone(tokenizer, actions):
    """An engine that resumes a request catches up on several tokens at once: a walker advanced
    without being asked for its allowed sets must end where the one asked before each token ends."""
    rng = random.Random(1)
    grammar = make_grammar(tokenizer, actions, think=True, max_tokens=30)
    for _ in range(20):
        ids = random_walk(grammar, len(tokenizer), rng)
        stepwise = grammar.trace(ids)
        for cut in range(len(ids)):
            silent = grammar.walker()
            for token in ids[:cut]:
                silent.advance(token)
            assert silent.allowed() == stepwise[cut], (cut, ids)


def test_actions_that_do_not_fit_are_left_out(tokenizer):
    grammar = make_grammar(tokenizer, ["Up", "a very long action " * 8], max_tokens=10)
    assert [tokenizer.decode(p) for p in trie_paths(grammar)] == [f"<answer>Up</answer>{tokenizer.eos_token}"]
    assert grammar.left_out == ("a very long action " * 8,)
    with pytest.raises(GrammarError, match="fits"):
        make_grammar(tokenizer, ["a very long action " * 8], max_tokens=10)


def test_constrain_logits_matches_a_python_loop():
    rng = torch.Generator().manual_seed(0)
    vocab = 50
    logits = torch.randn(6, vocab, generator=rng)
    sets = [(3, (4, 9, 17)), (-2, (0, 49)), (0, ()), (1, (7,)), (-1, (3,)), (2, (48, 1))]
    sizes, ids = allowed_sets_tensors(sets)
    got = constrain_logits(logits.clone(), sizes, ids).softmax(-1)
    for row, (size, members) in enumerate(sets):
        keep = [t for t in range(vocab) if (size > 0 and t in members) or (size <= 0 and t not in members)]
        want = torch.zeros(vocab)
        want[keep] = logits[row, keep].softmax(-1)
        assert torch.allclose(got[row], want, atol=1e-6)
        assert abs(float(got[row].sum()) - 1.0) < 1e-6


def test_flat_sets_mask_exactly_as_padded_ones():
    rng = torch.Generator().manual_seed(1)
    vocab = 64
    logits = torch.randn(7, vocab, generator=rng)
    sets = [
        (3, (4, 9, 17)),
        (-2, (0, 63)),
        (0, ()),
        (vocab, tuple(range(vocab))),
        (-1, (3,)),
        (0, ()),
        (2, (63, 1)),
    ]
    flat = torch.tensor([i for _, members in sets for i in members], dtype=torch.int32)
    sizes, padded = allowed_sets_tensors(sets)
    assert torch.equal(constrain_logits_flat(logits, sizes, flat), constrain_logits(logits, sizes, padded))
    assert constrain_logits_flat(logits, sizes, flat).isinf().sum() == 61 + 2 + 0 + 0 + 1 + 0 + 62


def test_allowed_sets_tensors_lays_each_set_out_in_its_row():
    """Each row holds its set's ids first, then zeros; the sizes keep their signs. An empty list
    and a list of unconstrained sets still give one id column."""
    rng = random.Random(0)
    drawn = [(rng.choice([1, -1]), tuple(rng.sample(range(1, 1000), rng.randint(1, 9)))) for _ in range(40)]
    sets = [(0, ())] + [(sign * len(ids), ids) for sign, ids in drawn]
    rng.shuffle(sets)
    sizes, ids = allowed_sets_tensors(sets)
    assert sizes.dtype == ids.dtype == torch.long and ids.shape == (len(sets), max(len(m) for _, m in sets))
    for row, (size, members) in enumerate(sets):
        assert int(sizes[row]) == size
        assert ids[row].tolist() == list(members) + [0] * (ids.shape[1] - len(members))
    for empty in ([], [(0, ()), (0, ())]):
        sizes, ids = allowed_sets_tensors(empty)
        assert sizes.shape == (len(empty),) and ids.shape == (len(empty), 1) and not ids.any()


def grammars_for(tokenizer, n):
    """A mix of grammars: Sokoban moves, BlocksWorld moves, and moves after free think text."""
    kinds = [
        make_grammar(tokenizer, SOKOBAN),
        make_grammar(tokenizer, BLOCKS),
        make_grammar(tokenizer, SOKOBAN, think=True, max_tokens=20),
    ]
    return [kinds[i % len(kinds)] for i in range(n)]


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.7, max_new_tokens=24, seed=5),
        SamplingParams(temperature=1.0, max_new_tokens=24, seed=6),
        SamplingParams(greedy=True, max_new_tokens=24),
    ],
)
@pytest.mark.slow
def test_hf_samples_inside_the_grammar_with_the_masked_log_probs(hf_tiny, tokenizer, prompts, sampling):
    batch = prompts[:6]
    grammars = grammars_for(tokenizer, len(batch))
    outputs = hf_tiny.generate(batch, sampling, grammars)
    for prompt, out, grammar in zip(batch, outputs, grammars):
        allowed = grammar.trace(out.token_ids)  # raises if a token was outside its allowed set
        assert out.token_ids[-1] == tokenizer.eos_token_id and out.finish_reason == "stop"
        want = teacher_forced_log_probs(hf_tiny.model, prompt, out.token_ids, sampling, allowed)
        assert torch.allclose(torch.tensor(out.log_probs), want, atol=1e-4)
        forced = [i for i, (size, _) in enumerate(allowed) if size == 1]
        assert all(out.log_probs[i] == 0.0 for i in forced)


def test_hf_greedy_under_a_grammar_is_the_argmax_over_the_allowed_moves(hf_tiny, tokenizer, prompts):
    grammar = make_grammar(tokenizer, SOKOBAN)
    out = hf_tiny.generate(prompts[:4], SamplingParams(greedy=True, max_new_tokens=24), [grammar] * 4)
    choice = [ids for ids in grammar.nodes if len(ids) > 1][0]  # the trie node where the moves branch
    for prompt, o in zip(prompts[:4], out):
        at = next(i for i, (size, _) in enumerate(grammar.trace(o.token_ids)) if size > 1)
        with torch.no_grad():
            logits = hf_tiny.model(torch.tensor([prompt + o.token_ids[:at]])).logits[0, -1]
        assert o.token_ids[at] == max(choice, key=lambda t: float(logits[t]))


def test_prefix_reuse_gives_what_a_fresh_prefill_gives(hf_tiny, tokenizer, prompts):
    """Turn 2 prompts extend turn 1's prompt and reply; reusing turn 1's KV cache must not change
    the greedy reply or its log-probs."""
    sampling = SamplingParams(greedy=True, max_new_tokens=10)
    first = hf_tiny.generate(prompts[:5], sampling)
    delta = tokenizer("\nNext turn, please.", add_special_tokens=False)["input_ids"]
    second_prompts = [p + o.token_ids + delta for p, o in zip(prompts[:5], first)]
    assert hf_tiny.prefixes.next  # the first call kept its sequences
    reused = hf_tiny.generate(second_prompts, sampling)
    hf_tiny.prefixes.clear()
    fresh = hf_tiny.generate(second_prompts, sampling)
    assert [o.token_ids for o in reused] == [o.token_ids for o in fresh]
    for a, b in zip(reused, fresh):
        assert max(abs(x - y) for x, y in zip(a.log_probs, b.log_probs)) < 1e-5


def test_a_row_without_a_cached_prefix_does_not_widen_the_others(hf_tiny, tokenizer, prompts, monkeypatch):
    """Turn 2 of five episodes, one of whose prompts was cut from the left (no cached prefix): the other
    four run only their new tokens, the cut one runs whole in a chunk of its own, and the replies are
    those of a fresh prefill."""
    sampling = SamplingParams(greedy=True, max_new_tokens=6)
    first = hf_tiny.generate(prompts[:5], sampling)
    delta = tokenizer("\nNext turn, please.", add_special_tokens=False)["input_ids"]
    second = [p + o.token_ids + delta for p, o in zip(prompts[:5], first)]
    second[0] = second[0][3:]  # left-truncated: extends nothing the engine kept
    forward, seen = hf_tiny.model.forward, []
    monkeypatch.setattr(
        hf_tiny.model, "forward", lambda *a, **k: seen.append(k["input_ids"].shape) or forward(*a, **k)
    )
    reused = hf_tiny.generate(second, sampling)
    (cut_rows, cut_width), (kept_rows, kept_width) = sorted(
        ((rows, width) for rows, width in seen if width > 1)
    )
    assert (cut_rows, cut_width) == (1, len(second[0]))
    assert (
        kept_rows == 4 and kept_width <= len(delta) + sampling.max_new_tokens
    )  # the delta and the reply's unrun tail
    monkeypatch.undo()
    hf_tiny.prefixes.clear()
    fresh = hf_tiny.generate(second, sampling)
    assert [o.token_ids for o in reused] == [o.token_ids for o in fresh]


def test_a_prompt_that_rows_share_is_run_once(tiny_path, prompts, monkeypatch):
    """A GRPO group: G rows of one prompt. The engine runs the prompt once and each row's last
    token on top of it; the replies and log-probs are those of an engine that runs every row whole."""
    from grl.engines import EngineOptions
    from grl.engines.hf import HFEngine

    group = [prompts[1]] * 3 + [prompts[2]] * 2 + [prompts[0]]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
    results, prefilled = [], []
    for reuse in (True, False):
        engine = HFEngine(tiny_path, EngineOptions(dtype="float32", device="cpu"), reuse_prefixes=reuse)
        forward = engine.model.forward
        seen = []
        monkeypatch.setattr(
            engine.model, "forward", lambda *a, **k: seen.append(k["input_ids"].shape) or forward(*a, **k)
        )
        results.append(engine.generate(group, sampling))
        prefilled.append(sum(rows * width for rows, width in seen if width > 1))
    shared, whole = results
    assert [o.token_ids for o in shared] == [o.token_ids for o in whole]
    for a, b in zip(shared, whole):
        assert max(abs(x - y) for x, y in zip(a.log_probs, b.log_probs)) < 1e-5
    # once: prompts 1 and 2 but their last tokens; then every row as wide as prompt 0, run whole (alone)
    assert prefilled[0] == 2 * (max(len(prompts[1]), len(prompts[2])) - 1) + len(group) * len(prompts[0])
    assert prefilled[1] == len(group) * max(len(p) for p in group)


@pytest.mark.parametrize("reuse_first", [False, True])
def test_hf_a_grammar_with_one_answer_is_written_without_a_model_call(
    hf_tiny, tokenizer, prompts, reuse_first
):
    """One valid action forces the whole reply: every row finishes in the jump-forward, the model never
    runs (nothing to keep for prefix reuse), and the next call still works."""
    if reuse_first:  # leave reusable prefixes from a call before
        hf_tiny.generate(prompts[:3], SamplingParams(greedy=True, max_new_tokens=4))
    only = make_grammar(tokenizer, ["Down"])
    outputs = hf_tiny.generate(
        prompts[:3], SamplingParams(temperature=1.0, max_new_tokens=24, seed=1), [only] * 3
    )
    for out in outputs:
        assert parse_reply(tokenizer.decode(out.token_ids, skip_special_tokens=True), False).answer == "Down"
        assert out.finish_reason == "stop" and out.log_probs == [0.0] * len(out.token_ids)
    after = hf_tiny.generate(prompts[:3], SamplingParams(greedy=True, max_new_tokens=4))
    assert all(len(o.token_ids) == 4 or o.finish_reason == "stop" for o in after)
