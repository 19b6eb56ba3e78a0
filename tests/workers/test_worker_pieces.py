"""The pure pieces of the workers, in one process: chunked scoring, packed
attention, mini-batch planning, padding, warmup and the non-finite checks."""

import math

import pytest
import torch

from grl.models import load_causal_lm, load_critic
from grl.workers.fsdp import make_scheduler, non_finite_entries
from grl.workers.heads import POLICY, VALUE
from grl.workers.scoring import TokenScorer, additive_packed_mask, trim_width
from grl.workers.sharding import equal_shards, pad_rows, plan_minibatches
from grl.workers.update import loss_units


@pytest.fixture(scope="module")
def policy():
    return load_causal_lm("tiny", dtype="float32").eval()


def reference_log_probs(model, ids, mask, pos):
    """Plain forward, log_softmax, gather; shifted so t is scored from < t."""
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.double()
    logp = torch.log_softmax(logits[:, :-1], -1)
    picked = logp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    valid = (mask[:, 1:] * mask[:, :-1]).bool()
    zero = torch.zeros(ids.shape[0], 1, dtype=torch.float64)
    return (
        torch.cat([zero, torch.where(valid, picked, 0.0)], 1),
        torch.cat([zero, torch.where(valid, entropy, 0.0)], 1),
    )


def right_padded(lengths, width, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 2000, (len(lengths), width), generator=g)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


@pytest.mark.parametrize("chunk", [1, 5, 4096])
def test_chunked_log_probs_and_entropy_match_plain_forward(policy, chunk):
    ids, mask, pos = right_padded([9, 5, 12], 12)
    with torch.no_grad():
        log_probs, entropy = TokenScorer(policy, POLICY)(ids, mask, pos, chunk_size=chunk)
    want_lp, want_ent = reference_log_probs(policy, ids, mask, pos)
    assert torch.allclose(log_probs.double(), want_lp, atol=1e-5)
    assert torch.allclose(entropy.double(), want_ent, atol=1e-4)
    assert log_probs[0, 0] == 0 and log_probs[1, 5:].abs().sum() == 0


def test_chunked_gradient_equals_unchunked(policy):
    ids, mask, pos = right_padded([7, 10], 10, seed=1)
    grads = []
    for chunk in (3, 4096):
        policy.zero_grad()
        log_probs, entropy = TokenScorer(policy, POLICY)(ids, mask, pos, chunk_size=chunk)
        (log_probs.sum() + 0.1 * entropy.sum()).backward()
        grads.append(policy.model.layers[0].mlp.up_proj.weight.grad.clone())
    policy.zero_grad()
    assert torch.allclose(grads[0], grads[1], atol=1e-5)  # fp32 summation order differs


def test_packed_row_scores_each_episode_as_if_alone(policy):
    a, b = torch.randint(0, 2000, (6,)), torch.randint(0, 2000, (5,))
    packed = torch.cat([a, b, torch.zeros(2, dtype=torch.long)])[None]
    mask = torch.tensor([[1] * 11 + [0, 0]])
    pos = torch.tensor([list(range(6)) + list(range(5)) + [0, 0]])
    seg = torch.tensor([[1] * 6 + [2] * 5 + [0, 0]])  # as grl.rollout.build_batch numbers them
    with torch.no_grad():
        lp, _ = TokenScorer(policy, POLICY)(packed, mask, pos, segment_ids=seg, chunk_size=4)
    alone_a, _ = reference_log_probs(
        policy, a[None], torch.ones(1, 6, dtype=torch.long), torch.arange(6)[None]
    )
    alone_b, _ = reference_log_probs(
        policy, b[None], torch.ones(1, 5, dtype=torch.long), torch.arange(5)[None]
    )
    assert torch.allclose(lp[0, :6].double(), alone_a[0], atol=1e-5)
    assert torch.allclose(lp[0, 6:11].double(), alone_b[0], atol=1e-5)
    assert lp[0, 6] == 0 and lp[0, 11:].abs().sum() == 0  # episode start and padding are not scored


def group_rows(prompt_lengths=(7, 4), replies=((3, 5, 2), (6, 1)), seed=5):
    """Right-padded rows of GRPO groups: each group's episodes share a prompt, then reply."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for p, reply_lengths in zip(prompt_lengths, replies):
        prompt = torch.randint(0, 2000, (p,), generator=g)
        rows += [(prompt, torch.randint(0, 2000, (n,), generator=g)) for n in reply_lengths]
    width = max(len(a) + len(b) for a, b in rows)
    tensors = {
        k: torch.zeros(len(rows), width, dtype=torch.long)
        for k in ("input_ids", "attention_mask", "position_ids")
    }
    tensors["loss_mask"] = torch.zeros(len(rows), width)
    for i, (prompt, reply) in enumerate(rows):
        n = len(prompt) + len(reply)
        tensors["input_ids"][i, :n] = torch.cat([prompt, reply])
        tensors["attention_mask"][i, :n] = 1
        tensors["position_ids"][i, :n] = torch.arange(n)
        tensors["loss_mask"][i, len(prompt) : n] = 1
    return tensors


def score_rows(scorer, tensors, **extra):
    return scorer(
        tensors["input_ids"],
        tensors["attention_mask"],
        tensors["position_ids"],
        chunk_size=4,
        segment_ids=tensors.get("segment_ids"),
        parent_ids=tensors.get("parent_ids"),
        **extra,
    )


@pytest.mark.parametrize("head", [POLICY, VALUE], ids=lambda head: head.name)
def test_a_shared_prompt_scores_and_trains_as_padded_rows(policy, head):
    """Episodes that begin with the same prompt hold it once in a packed row; each still gets the
    log-probs (or values) and the gradient it gets alone in a padded row."""
    from grl.workers.sharding import pack, unpack

    model = policy if head is POLICY else load_critic("tiny", dtype="float32")
    if head is VALUE:
        with torch.no_grad():
            model.score.weight.normal_()  # (a new critic's head starts at 0)
    scorer = TokenScorer(model, head)
    padded = group_rows()
    packed, where = pack(padded, capacity=40, share_prompts=True)
    plain, _ = pack(padded, capacity=40)
    assert packed["input_ids"].numel() < plain["input_ids"].numel()  # 7 + 3 + 5 + 2 and 4 + 6 + 1 tokens
    assert int((packed["attention_mask"] > 0).sum()) == 7 + 10 + 4 + 7
    results = []
    for tensors in (padded, packed):
        model.zero_grad()
        out = score_rows(scorer, tensors, loss_mask=tensors["loss_mask"] if head is POLICY else None)
        out = out[0] if head is POLICY else out
        (out * tensors["loss_mask"]).sum().backward()
        grad = model.model.layers[0].self_attn.q_proj.weight.grad.clone()
        scores = (
            out.detach() if tensors is padded else unpack(out.detach(), where, padded["input_ids"].shape[1])
        )
        results.append((scores * padded["loss_mask"], grad))
    model.zero_grad()
    (want, want_grad), (got, got_grad) = results
    assert (want != 0).sum() == padded["loss_mask"].sum()  # every reply token, the first included
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-5, rtol=1e-4)


def test_packed_mask_is_block_diagonal_causal():
    seg = torch.tensor([[1, 1, 2, 2, 2, 0]])
    mask = additive_packed_mask(seg, torch.float32)[0, 0]
    allowed = mask == 0
    for q in range(6):
        for k in range(6):
            expected = (k <= q and seg[0, q] == seg[0, k] and q < 5) or q == k
            assert bool(allowed[q, k]) == expected, (q, k)


def test_a_shared_prompt_is_seen_by_the_episodes_after_it_only():
    seg = torch.tensor([[1, 1, 2, 2, 3, 3, 4, 0]])  # prompt 1 shared by episodes 2 and 3; 4 alone
    parent = torch.tensor([[0, 0, 1, 1, 1, 1, 0, 0]])
    allowed = additive_packed_mask(seg, torch.float32, parent)[0, 0] == 0
    sees = {0: [0], 1: [0, 1], 2: [0, 1, 2], 3: [0, 1, 2, 3], 4: [0, 1, 4], 5: [0, 1, 4, 5], 6: [6], 7: [7]}
    assert {q: allowed[q].nonzero().flatten().tolist() for q in range(8)} == sees


def test_value_scorer_is_backbone_plus_head_shifted():
    critic = load_critic("tiny", dtype="float32").eval()
    with torch.no_grad():
        critic.score.weight.normal_()
        ids, mask, pos = right_padded([8, 4], 8, seed=2)
        values = TokenScorer(critic, VALUE)(ids, mask, pos, chunk_size=3)
        hidden = critic.model(input_ids=ids, attention_mask=mask, position_ids=pos).last_hidden_state
        want = critic.score(hidden).squeeze(-1)
    assert torch.allclose(values[0, 1:], want[0, :-1], atol=1e-5)
    assert torch.allclose(values[1, 1:4], want[1, :3], atol=1e-5)
    assert values[:, 0].abs().sum() == 0 and values[1, 4:].abs().sum() == 0


@pytest.mark.parametrize("head", [POLICY, VALUE], ids=lambda head: head.name)
def test_a_heads_empty_model_has_the_tensors_its_loader_fills(head):
    """Each rank shards `empty_model(head)` and rank 0 fills it from `head.load`: a class or config that
    disagreed with the loader would leave a tensor unfilled or a shape wrong."""
    from grl.workers.fsdp import empty_model

    empty = empty_model(head, "tiny", torch.float32)
    loaded = head.load("tiny", dtype="float32")
    assert type(empty) is type(loaded)
    assert {k: v.shape for k, v in empty.state_dict().items()} == {
        k: v.shape for k, v in loaded.state_dict().items()
    }
    assert head.module(empty) is not None and head.module(empty).weight.is_meta


def test_a_head_given_by_name_is_refused_in_one_line(policy):
    with pytest.raises(
        TypeError, match=r"^head must be grl.workers.heads.POLICY or VALUE \(a Head\), got 'policy'$"
    ):
        TokenScorer(policy, "policy")


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_micro_batch_shares_add_up_to_the_mini_batch_loss(mode):
    from grl.algo import agg_loss

    g = torch.Generator().manual_seed(4)
    loss = torch.randn(7, 9, generator=g)
    mask = (torch.rand(7, 9, generator=g) > 0.4).float()
    mask[3] = 0  # a row without loss tokens
    whole = agg_loss(loss, mask, mode)
    total_units = loss_units(mask, mode)
    shares = sum(
        agg_loss(loss[i : i + 2], mask[i : i + 2], mode) * loss_units(mask[i : i + 2], mode) / total_units
        for i in range(0, 7, 2)
    )
    assert torch.allclose(shares, whole, atol=1e-6)


def test_trim_width_cuts_only_all_padding_columns():
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]])
    trimmed, width = trim_width({"attention_mask": mask, "x": torch.ones(2, 5), "row": torch.ones(2)})
    assert width == 5 and trimmed["x"].shape == (2, 3) and trimmed["row"].shape == (2,)


def test_minibatch_plan_covers_every_row_once_per_epoch():
    plan = plan_minibatches(10, 4, epochs=2, shuffle=True, seed=3)
    assert [len(p) for p in plan] == [4, 4, 2, 4, 4, 2]
    for epoch in (plan[:3], plan[3:]):
        assert sorted(row for mini in epoch for row in mini) == list(range(10))
    assert plan == plan_minibatches(10, 4, epochs=2, shuffle=True, seed=3)
    assert plan_minibatches(5, 2, 1, shuffle=False, seed=0) == [[0, 1], [2, 3], [4]]


def test_minibatches_keep_a_shared_prompts_episodes_together():
    groups = [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]  # as a rollout interleaves them
    plan = plan_minibatches(16, 8, epochs=3, shuffle=True, seed=3, groups=groups)
    for mini in plan:
        assert len(mini) == 8 and sorted(len([r for r in mini if r in g]) for g in groups) == [0, 0, 4, 4]
    assert len({tuple(m) for m in plan}) > 2  # each epoch draws the groups afresh
    # without groups the plan is the one episodes always had
    assert plan_minibatches(10, 4, 2, True, 3, groups=None) == plan_minibatches(10, 4, 2, True, 3)


def test_minibatch_shards_group_episodes_by_prompt_when_sharing():
    from omegaconf import OmegaConf

    from grl.workers.sharding import minibatch_shards, prompt_groups, prompts_of

    prompts = [[7, 8, 9], [5, 6], [1, 2, 3, 4]] * 3
    ids = torch.zeros(9, 6, dtype=torch.long)
    loss = torch.zeros(9, 6)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = torch.tensor(p)
        ids[i, len(p) : len(p) + 2] = 100 + i
        loss[i, len(p) : len(p) + 2] = 1
    tensors = {"input_ids": ids, "loss_mask": loss, "attention_mask": (ids > 0).long()}
    assert prompt_groups(prompts_of(tensors)) == [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    train = OmegaConf.create({"ppo_mini_batch_size": 3, "ppo_epochs": 2, "shuffle": True})
    (shards,) = minibatch_shards(tensors, train, ranks=1, seed=0, capacity=64, share_prompts=True)
    # every mini-batch is one group: its prompt laid once, then each episode's two sampled tokens
    assert sorted(int(s["attention_mask"].sum()) for s in shards) == [8, 8, 9, 9, 10, 10]


def test_padding_rows_never_carry_loss():
    tensors = {"loss_mask": torch.ones(5, 3), "input_ids": torch.arange(15).reshape(5, 3)}
    padded, rows = pad_rows(tensors, 4)
    assert rows == 5 and padded["loss_mask"].shape[0] == 8
    assert padded["loss_mask"][5:].sum() == 0 and torch.equal(
        padded["input_ids"][5:], tensors["input_ids"][[0, 0, 0]]
    )
    shards = equal_shards(padded, 4)
    assert all(s["input_ids"].shape[0] == 2 for s in shards)


def test_rows_are_counted_whatever_order_the_sets_ids_come_in():
    """The sets' flat ids are the one tensor not `[rows, ...]`: first in the dict, they must not count."""
    sizes = torch.tensor([[1, 0], [2, 0], [0, 1]])
    tensors = {
        "constraint_ids": torch.tensor([7, 8, 9, 4], dtype=torch.int32),
        "constraint_size": sizes,
        "loss_mask": torch.ones(3, 2),
    }
    padded, rows = pad_rows(tensors, 2)
    assert (
        rows == 3
        and padded["constraint_size"].shape[0] == 4
        and padded["constraint_ids"].tolist() == [7, 8, 9, 4, 7]
    )
    assert [s["constraint_ids"].tolist() for s in equal_shards(padded, 2)] == [[7, 8, 9], [4, 7]]


def test_warmup_is_linear_over_optimizer_steps():
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make_scheduler(opt, warmup_steps=4)
    seen = []
    for _ in range(6):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert make_scheduler(
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=0.5), 0
    ).get_last_lr() == [0.5]


def test_non_finite_entries_names_the_bad_tensors():
    state = {
        "a": torch.ones(2),
        "b": {"c": torch.tensor([1.0, math.nan])},
        "d": [torch.tensor([math.inf])],
        "step": torch.tensor(3),
    }
    assert non_finite_entries(state) == ["b.c", "d[0]"]
    assert non_finite_entries({"a": torch.zeros(3)}) == []


class InProcessEngines:
    """The one piece of a worker group the engine proxy uses (`call_ranks`),
    with real engines in this process instead of Ray actors."""

    def __init__(self, engines):
        self.engines = engines

    def call_ranks(self, ranks, method, per_rank_args):
        assert method == "engine_generate"
        return [self.engines[r].generate(*args) for r, args in zip(ranks, per_rank_args)]


def test_engine_proxy_splits_prompts_and_keeps_each_prompts_seed():
    from grl.engines import make_engine
    from grl.engines.base import SamplingParams
    from grl.workers.engine_proxy import EngineProxy

    engines = [make_engine("hf", "tiny", dtype="float32", device="cpu") for _ in range(2)]
    prompts = [[1, 2, 3, 4], [1, 2, 3, 4], [5, 6, 7, 8], [1, 2, 3, 4], [9, 9, 9, 9]]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=5, seed=11)
    alone = engines[0].generate(prompts, sampling)
    split = EngineProxy(InProcessEngines(engines), [0, 1]).generate(prompts, sampling)
    assert [o.token_ids for o in split] == [o.token_ids for o in alone]
    assert len({tuple(alone[i].token_ids) for i in (0, 1, 3)}) > 1  # same prompt, own seeds
    one_prompt = EngineProxy(InProcessEngines(engines), [0, 1]).generate(prompts[:1], sampling)
    assert [o.token_ids for o in one_prompt] == [alone[0].token_ids]


def scored_as_before(policy, tensors, padded_ids, chunk, temperature):
    """The scorer as it was with the padded sets `[B, T, K]`: each chunk's sets sliced from them
    and masked by `constrain_logits` (the decoding engines' padded form)."""
    from grl.algo import entropy_from_logits, log_probs_from_logits
    from grl.engines.constraint import constrain_logits
    from grl.workers.scoring import predecessors

    ids, mask, sizes = tensors["input_ids"], tensors["attention_mask"], tensors["constraint_size"]
    hidden = policy.base_model(
        input_ids=ids, attention_mask=mask, position_ids=tensors["position_ids"], use_cache=False
    )
    hidden = hidden.last_hidden_state
    prev = predecessors(mask, None)
    rows, columns = ((prev >= 0) & (tensors["loss_mask"] > 0)).nonzero(as_tuple=True)
    flat_hidden, labels = hidden[rows, prev[rows, columns]], ids[rows, columns]
    flat_sizes, flat_ids = sizes[rows, columns], padded_ids[rows, columns]
    outputs = []
    for i in range(0, len(rows), chunk):
        part = slice(i, i + chunk)
        logits = policy.get_output_embeddings()(flat_hidden[part]).float() / temperature
        logits = constrain_logits(logits, flat_sizes[part], flat_ids[part])
        outputs.append((log_probs_from_logits(logits, labels[part]), entropy_from_logits(logits)))
    return tuple(
        torch.zeros(ids.shape, dtype=torch.float32).index_put(
            (rows, columns), torch.cat([o[j] for o in outputs])
        )
        for j in (0, 1)
    )


@pytest.mark.parametrize("chunk", [1, 3, 4096])
def test_compact_sets_score_bit_for_bit_as_the_padded_ones(policy, chunk):
    from grl.rollout.batch import build_batch
    from tests.rollout.test_batch import constrained_episodes, padded_sets

    batch, _ = build_batch(constrained_episodes(huge=900))
    tensors = batch.tensors
    padded = padded_sets(
        tensors["constraint_size"], tensors["constraint_ids"], int(tensors["constraint_size"].abs().max())
    )
    args = (tensors["input_ids"], tensors["attention_mask"], tensors["position_ids"])
    sets = {"constraint_size": tensors["constraint_size"], "constraint_ids": tensors["constraint_ids"]}

    def scored(**sets_if_any):
        return TokenScorer(policy, POLICY)(
            *args, chunk_size=chunk, temperature=0.7, loss_mask=tensors["loss_mask"], **sets_if_any
        )

    with torch.no_grad():
        got = scored(**sets)
        want = scored_as_before(policy, tensors, padded, chunk, 0.7)
        free = scored()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with torch.enable_grad():  # in training, several chunks are recomputed in backward
        trained = scored(**sets)
    assert torch.equal(trained[0].detach(), want[0]) and torch.equal(trained[1].detach(), want[1])
    assert not torch.equal(got[0], free[0])  # the sets change the scores: the check above can fail


def test_a_small_allowed_set_scores_on_its_own_ids_as_the_masked_vocabulary(policy):
    """A token whose allowed set is small and lists its label is scored from its set's rows of the head
    alone; log-probs, entropies and their gradients are those of the masked softmax over the whole
    vocabulary (the reference below, in float64). Sets too big for that, denied sets, free tokens and a
    label outside its set take the vocabulary's path."""
    from grl.engines.constraint import constrain_logits
    from grl.workers.heads import SMALL_SET

    g = torch.Generator().manual_seed(3)
    head = policy.get_output_embeddings()
    vocab = head.weight.shape[0]
    kinds = [1, 1, 2, 5, SMALL_SET, SMALL_SET + 1, 300, -3, 0, "label outside"]
    sizes, sets, labels = [], [], []
    for i in range(60):
        kind = kinds[i % len(kinds)]
        size = 4 if kind == "label outside" else kind
        members = torch.randperm(vocab, generator=g)[: abs(size)].tolist()
        inside = size > 0 and kind != "label outside"
        label = members[i % size] if inside else next(t for t in range(vocab) if t not in members)
        sizes.append(size), sets.append(members), labels.append(label)
    sizes, labels = torch.tensor(sizes), torch.tensor(labels)
    ids = torch.tensor([t for members in sets for t in members], dtype=torch.int32)
    hidden = torch.randn(len(labels), head.weight.shape[1], generator=g, requires_grad=True)

    rows_through_the_head = []
    hook = head.register_forward_hook(
        lambda module, args, out: rows_through_the_head.append(args[0].shape[0])
    )
    try:
        log_prob, entropy = POLICY.score(head, hidden, labels, 0.7, sizes, ids)
    finally:
        hook.remove()
    on_set = [i for i, kind in enumerate(kinds * 6) if isinstance(kind, int) and 0 < kind <= SMALL_SET]
    assert rows_through_the_head == [len(labels) - len(on_set)]  # the others never met the vocabulary

    padded = torch.zeros(len(sets), max(map(len, sets)), dtype=torch.long)
    for i, members in enumerate(sets):
        padded[i, : len(members)] = torch.tensor(members, dtype=torch.long)
    logits = constrain_logits(head(hidden).double() / 0.7, sizes, padded)
    want_log_prob = torch.log_softmax(logits, -1).gather(1, labels[:, None]).squeeze(1)
    probs = torch.softmax(logits, -1)
    want_entropy = -(probs * torch.where(probs > 0, torch.log_softmax(logits, -1), 0.0)).sum(-1)
    finite = torch.isfinite(want_log_prob)
    assert finite[on_set].all() and not finite.all()  # the label outside its set: -inf either way
    assert torch.equal(torch.isfinite(log_prob), finite)
    torch.testing.assert_close(log_prob[finite].double(), want_log_prob[finite], rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy.double(), want_entropy, rtol=0, atol=1e-5)
    assert (log_prob[on_set][sizes[on_set] == 1] == 0).all()  # a forced token: certain

    got = torch.autograd.grad(log_prob[finite].sum() + entropy.sum(), [hidden, head.weight])
    want = torch.autograd.grad(want_log_prob[finite].sum() + want_entropy.sum(), [hidden, head.weight])
    for g_got, g_want in zip(got, want):
        torch.testing.assert_close(g_got.double(), g_want.double(), rtol=0, atol=1e-5)
