"""FSDP2 plumbing used inside one worker rank: process group, sharding,
optimizer and warmup schedule, full state dicts, RNG state and the
non-finite checks that guard checkpoints."""

from __future__ import annotations

import logging
import os
import random
import socket

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

log = logging.getLogger("grl.workers")


def node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def init_process_group(rank: int, world_size: int, master_addr: str, master_port: int, device: str) -> None:
    os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK="0")
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(0)  # Ray gives each rank one visible GPU
    dist.init_process_group(backend, rank=rank, world_size=world_size)


def shard(module: nn.Module, layers: list[nn.Module], device: str, mixed_precision: bool,
          offload: bool, role: str) -> torch.dtype:
    """FSDP2 in place: every decoder layer, then the root. Returns the dtype
    the forward computes in. `mixed_precision` (bf16 compute, fp32 master
    weights and gradient reduction) is the GPU default; the caller asks for it
    on CPU only when the model dtype is bf16 (CPUs with AMX run it 2-5x faster)."""
    from torch.distributed.fsdp import (
        CPUOffloadPolicy,
        MixedPrecisionPolicy,
        fully_shard,
    )

    kwargs = {}
    compute_dtype = next(module.parameters()).dtype
    if mixed_precision:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        compute_dtype = torch.bfloat16
    if device == "cuda":
        if offload:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    else:
        if offload:
            log.info("%s: parameter/optimizer offload is a no-op on CPU (everything is already in host memory)", role)
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(module, **kwargs)
    return compute_dtype


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    layers = getattr(model.base_model, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no `layers` list on its base model; cannot shard it layer by layer")
    return list(layers)


def make_optimizer(params, optim_cfg) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=float(optim_cfg.lr), betas=tuple(float(b) for b in optim_cfg.betas),
                             weight_decay=float(optim_cfg.weight_decay))


def make_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over `warmup_steps` optimizer steps, then constant. Step k
    (0-based) uses lr * (k + 1) / warmup_steps, so the first step already learns."""
    warmup = max(int(warmup_steps), 0)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / warmup) if warmup else 1.0)


def full_state_dict(module: nn.Module, on_all_ranks: bool = False) -> dict[str, torch.Tensor]:
    """Gathered weights on CPU (collective: every rank must call). Only rank 0
    gets them unless `on_all_ranks`. The tensors may alias live parameters or
    FSDP's gather buffers: use (save, copy) them before the next forward or step."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=not on_all_ranks)
    return get_model_state_dict(module, options=options)


def full_optimizer_state(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    return get_optimizer_state_dict(module, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_full_state(module: nn.Module, optimizer: torch.optim.Optimizer | None, model_state: dict,
                    optim_state: dict | None) -> None:
    """Every rank passes the full (unsharded) dicts; each keeps its shard."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(module, model_state, options=options)
    if optimizer is not None and optim_state is not None:
        set_optimizer_state_dict(module, optimizer, optim_state, options=options)


def non_finite_entries(state, prefix: str = "") -> list[str]:
    """Names of floating tensors in a nested dict/list that hold NaN or inf."""
    bad = []
    if isinstance(state, torch.Tensor):
        if state.is_floating_point() and not bool(torch.isfinite(state).all()):
            bad.append(prefix or "<tensor>")
    elif isinstance(state, dict):
        for key, value in state.items():
            bad += non_finite_entries(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(state, (list, tuple)):
        for i, value in enumerate(state):
            bad += non_finite_entries(value, f"{prefix}[{i}]")
    return bad


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def all_reduce_sum(values: list[float]) -> list[float]:
    """Sum a few scalars over the ranks (float64 so counts stay exact)."""
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()
