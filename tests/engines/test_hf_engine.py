"""The hf engine against slow references: a teacher-forced forward pass,
one-prompt-at-a-time generation, a Python top-k/top-p filter, a fresh engine."""

import math

import pytest
import torch

from grl.engines import SamplingParams, make_engine
from grl.engines.kept_sets import filter_logits, kept_sets
from grl.engines.weights import WeightMismatchError
from prompts import assert_drawn_from_what_the_filter_kept, kept_members, teacher_forced_log_probs


def reference_filter(logits, temperature, top_k, top_p):
    """Keep-sets by sorting a Python list, one row at a time."""
    rows = []
    for row in logits.tolist():
        scaled = [x / temperature for x in row]
        ranked = sorted(range(len(row)), key=lambda i: -scaled[i])
        keep = set(ranked[:top_k] if 0 < top_k < len(row) else ranked)
        if top_p < 1.0:
            z = sum(math.exp(scaled[i]) for i in keep)
            mass, kept = 0.0, set()
            for i in ranked:
                if i in keep and mass < top_p:
                    kept.add(i)
                    mass += math.exp(scaled[i]) / z
            keep = kept
        rows.append([scaled[i] if i in keep else -math.inf for i in range(len(row))])
    return torch.tensor(rows)


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [
        (1.0, -1, 1.0),
        (0.7, 3, 1.0),
        (1.0, -1, 0.6),
        (1.3, 5, 0.8),
        (0.5, 1, 0.99),
        (1.0, 0, 0.3),
    ],
)
def test_filter_logits_matches_reference(temperature, top_k, top_p):
    logits = torch.randn(4, 12, generator=torch.Generator().manual_seed(7), dtype=torch.float64) * 2
    got = filter_logits(logits, temperature, top_k, top_p)
    want = reference_filter(logits, temperature, top_k, top_p).to(torch.float64)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.allclose(got[~torch.isinf(got)], want[~torch.isinf(want)])


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(greedy=True, max_new_tokens=12),
        SamplingParams(temperature=0.7, top_k=50, top_p=0.9, max_new_tokens=12, seed=3),
    ],
)
def test_log_probs_equal_teacher_forcing(hf_tiny, prompts, sampling):
    batch = prompts[:5]  # different lengths: exercises left padding
    outputs = hf_tiny.generate(batch, sampling)
    for prompt, out in zip(batch, outputs):
        assert len(out.log_probs) == len(out.token_ids) == 12
        want = teacher_forced_log_probs(hf_tiny.model, prompt, out.token_ids, sampling)
        assert torch.allclose(torch.tensor(out.log_probs), want, atol=1e-4)


def test_kept_sets_list_the_kept_ids_or_deny_the_others_whichever_is_shorter():
    logits = torch.randn(6, 10, generator=torch.Generator().manual_seed(3))
    kept_counts = [1, 4, 5, 6, 9, 10]
    filtered = torch.stack(
        [row.masked_fill(row < row.topk(k).values[-1], float("-inf")) for row, k in zip(logits, kept_counts)]
    )
    got = kept_sets(filtered)
    assert [size for size, _ in got] == [1, 4, 5, -4, -1, 0]
    assert [kept_members(s, 10) for s in got] == [
        set(torch.isfinite(row).nonzero()[:, 0].tolist()) for row in filtered
    ]


@pytest.mark.parametrize("constrained", [False, True], ids=["free", "constrained"])
def test_each_token_comes_with_the_set_top_k_top_p_kept(hf_tiny, tokenizer, prompts, constrained):
    """Under a grammar the kept set is what the filter keeps of the grammar's allowed set (a forced token's
    is itself); without a filter, or greedy, there is none."""
    from test_constraint import grammars_for

    sampling = SamplingParams(temperature=0.8, top_k=5, top_p=0.7, max_new_tokens=16, seed=9)
    grammars = grammars_for(tokenizer, 6) if constrained else None
    outputs = hf_tiny.generate(prompts[:6], sampling, grammars)
    for i, (prompt, out) in enumerate(zip(prompts[:6], outputs)):
        allowed = grammars[i].trace(out.token_ids) if constrained else None
        assert_drawn_from_what_the_filter_kept(hf_tiny.model, prompt, out, sampling, allowed)
    plain = SamplingParams(temperature=0.8, max_new_tokens=4, seed=9)
    assert all(o.kept_sets is None for o in hf_tiny.generate(prompts[:2], plain, grammars and grammars[:2]))


def test_batched_greedy_equals_one_at_a_time(hf_tiny, prompts):
    sampling = SamplingParams(greedy=True, max_new_tokens=10, logprobs=False)
    batched = hf_tiny.generate(prompts[:6], sampling)
    alone = [hf_tiny.generate([p], sampling)[0] for p in prompts[:6]]
    assert [o.token_ids for o in batched] == [o.token_ids for o in alone]
    assert all(o.log_probs is None and o.finish_reason == "length" for o in batched)


def test_seed_i_goes_to_request_i(hf_tiny, prompts):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=11)
    pair = hf_tiny.generate([prompts[0], prompts[0]], sampling)
    again = hf_tiny.generate([prompts[0], prompts[0]], sampling)
    second_alone = hf_tiny.generate([prompts[0]], SamplingParams(temperature=1.0, max_new_tokens=8, seed=12))
    assert [o.token_ids for o in pair] == [o.token_ids for o in again]
    assert pair[0].token_ids != pair[1].token_ids  # one prompt, two attempts: a group must not collapse
    assert pair[1].token_ids == second_alone[0].token_ids


def test_request_seeds_give_each_request_its_own_seed_whatever_its_place(hf_tiny, prompts):
    def alone(prompt, seed):
        return hf_tiny.generate([prompt], SamplingParams(temperature=1.0, max_new_tokens=8, seed=seed))[
            0
        ].token_ids

    mixed = hf_tiny.generate(
        [prompts[1], prompts[0]], SamplingParams(temperature=1.0, max_new_tokens=8, request_seeds=[40, 7])
    )
    assert [o.token_ids for o in mixed] == [alone(prompts[1], 40), alone(prompts[0], 7)]


def test_stop_token_ends_the_response_and_is_kept(hf_tiny, prompts):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=5, logprobs=False)
    full = hf_tiny.generate([prompts[1]], sampling)[0].token_ids
    stop = full[6]
    cut = hf_tiny.generate([prompts[1]], SamplingParams(**{**vars(sampling), "stop_token_ids": [stop]}))[0]
    assert cut.token_ids == full[: full.index(stop) + 1]
    assert cut.finish_reason == "stop"


def test_stop_string_cuts_right_after_the_completing_token(hf_tiny, tokenizer, prompts):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, seed=9, logprobs=False)
    full = hf_tiny.generate([prompts[2]], sampling)[0].token_ids
    text = tokenizer.decode(full, skip_special_tokens=True)
    middle = len(text) // 2
    stop = text[middle - 3 : middle + 2]  # may straddle tokens
    shortest = next(
        n for n in range(1, len(full) + 1) if stop in tokenizer.decode(full[:n], skip_special_tokens=True)
    )
    cut = hf_tiny.generate([prompts[2]], SamplingParams(**{**vars(sampling), "stop": ["@@never@@", stop]}))[0]
    assert cut.token_ids == full[:shortest]
    assert cut.finish_reason == "stop"


def test_lengths_and_bad_prompts(hf_tiny, prompts):
    zero = hf_tiny.generate(prompts[:2], SamplingParams(max_new_tokens=0))
    assert [(o.token_ids, o.log_probs, o.finish_reason) for o in zero] == [([], [], "length")] * 2
    assert hf_tiny.generate([], SamplingParams()) == []
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        hf_tiny.generate([prompts[0], []], SamplingParams(max_new_tokens=2))


@pytest.mark.slow
def test_eos_is_kept_and_ignore_eos_runs_on(hf_embedded, prompts):
    greedy = SamplingParams(greedy=True, max_new_tokens=40)
    outs = hf_embedded.generate(prompts[:4], greedy)
    stopped = [o for o in outs if o.finish_reason == "stop"]
    assert stopped, "the instruct model should finish some short answers within 40 tokens"
    assert all(o.token_ids[-1] in hf_embedded.eos_token_ids for o in stopped)
    assert all(t not in hf_embedded.eos_token_ids for o in stopped for t in o.token_ids[:-1])
    first = stopped[0]
    prompt = prompts[outs.index(first)]
    longer = hf_embedded.generate(
        [prompt], SamplingParams(greedy=True, max_new_tokens=len(first.token_ids) + 3, ignore_eos=True)
    )[0]
    assert longer.finish_reason == "length" and len(longer.token_ids) == len(first.token_ids) + 3
    assert longer.token_ids[: len(first.token_ids)] == first.token_ids


def test_update_weights_matches_a_fresh_engine(tiny_path, prompts, tmp_path, perturbed_copy):
    engine = make_engine("hf", tiny_path)
    greedy = SamplingParams(greedy=True, max_new_tokens=10)
    before = engine.generate(prompts[:8], greedy)
    new_state = perturbed_copy(engine.model, tmp_path)
    engine.update_weights(new_state)
    after = engine.generate(prompts[:8], greedy)
    fresh = make_engine("hf", str(tmp_path)).generate(prompts[:8], greedy)
    assert [o.token_ids for o in after] == [o.token_ids for o in fresh]
    assert [o.token_ids for o in after] != [o.token_ids for o in before]
    assert torch.allclose(
        torch.tensor([o.log_probs for o in after]), torch.tensor([o.log_probs for o in fresh])
    )


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"model.norm.weight": torch.ones(7)}, r"shape \(7\), expected \(64\)"),
        ({"model.layers.0.mlp.gate.weight": torch.ones(64)}, "unknown tensor name"),
    ],
)
def test_failed_update_keeps_the_old_weights(hf_tiny, prompts, bad, message):
    greedy = SamplingParams(greedy=True, max_new_tokens=8)
    before = hf_tiny.generate(prompts[:3], greedy)
    state = {name: torch.zeros_like(t) for name, t in hf_tiny.model.state_dict().items()}
    state.update(bad)  # every other tensor would change the output if it were loaded
    with pytest.raises(WeightMismatchError, match=message):
        hf_tiny.update_weights(state)
    after = hf_tiny.generate(prompts[:3], greedy)
    assert [(o.token_ids, o.log_probs) for o in after] == [(o.token_ids, o.log_probs) for o in before]
