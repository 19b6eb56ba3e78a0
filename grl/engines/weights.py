"""Check a trainer's named tensors against the engine's model before loading.

Both engines validate the whole set first and only then copy, so a bad update
(a wrong name, a wrong shape, a missing tensor) raises and leaves the old
weights in place.

Tied weights: a Hugging Face state dict lists `lm_head.weight` beside
`model.embed_tokens.weight` when the two are one tensor. The spec keeps the
first name as canonical and the others as aliases; an alias is accepted in
place of its canonical name and dropped when both are given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class WeightMismatchError(ValueError):
    """Named tensors that do not fit the engine's model."""


@dataclass(frozen=True)
class WeightSpec:
    shapes: dict[str, tuple[int, ...]]  # canonical name -> shape
    aliases: dict[str, str]  # tied name -> canonical name


def weight_spec(model) -> WeightSpec:
    """Names and shapes of a torch module's state dict, tied entries folded."""
    shapes: dict[str, tuple[int, ...]] = {}
    aliases: dict[str, str] = {}
    first_name_of: dict[int, str] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        canonical = first_name_of.setdefault(id(tensor), name)
        if canonical == name:
            shapes[name] = tuple(tensor.shape)
        else:
            aliases[name] = canonical
    return WeightSpec(shapes, aliases)


def meta_weight_spec(model_path: str) -> WeightSpec:
    """The spec of a checkpoint's Hugging Face model, built on the meta device
    (no memory, no weights read), for engines whose own modules hide it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return weight_spec(model)


def _shape_text(shape) -> str:
    return "(" + ", ".join(str(int(d)) for d in shape) + ")"


def check_named_tensors(named_tensors, spec: WeightSpec) -> list[tuple[str, torch.Tensor]]:
    """Return [(canonical name, tensor)] covering every tensor of `spec`, or
    raise WeightMismatchError naming the first problem."""
    import torch

    items = named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors
    chosen: dict[str, torch.Tensor] = {}
    seen: set[str] = set()
    for name, tensor in items:
        if name in seen:
            raise WeightMismatchError(f"update_weights: tensor {name!r} given twice")
        seen.add(name)
        if not isinstance(tensor, torch.Tensor):
            raise WeightMismatchError(f"update_weights: {name!r} is a {type(tensor).__name__}, not a tensor")
        canonical = spec.aliases.get(name, name)
        if canonical not in spec.shapes:
            raise WeightMismatchError(
                f"update_weights: unknown tensor name {name!r} (the model has {len(spec.shapes)} tensors, "
                f"e.g. {next(iter(spec.shapes))!r})"
            )
        expected = spec.shapes[canonical]
        if tuple(tensor.shape) != expected:
            raise WeightMismatchError(
                f"update_weights: {name!r} has shape {_shape_text(tensor.shape)}, expected {_shape_text(expected)}"
            )
        if name == canonical or canonical not in chosen:
            chosen[canonical] = tensor
    missing = [name for name in spec.shapes if name not in chosen]
    if missing:
        raise WeightMismatchError(
            f"update_weights: {len(missing)} of {len(spec.shapes)} tensors missing, e.g. {missing[0]!r}"
        )
    return [(name, chosen[name]) for name in spec.shapes]
