"""Sharded checkpoints of one worker group: each rank writes and reads only its own shards.

A checkpoint folder (one per role) holds

    dcp/                 torch.distributed.checkpoint: `.metadata` and one `__<rank>_0.distcp` per rank
                         with that rank's shards of the weights (the adapter's alone in a LoRA run)
                         and of the optimizer state
    state.pt             the learning-rate scheduler, world size (rank 0)
    rng_rank<r>.pt       each rank's random states

A 7B policy with AdamW state is about 84 GB in fp32: gathered on one rank (and read whole by
every rank on resume) it does not fit a node's host memory, its shards do.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from grl.rng import rng_state, set_rng_state
from grl.workers import fsdp, lora

SHARDS_DIR, STATE_FILE = "dcp", "state.pt"
OLD_MODEL_FILE = "model.pt"  # the full-state format before sharded checkpoints


def rng_file(rank: int) -> str:
    return f"rng_rank{rank}.pt"


def sharded_state(module: torch.nn.Module, optimizer: torch.optim.Optimizer, adapter_only: bool) -> dict:
    """{"model", "optim"}: this rank's shards (DTensors that alias the live parameters and
    optimizer state; nothing is gathered). `adapter_only`: a LoRA run keeps the adapter."""
    model, optim = get_state_dict(module, optimizer, options=StateDictOptions(full_state_dict=False))
    return {"model": lora.adapter_state(model) if adapter_only else model, "optim": optim}


def local_tensors(state):
    """The same nested state with each DTensor replaced by this rank's local shard."""
    if isinstance(state, DTensor):
        return state.to_local()
    if isinstance(state, dict):
        return {k: local_tensors(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(local_tensors(v) for v in state)
    return state


def refuse_non_finite(role: str, states: dict[str, dict]) -> None:
    """Collective: every rank checks its own shards of each state; if any rank finds NaN/inf,
    every rank raises the same error together (none is left waiting in the next collective)."""
    bad = {what: fsdp.non_finite_entries(local_tensors(state)) for what, state in states.items()}
    counts = fsdp.all_reduce_sum([len(names) for names in bad.values()])
    if any(counts):
        what = list(states)[next(i for i, c in enumerate(counts) if c)]
        first = f", first {bad[what][0]}" if bad[what] else ""
        raise ValueError(
            f"refusing to save the {role} {what}: {int(sum(counts))} tensor shard(s) hold NaN/inf{first}"
        )


def save(folder: str | Path, role: str, module, optimizer, adapter_only: bool, trainer_state: dict) -> None:
    """Collective. `trainer_state` (scheduler, world size) goes to state.pt from rank 0."""
    folder = Path(folder)
    state = sharded_state(module, optimizer, adapter_only)
    refuse_non_finite(role, {"weights": state["model"], "optimizer state": state["optim"]})
    dcp.save(state, checkpoint_id=folder / SHARDS_DIR)  # makes the folders; rank 0 writes .metadata last
    if dist.get_rank() == 0:
        torch.save(trainer_state, folder / STATE_FILE)
    torch.save(rng_state(), folder / rng_file(dist.get_rank()))
    dist.barrier()  # the checkpoint is complete when every rank returns


class _ReadMeter(DefaultLoadPlanner):
    """The default plan, and the bytes it makes this rank read from storage."""

    bytes_read = 0

    def finish_plan(self, new_plan):
        plan = super().finish_plan(new_plan)
        self.bytes_read = sum(self.metadata.storage_data[item.storage_index].length for item in plan.items)
        return plan


def refuse_old_format(folder: str | Path) -> None:
    """One clear line for a checkpoint of the full-state format this version no longer reads."""
    folder = Path(folder)
    if (folder / OLD_MODEL_FILE).is_file() and not (folder / SHARDS_DIR).is_dir():
        raise ValueError(
            f"{folder}: a checkpoint of the old full-state format ({OLD_MODEL_FILE}); this version "
            f"resumes only sharded checkpoints ({SHARDS_DIR}/): start from its hf export or retrain"
        )


def check_format(folder: str | Path) -> None:
    refuse_old_format(folder)
    if not (Path(folder) / SHARDS_DIR / ".metadata").is_file():
        raise FileNotFoundError(f"{folder}: not a sharded checkpoint (no {SHARDS_DIR}/.metadata)")


def load(folder: str | Path, module, optimizer, adapter_only: bool, world_size: int) -> tuple[dict, int]:
    """Collective: each rank reads its own shards into the live parameters and optimizer
    state. -> (state.pt's trainer state, bytes this rank read)."""
    folder = Path(folder)
    check_format(folder)
    trainer_state = torch.load(folder / STATE_FILE, weights_only=False)
    if trainer_state["world_size"] != world_size:
        # The shards would reshard, but each rank's RNG stream has no counterpart in another world size.
        raise ValueError(f"{folder}: saved by {trainer_state['world_size']} ranks, loading into {world_size}")
    state = sharded_state(module, optimizer, adapter_only)
    meter = _ReadMeter()
    dcp.load(state, checkpoint_id=folder / SHARDS_DIR, planner=meter)
    set_state_dict(
        module,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optim"],
        options=StateDictOptions(full_state_dict=False, strict=not adapter_only),
    )
    set_rng_state(torch.load(folder / rng_file(dist.get_rank()), weights_only=False))
    return trainer_state, meter.bytes_read


def saved_names(folder: str | Path) -> dict[str, list[str]]:
    """{"model": [...], "optim": [...]}: the tensor names a sharded checkpoint holds (from its metadata)."""
    metadata = dcp.FileSystemReader(str(Path(folder) / SHARDS_DIR)).read_metadata()
    names: dict[str, list[str]] = {"model": [], "optim": []}
    for key in metadata.state_dict_metadata:
        part, _, name = key.partition(".")
        names.setdefault(part, []).append(name)
    return names
