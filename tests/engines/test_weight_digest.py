"""The weight digest the certificate compares after each sync (grl/engines/weights.py): equal to a
slow word-by-word reference, additive over tensors joined along their first dimension (vLLM's fused
qkv_proj is checked against q, k and v), changed by any value; and the hf engine's digest of what it
holds, after a real update, checked against the digests of what it was sent."""

import struct

import pytest
import torch

from grl.engines import make_engine, weights
from grl.engines.weights import (
    SyncCheck,
    WeightsMismatch,
    add_digests,
    check_sync,
    digesting,
    raise_on_mismatch,
    tensor_digest,
    TensorStream,
)


def slow_digest(tensor: torch.Tensor) -> tuple[int, int, int, int]:
    """Row by row (the first dimension; a 1-D tensor is a column), each row's bytes read as
    little-endian unsigned 16-bit words (bytes for 1-byte dtypes), the j-th word of a row weighted j."""
    rows = tensor.reshape(-1, 1) if tensor.dim() < 2 else tensor.reshape(tensor.shape[0], -1)
    size = 1 if tensor.element_size() == 1 else 2
    words = count = total = squares = weighted = 0
    for row in rows:
        raw = row.contiguous().view(torch.uint8).tolist()
        values = (
            raw
            if size == 1
            else [struct.unpack("<H", bytes(raw[i : i + 2]))[0] for i in range(0, len(raw), 2)]
        )
        for j, w in enumerate(values, start=1):
            count, total, squares, weighted = count + 1, total + w, squares + w * w, weighted + w * j
        words += len(values)
    return count, total, squares, weighted


@pytest.mark.parametrize(
    "tensor",
    [
        torch.randn(5, 7, generator=torch.Generator().manual_seed(0)),
        torch.randn(4, 3, 2, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16),
        torch.randn(9, generator=torch.Generator().manual_seed(2)).to(torch.float16),
        torch.randint(0, 255, (3, 4), dtype=torch.uint8),
        torch.tensor(-2.5),
    ],
)
def test_the_digest_equals_the_slow_reference(tensor):
    assert tensor_digest(tensor) == slow_digest(tensor)


def test_the_digest_is_exact_when_tiles_cut_rows(monkeypatch):
    """Tiles smaller than a row (a row of a wide weight, or a long 1-D tensor) add up to the same digest."""
    monkeypatch.setattr(weights, "DIGEST_TILE_WORDS", 64)
    gen = torch.Generator().manual_seed(4)
    for tensor in (
        torch.randn(7, 300, generator=gen),
        torch.randn(3, 2, 50, generator=gen).to(torch.bfloat16),
        torch.randn(1000, generator=gen),
    ):
        assert tensor_digest(tensor) == slow_digest(tensor)


def test_the_digest_of_a_fused_tensor_is_the_sum_of_its_parts_and_sees_any_change():
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(n, 6, generator=gen).to(torch.bfloat16) for n in (4, 2, 2))
    assert tensor_digest(torch.cat([q, k, v])) == add_digests([tensor_digest(t) for t in (q, k, v)])
    bias = torch.randn(8, generator=gen)
    assert tensor_digest(bias) == add_digests([tensor_digest(bias[:4]), tensor_digest(bias[4:])])
    changed = q.clone()
    changed.view(torch.int16)[1, 2] += 1  # one ulp
    assert tensor_digest(changed) != tensor_digest(q)
    square = torch.randn(5, 5, generator=gen)
    assert tensor_digest(square.t()) != tensor_digest(square)  # a transposed weight
    assert tensor_digest(square[:, [1, 0, 2, 3, 4]]) != tensor_digest(square)  # columns swapped within rows


def test_check_sync_names_what_differs_is_missing_or_was_never_held():
    gen = torch.Generator().manual_seed(4)
    sent = {name: tensor_digest(torch.randn(3, 4, generator=gen)) for name in ("q", "k", "norm")}
    held = {"qkv": (("q", "k"), add_digests([sent["q"], sent["k"]])), "norm": (("norm",), sent["norm"])}
    assert check_sync(sent, held) == SyncCheck(2, ())
    assert check_sync(sent, {**held, "norm": (("norm",), sent["q"])}).mismatched == ("norm",)
    assert check_sync(sent, {**held, "norm": (("norm",), None)}).mismatched == (
        "norm",
    )  # the engine has no such tensor
    assert check_sync(sent, {"qkv": held["qkv"]}).mismatched == ("norm",)  # sent, held by none
    assert check_sync({"q": sent["q"]}, held).mismatched == ("qkv", "norm")  # held, never sent
    with pytest.raises(
        WeightsMismatch, match=r"differ from the trainer's .* in 1 of 2 tensors, e.g. 'norm'"
    ) as info:
        raise_on_mismatch(check_sync(sent, {**held, "norm": (("norm",), sent["q"])}), "rank 0's engine")
    assert "\n" not in str(info.value)


def test_the_hf_engine_holds_what_it_was_sent_and_the_digest_sees_a_value_changed_on_the_way():
    engine = make_engine("hf", "tiny", dtype="float32", device="cpu")
    try:
        state = {k: v.clone() for k, v in engine.model.state_dict().items() if k != "lm_head.weight"}  # tied
        state = {k: v + 0.01 for k, v in state.items()}
        sent: dict = {}
        engine.update_weights(
            digesting(TensorStream({k: tuple(v.shape) for k, v in state.items()}, state.items()), sent)
        )
        assert check_sync(sent, engine.weights_digest()) == SyncCheck(len(state), ())
        name = "model.layers.0.mlp.up_proj.weight"
        on_the_way = {
            **state,
            name: state[name].clone().index_put_((torch.tensor([0]), torch.tensor([0])), torch.tensor(7.0)),
        }
        engine.update_weights(on_the_way)
        assert check_sync(sent, engine.weights_digest()).mismatched == (name,)
    finally:
        engine.shutdown()
