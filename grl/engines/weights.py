"""Check a trainer's named tensors against the engine's model before loading.

Both engines validate the whole set first and only then copy, so a bad update
(a wrong name, a wrong shape, a missing tensor) raises and leaves the old
weights in place.

Tied weights: a Hugging Face state dict lists `lm_head.weight` beside
`model.embed_tokens.weight` when the two are one tensor. The spec keeps the
first name as canonical and the others as aliases; an alias is accepted in
place of its canonical name and dropped when both are given.

A `TensorStream` makes its tensors one at a time (a trainer gathers each from
its shards while the engine copies the one before), so the whole set never
exists at once; its names and shapes are known up front and checked the same
way before the first tensor is made.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
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


class TensorStream:
    """Named tensors made lazily, in the order of `shapes` (name -> shape), which is
    known before any tensor is made. One pass: iterating continues where the last stopped."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], tensors: Iterable[tuple[str, torch.Tensor]]):
        self.shapes = shapes
        self._tensors = iter(tensors)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        return self._tensors

    def drain(self) -> None:
        """Make (and drop) whatever is left: a trainer whose tensors come from collectives
        must make all of them, also when its engine stopped reading."""
        for _ in self._tensors:
            pass


def _canonical_names(named_shapes, spec: WeightSpec) -> dict[str, str | None]:
    """Check names and shapes against `spec`: given name -> the canonical name it fills
    (None: an alias whose canonical tensor is given too), or raise WeightMismatchError."""
    filled: dict[str, str | None] = {}
    chosen: dict[str, str] = {}
    for name, shape in named_shapes:
        if name in filled:
            raise WeightMismatchError(f"update_weights: tensor {name!r} given twice")
        canonical = spec.aliases.get(name, name)
        if canonical not in spec.shapes:
            raise WeightMismatchError(
                f"update_weights: unknown tensor name {name!r} (the model has {len(spec.shapes)} tensors, "
                f"e.g. {next(iter(spec.shapes))!r})"
            )
        expected = spec.shapes[canonical]
        if tuple(shape) != expected:
            raise WeightMismatchError(
                f"update_weights: {name!r} has shape {_shape_text(shape)}, expected {_shape_text(expected)}"
            )
        filled[name] = canonical
        if name == canonical or canonical not in chosen:
            if canonical in chosen:  # the alias came first: the canonical name replaces it
                filled[chosen[canonical]] = None
            chosen[canonical] = name
        else:
            filled[name] = None
    missing = [name for name in spec.shapes if name not in chosen]
    if missing:
        raise WeightMismatchError(f"update_weights: {len(missing)} of {len(spec.shapes)} tensors missing, e.g. {missing[0]!r}")
    return filled


def check_named_tensors(named_tensors, spec: WeightSpec) -> list[tuple[str, torch.Tensor]] | Iterator:
    """Return [(canonical name, tensor)] covering every tensor of `spec`, or
    raise WeightMismatchError naming the first problem. A `TensorStream` is
    checked by its names and shapes and comes back as a lazy iterator in its
    own order, each tensor checked against its announced shape as it is made."""
    import torch

    if isinstance(named_tensors, TensorStream):
        return _checked_stream(named_tensors, _canonical_names(named_tensors.shapes.items(), spec))
    items = list(named_tensors.items() if isinstance(named_tensors, Mapping) else named_tensors)
    for name, tensor in items:
        if not isinstance(tensor, torch.Tensor):
            raise WeightMismatchError(f"update_weights: {name!r} is a {type(tensor).__name__}, not a tensor")
    filled = _canonical_names(((name, tensor.shape) for name, tensor in items), spec)
    chosen = {filled[name]: tensor for name, tensor in items if filled[name] is not None}
    return [(name, chosen[name]) for name in spec.shapes]


def _checked_stream(stream: TensorStream, filled: dict[str, str | None]) -> Iterator:
    order = iter(stream.shapes.items())
    for name, tensor in stream:
        announced, shape = next(order, (None, None))
        if name != announced or tuple(tensor.shape) != tuple(shape):
            raise WeightMismatchError(
                f"update_weights: the stream made {name!r} {_shape_text(tensor.shape)} where it announced {announced!r}"
            )
        if filled[name] is not None:
            yield filled[name], tensor
