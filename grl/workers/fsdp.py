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


LOOPBACK = "127.0.0.1"


def node_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


def listen_for_peers(host: str) -> socket.socket:
    """Rank 0's rendezvous socket, bound to `host` only and held until the store takes it over:
    torch's TCPStore left to itself listens on every interface, and a port picked and then closed
    can be taken by another process before the store binds it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(128)
    return sock


def interface_of(ip: str) -> str | None:
    """The network interface that holds `ip` on this machine."""
    import psutil

    return next(
        (
            name
            for name, addrs in psutil.net_if_addrs().items()
            if any(a.family == socket.AF_INET and a.address == ip for a in addrs)
        ),
        None,
    )


def process_group_backend(device: str) -> str:
    """torch.distributed backend per device type. On GPU the group needs gloo beside NCCL:
    offloaded parameter shards, their gradients and the optimizer state live in host memory,
    and collectives over them (the gradient-norm all-reduce of clip_grad_norm_) run on the
    CPU tensors' backend; an NCCL-only group has none (pytorch/pytorch#148532)."""
    return "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"


def state_device(device: str, offload: bool) -> str:
    """Where FSDP2 keeps a rank's parameter shards, their gradients and the optimizer state:
    CPUOffloadPolicy moves shards and reduced gradients to the host, and AdamW creates its
    state beside the parameters."""
    return "cpu" if offload else device


def mixed_precision(fsdp_cfg, model_dtype: str, device: str) -> bool:
    """Whether a trained model keeps fp32 master weights and computes in bf16: always on GPU, and
    on CPU when the model dtype asks for bf16 (fp32 CPU runs, the tests' among them, stay exact).
    The workers build by it and the memory planner (grl/planner/memory.py) sizes by it."""
    from grl.compute import torch_dtype

    return fsdp_cfg.mixed_precision and (
        device == "cuda" or torch_dtype(model_dtype, device) == torch.bfloat16
    )


def offloaded(fsdp_cfg) -> bool:
    """Whether a model's shards live in host memory (`state_device`). FSDP2 has one switch,
    CPUOffloadPolicy, for parameters, gradients and optimizer state together, so either key turns
    it on, for the frozen reference as for a trained model."""
    return fsdp_cfg.param_offload or fsdp_cfg.optimizer_offload


def init_process_group(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    device: str,
    timeout_s: float,
    listening: socket.socket | None = None,
) -> None:
    """Join the group whose rank 0 listens at master_addr:master_port (`listening`: rank 0's socket,
    from `listen_for_peers`). A group on one node talks over the loopback interface only: its
    rendezvous store, gloo's and NCCL's sockets are not reachable from the network."""
    from datetime import timedelta

    timeout = timedelta(seconds=timeout_s)
    os.environ.update(
        MASTER_ADDR=master_addr,
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK="0",
    )
    # gloo and NCCL's bootstrap otherwise pick an interface from the hostname, which may resolve to the
    # loopback address on a machine of a cluster, or to the network on a machine running alone.
    if interface := interface_of(LOOPBACK if master_addr == LOOPBACK else node_ip()):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", interface)
    if device == "cuda":
        torch.cuda.set_device(0)  # Ray gives each rank one visible GPU
    fd = listening.detach() if listening is not None else None
    store = dist.TCPStore(
        master_addr, master_port, world_size, is_master=rank == 0, timeout=timeout, master_listen_fd=fd
    )
    dist.init_process_group(
        process_group_backend(device), store=store, rank=rank, world_size=world_size, timeout=timeout
    )


def shard(
    module: nn.Module, layers: list[nn.Module], device: str, mixed_precision: bool, offload: bool, role: str
) -> torch.dtype:
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
    if state_device(device, offload) != device:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    elif offload:
        log.info(
            "%s: parameter/optimizer offload is a no-op on CPU (everything is already in host memory)", role
        )
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(module, **kwargs)
    return compute_dtype


def empty_model(head, path: str, dtype: torch.dtype) -> nn.Module:
    """The model's modules with every tensor on the meta device (no memory): what each rank
    shards before rank 0's weights arrive. `head`: grl.workers.heads.POLICY or VALUE, whose
    transformers class and config build it as the head's `load` does."""
    from transformers import AutoConfig

    from grl.models import resolve_model_path

    config = AutoConfig.from_pretrained(resolve_model_path(path), **head.config_kwargs)
    with torch.device("meta"):
        return head.model_class().from_config(config, dtype=dtype)


def load_from_rank0(module: nn.Module, source: nn.Module | None, device: str, offload: bool) -> None:
    """Give a sharded meta-device `module` memory and rank 0's weights (collective). `source`
    is the same model loaded in rank 0's host memory (None elsewhere): its tensors go out one
    at a time and each rank keeps its shard, so no rank ever holds the whole model on the device
    and the host holds one copy, not one per rank."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
    )

    module.to_empty(device=state_device(device, offload))
    if (
        state_device(device, offload) != device
    ):  # buffers are not sharded: the forward needs them on the device
        for sub in module.modules():
            for name, buf in sub.named_buffers(recurse=False):
                sub._buffers[name] = torch.empty_like(buf, device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(module, source.state_dict() if source is not None else {}, options=options)
    # The state dict leaves out non-persistent buffers (the rotary frequencies): rank 0 sends its own.
    reference = dict(source.named_buffers()) if source is not None else {}
    with torch.no_grad():
        for name, buf in module.named_buffers():
            if source is not None:
                buf.copy_(reference[name])
            dist.broadcast(buf, src=0)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    layers = getattr(model.base_model, "layers", None)
    if layers is None:
        raise ValueError(
            f"{type(model).__name__}: no `layers` list on its base model; cannot shard it layer by layer"
        )
    return list(layers)


def make_optimizer(params, optim_cfg) -> torch.optim.Optimizer:
    params = list(params)
    # On CPU (a CPU run, or FSDP2 offload) torch's fused kernel steps 135M parameters in 0.08 s where
    # its default (foreach) takes 0.45 s on 2 cores; on GPU torch picks its own default.
    fused = True if params and all(p.device.type == "cpu" for p in params) else None
    return torch.optim.AdamW(
        params,
        lr=optim_cfg.lr,
        betas=tuple(optim_cfg.betas),
        weight_decay=optim_cfg.weight_decay,
        fused=fused,
    )


def make_scheduler(optimizer: torch.optim.Optimizer, warmup_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over `warmup_steps` optimizer steps, then constant. Step k
    (0-based) uses lr * (k + 1) / warmup_steps, so the first step already learns."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: min(1.0, (k + 1) / warmup_steps) if warmup_steps else 1.0
    )


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

    return get_optimizer_state_dict(
        module, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )


def load_full_state(
    module: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model_state: dict,
    optim_state: dict | None,
    strict: bool = True,
) -> None:
    """Every rank passes the full (unsharded) dicts; each keeps its shard. Not
    `strict`: `model_state` may hold a subset (a LoRA checkpoint's adapter)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, strict=strict)
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


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _scalar_device() -> str:
    return "cuda" if "nccl" in dist.get_backend() else "cpu"


def all_reduce_sum(values: list[float]) -> list[float]:
    """Sum a few scalars over the ranks (float64 so counts stay exact)."""
    t = torch.tensor(values, dtype=torch.float64, device=_scalar_device())
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_max(values: list[float]) -> list[float]:
    """The largest of a few scalars over the ranks."""
    t = torch.tensor(values, dtype=torch.float64, device=_scalar_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()
