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
        raise WeightMismatchError(
            f"update_weights: {len(missing)} of {len(spec.shapes)} tensors missing, e.g. {missing[0]!r}"
        )
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
                f"update_weights: the stream made {name!r} {_shape_text(tensor.shape)} where it announced "
                f"{announced!r}"
            )
        if filled[name] is not None:
            yield filled[name], tensor


# ---------------------------------------------------------------- the engine holds what the trainer sent

# A digest of a tensor: (words, sum, sum of squares, column-weighted sum) over its raw bits read as
# 16-bit words (bytes for 1-byte dtypes), each word taken as an unsigned number. Exact (integers: no
# rounding, no tolerance) and additive: the digest of tensors concatenated along their first dimension
# is the sum of theirs, so a fused engine tensor (vLLM's qkv_proj = q, k, v) is checked against the sum
# of its parts. Any changed, missing or extra value changes it, as does a transposed or reordered row;
# values swapped between rows of one column are what it cannot see.
Digest = tuple[int, int, int, int]
# Words per tile. The sums run in float64 through BLAS (4-8x faster than int64 on a CPU, where the sync
# digests the whole model on both sides every step), and float64 adds integers exactly while every partial
# sum stays below 2**53: a tile's squares are at most 2**20 words of at most 2**32 each.
DIGEST_TILE_WORDS = 1 << 20


def tensor_digest(tensor: torch.Tensor) -> Digest:
    import torch

    value = tensor.detach().contiguous()
    # Rows keep their columns when tensors are concatenated along dim 0; a 1-D tensor has one column.
    value = value.reshape(-1, 1) if value.dim() < 2 else value.flatten(1)
    words = value.view(torch.uint8 if value.element_size() == 1 else torch.uint16)
    width = words.shape[1]
    block = min(width, DIGEST_TILE_WORDS)
    column_sums = torch.zeros(width, dtype=torch.int64, device=words.device)
    total = squares = 0
    for rows in words.split(max(1, DIGEST_TILE_WORDS // block)):
        for start in range(0, width, block):
            tile = rows[:, start : start + block].to(torch.float64)
            flat = tile.view(-1)
            total += int(flat.sum())
            squares += int(torch.dot(flat, flat))
            column_sums[start : start + block] += tile.sum(0).to(torch.int64)
    column = torch.arange(1, width + 1, device=words.device, dtype=torch.int64)
    return words.numel(), total, squares, int((column_sums * column).sum())


def add_digests(digests) -> Digest:
    return tuple(sum(parts) for parts in zip(*digests)) if digests else (0, 0, 0, 0)


def digesting(stream: TensorStream, into: dict[str, Digest]) -> TensorStream:
    """`stream` unchanged, each tensor's digest written to `into` (name -> digest) as it passes."""

    def tensors():
        for name, tensor in stream:
            into[name] = tensor_digest(tensor)
            yield name, tensor

    return TensorStream(stream.shapes, tensors())


def module_digests(module, spec: WeightSpec) -> dict[str, tuple[tuple[str, ...], Digest]]:
    """An engine's digests of a torch module that keeps the trainer's names (the hf engine): each canonical
    tensor of `spec` -> ((its name,), its digest)."""
    params = module.state_dict(keep_vars=True)
    return {name: ((name,), tensor_digest(params[name])) for name in spec.shapes}


@dataclass(frozen=True)
class SyncCheck:
    """An engine's weights against what the trainer sent: how many engine tensors, which differ."""

    tensors: int
    mismatched: tuple[str, ...]


class WeightsMismatch(RuntimeError):
    """The engine does not hold the weights the trainer sent (always fatal: it would sample another
    policy)."""


def check_sync(sent: dict[str, Digest], held: dict[str, tuple[tuple[str, ...], Digest | None]]) -> SyncCheck:
    """`sent`: name -> digest of each tensor the trainer sent; `held`: the engine's tensor -> (the sent
    names it holds, its digest; None where it has no such tensor). An engine tensor differs when its
    digest is not the sum of its members' (or a member was never sent); a sent tensor no engine tensor
    holds counts as differing too."""
    mismatched = [
        key
        for key, (members, digest) in held.items()
        if digest is None
        or any(m not in sent for m in members)
        or add_digests([sent[m] for m in members]) != tuple(digest)
    ]
    held_names = {m for members, _ in held.values() for m in members}
    mismatched += [name for name in sent if name not in held_names]
    return SyncCheck(len(held), tuple(mismatched))


def raise_on_mismatch(check: SyncCheck, where: str) -> SyncCheck:
    """`check`, or WeightsMismatch in one line naming the first tensor that differs."""
    if check.mismatched:
        raise WeightsMismatch(
            f"{where}: the rollout engine's weights differ from the trainer's after the weight sync in "
            f"{len(check.mismatched)} of {check.tensors} tensors, e.g. {check.mismatched[0]!r}: the engine "
            "would sample with other weights than those trained"
        )
    return check
