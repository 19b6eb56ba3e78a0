"""Validation of named tensors before an engine loads them."""

import pytest
import torch

from grl.engines.weights import (
    WeightMismatchError,
    check_named_tensors,
    meta_weight_spec,
    weight_spec,
)


@pytest.fixture(scope="module")
def tiny_model(tiny_path):
    from grl.models import load_causal_lm

    return load_causal_lm(tiny_path, "float32")


@pytest.fixture(scope="module")
def spec(tiny_model):
    return weight_spec(tiny_model)


def test_tied_head_is_an_alias(tiny_model, spec, tiny_path):
    assert spec.aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    assert set(spec.shapes) == {name for name, _ in tiny_model.named_parameters()}
    assert meta_weight_spec(tiny_path) == spec


def test_state_dict_and_named_parameters_both_fit(tiny_model, spec):
    from_state = check_named_tensors(tiny_model.state_dict(), spec)
    from_params = check_named_tensors(tiny_model.named_parameters(), spec)
    assert [n for n, _ in from_state] == [n for n, _ in from_params] == list(spec.shapes)
    assert all(a.data_ptr() == b.data_ptr() for (_, a), (_, b) in zip(from_state, from_params))


def test_alias_stands_in_for_its_canonical_name(tiny_model, spec):
    state = {
        ("lm_head.weight" if n == "model.embed_tokens.weight" else n): t
        for n, t in tiny_model.state_dict().items()
        if n != "lm_head.weight"
    }
    checked = dict(check_named_tensors(state, spec))
    assert checked["model.embed_tokens.weight"] is state["lm_head.weight"]


def test_canonical_tensor_wins_over_alias(tiny_model, spec):
    state = dict(tiny_model.state_dict())
    state["lm_head.weight"] = torch.zeros_like(state["lm_head.weight"])
    checked = dict(check_named_tensors(state, spec))
    assert checked["model.embed_tokens.weight"] is state["model.embed_tokens.weight"]


def _broken(tiny_model, edit):
    state = dict(tiny_model.state_dict())
    edit(state)
    return state


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda s: s.update({"model.layers.9.mlp.up_proj.weight": torch.zeros(2)}),
            "unknown tensor name 'model.layers.9.mlp.up_proj.weight'",
        ),
        (
            lambda s: s.update({"model.norm.weight": torch.zeros(3)}),
            r"'model.norm.weight' has shape \(3\), expected \(64\)",
        ),
        (
            lambda s: s.pop("model.layers.1.self_attn.q_proj.weight"),
            "1 of 20 tensors missing, e.g. 'model.layers.1.self_attn.q_proj.weight'",
        ),
        (
            lambda s: s.update({"model.norm.weight": [1.0] * 64}),
            "'model.norm.weight' is a list, not a tensor",
        ),
    ],
)
def test_mismatch_names_the_tensor(tiny_model, spec, edit, message):
    with pytest.raises(WeightMismatchError, match=message):
        check_named_tensors(_broken(tiny_model, edit), spec)


def test_name_given_twice(tiny_model, spec):
    pairs = list(tiny_model.state_dict().items())
    with pytest.raises(WeightMismatchError, match="given twice"):
        check_named_tensors(pairs + pairs[:1], spec)
