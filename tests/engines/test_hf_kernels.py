"""The hf engine's CPU attention and in-place KV cache against plain references: transformers' eager
attention (the textbook softmax(QK^T)V over repeated heads) and a cache grown by concatenation."""

import pytest
import torch

from grl.engines import SamplingParams, cpu_attention, make_engine
from grl.engines.kv_slab import SlabLayer, prefix_slab
from grl.models import load_causal_lm


def test_grouped_attention_matches_eager_on_a_padded_batch(tiny_path):
    model = load_causal_lm(tiny_path, "float32", "cpu").eval()
    assert (
        model.config.num_attention_heads > model.config.num_key_value_heads
    )  # the grouped path is the one tested
    input_ids = torch.randint(5, 1000, (3, 12), generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :5] = 0  # left padding, as the engine lays rows out
    attention_mask[2, :2] = 0
    with torch.inference_mode():
        model.set_attn_implementation("eager")
        reference = model(input_ids=input_ids, attention_mask=attention_mask).logits
        cpu_attention.use_on(model)  # only switches a model that runs `sdpa`
        assert model.config._attn_implementation == "eager"
        model.set_attn_implementation("sdpa")
        cpu_attention.use_on(model)
        assert model.config._attn_implementation == cpu_attention.NAME
        grouped = model(input_ids=input_ids, attention_mask=attention_mask).logits
    valid = attention_mask.bool()
    torch.testing.assert_close(grouped[valid], reference[valid], atol=1e-5, rtol=1e-5)


def test_the_engine_runs_the_grouped_attention(tiny_path):
    engine = make_engine("hf", tiny_path, dtype="float32", device="cpu", seed=0)
    assert engine.model.config._attn_implementation == cpu_attention.NAME
    out = engine.generate([[1, 2, 3], [4, 5]], SamplingParams(greedy=True, max_new_tokens=3))
    assert all(len(o.token_ids) == 3 for o in out)


def _prefix(length: int, heads: int = 2, dim: int = 4, layers: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(heads, length, dim, generator=g), torch.randn(heads, length, dim, generator=g))
        for _ in range(layers)
    ]


@pytest.mark.parametrize("room", [7, 2])  # 2: the second update overflows the buffer, which grows
def test_slab_holds_what_a_concatenated_cache_holds(room):
    prefixes = [_prefix(3, seed=1), None, _prefix(5, seed=2)]
    past = 5
    cache = prefix_slab(prefixes, past, room, num_layers=2)
    g = torch.Generator().manual_seed(3)
    news = [(torch.randn(3, 2, n, 4, generator=g), torch.randn(3, 2, n, 4, generator=g)) for n in (2, 1)]
    for layer in range(2):
        # the reference: zeros left of each prefix, the prefix, then every update appended by torch.cat
        keys = torch.zeros(3, 2, past, 4)
        values = torch.zeros(3, 2, past, 4)
        for row, prefix in enumerate(prefixes):
            if prefix is not None:
                keys[row, :, past - prefix[layer][0].shape[1] :] = prefix[layer][0]
                values[row, :, past - prefix[layer][1].shape[1] :] = prefix[layer][1]
        for new_keys, new_values in news:
            keys, values = torch.cat([keys, new_keys], dim=-2), torch.cat([values, new_values], dim=-2)
            got_keys, got_values = cache.layers[layer].update(new_keys, new_values)
            torch.testing.assert_close(got_keys, keys, atol=0, rtol=0)
            torch.testing.assert_close(got_values, values, atol=0, rtol=0)
        assert cache.layers[layer].get_seq_length() == past + 3


def test_an_empty_slab_takes_its_shape_from_the_first_update():
    layer = SlabLayer(capacity=6)
    first = torch.arange(2 * 3 * 4 * 5, dtype=torch.float32).reshape(2, 3, 4, 5)
    keys, values = layer.update(first, -first)
    assert torch.equal(keys, first) and torch.equal(values, -first)
    keys, _ = layer.update(first[:, :, :2], first[:, :, :2])
    assert torch.equal(keys, torch.cat([first, first[:, :, :2]], dim=-2))


def test_a_long_reply_grows_the_slab_and_keeps_every_column():
    layer = SlabLayer(capacity=3)
    steps = [torch.full((1, 2, 1, 4), float(i)) for i in range(40)]  # one decoded token at a time
    for step in steps:
        keys, values = layer.update(step, -step)
    assert torch.equal(keys, torch.cat(steps, dim=-2)) and torch.equal(values, -torch.cat(steps, dim=-2))
    assert 40 < layer.capacity <= 60  # grown by half again, not to the last token alone
