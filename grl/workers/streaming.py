"""The policy's full weights, one tensor at a time, gathered from its FSDP2 shards.

The rollout engine's update and the Hugging Face export both read the policy whole. Gathering
the full state dict first holds every weight in fp32 on every rank (28 GB for a 7B model, beside
the engine's own copy); here each tensor is gathered (a collective every rank joins), cast to
the receiver's dtype and handed on before the next one is gathered.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from grl.engines.weights import TensorStream
from grl.workers import lora

EXPORT_FILE_BYTES = 2 * 2**30  # the export writes files of at most this size: rank 0 holds one at a time


def full_tensor(value: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Collective for a sharded `value`: the whole tensor on every rank. An elementwise cast
    commutes with the gather, so the shard is cast first and the gather moves `dtype` bytes."""
    value = value.detach()
    if dtype is not None:
        value = value.to(dtype)
    if not isinstance(value, DTensor):
        return value
    if value.device.type != value.device_mesh.device_type:  # an offloaded shard gathers on the device
        value = value.to(value.device_mesh.device_type)
    return value.full_tensor()


def policy_tensors(
    state: dict, dtype: torch.dtype, lora_scaling: float | None = None, tied_lm_head: bool = False
) -> TensorStream:
    """Plain Hugging Face weights of the policy as a stream. `state`: the sharded model's
    state dict under Hugging Face names (shards only, nothing gathered). A LoRA policy
    (`lora_scaling`) yields each adapted Linear merged, W + scaling * B @ A, made from its
    three gathered tensors; a tied `lm_head.weight` is left out (the receiver ties it)."""
    names = [n for n in state if not lora.is_adapter(n) and not (tied_lm_head and n == "lm_head.weight")]
    shapes = {lora.plain_name(n): tuple(state[n].shape) for n in names}

    def tensors() -> Iterator[tuple[str, torch.Tensor]]:
        with torch.no_grad():
            for name in names:
                if lora_scaling is not None and name.endswith(lora.BASE + "weight"):
                    a, b = lora.adapter_names(name.split(lora.BASE)[0])
                    merged = lora.merged_weight(
                        full_tensor(state[name]), full_tensor(state[a]), full_tensor(state[b]), lora_scaling
                    )
                    yield lora.plain_name(name), merged.to(dtype)
                else:
                    yield lora.plain_name(name), full_tensor(state[name], dtype)

    return TensorStream(shapes, tensors())


def _file_plan(shapes: dict[str, tuple[int, ...]], itemsize: int, limit: int) -> list[list[str]]:
    """Names per file, in order: a new file starts when the next tensor would pass `limit`."""
    files: list[list[str]] = [[]]
    held = 0
    for name, shape in shapes.items():
        size = itemsize * int(torch.Size(shape).numel())
        if files[-1] and held + size > limit:
            files.append([])
            held = 0
        files[-1].append(name)
        held += size
    return files


def write_safetensors(
    stream: TensorStream, folder: Path, dtype: torch.dtype, write: bool, limit: int = EXPORT_FILE_BYTES
) -> None:
    """The stream as Hugging Face weight files: `model.safetensors`, or numbered files with
    `model.safetensors.index.json` when it exceeds `limit`. Every rank runs the gathers;
    only a rank with `write` keeps tensors (on the host, one file's worth) and writes."""
    from safetensors.torch import save_file

    plan = _file_plan(stream.shapes, torch.empty(0, dtype=dtype).element_size(), limit)
    names = [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
    if len(plan) == 1:
        names = ["model.safetensors"]
    tensors = iter(stream)
    for filename, members in zip(names, plan):
        held = {}
        for _ in members:  # the plan follows the stream's own order
            name, tensor = next(tensors)
            if write:
                held[name] = tensor.to("cpu").contiguous()
        if write:
            save_file(held, str(folder / filename), metadata={"format": "pt"})
    if write and len(plan) > 1:
        total = (
            sum(torch.Size(s).numel() for s in stream.shapes.values())
            * torch.empty(0, dtype=dtype).element_size()
        )
        index = {
            "metadata": {"total_size": total},
            "weight_map": {name: file for file, members in zip(names, plan) for name in members},
        }
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
