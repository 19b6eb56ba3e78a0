"""The memory planner's formulas (grl/planner/memory.py applies them phase by phase): bytes of each kind
of memory a step holds, from the model's shape and the run's sizes.

Notation: P parameters (embedding, untied head, L decoder layers of hidden h, MLP width i, q = heads x
head_dim, kv = kv_heads x head_dim, vocabulary V); W ranks (GPUs) per role; e bytes per compute element
(2 for bf16); m bytes per master element (4 under mixed precision, else e); b micro-batch episodes; s
tokens per episode; n = b x s tokens in a micro-batch.

  weights      actor P*m/W (FSDP2 shards), ref P*e/W, critic Pc*m/W (Pc: the backbone and a 1-wide head)
  optimizer    AdamW m and v: 2*P*m/W, from the first update on; the fp32 master weights are the shards above
               (a LoRA policy: 2*A*m/W and gradients A*m/W for its adapter's A parameters, all-linear)
  gradients    P*m/W, during the role's update only; and the FSDP2 root's (embedding, final norm, head:
               R parameters) unsharded until the backward ends, R*(c+m) with c the compute dtype's
               bytes: FSDP2 reduce-scatters the root last, from a copy in the reduce dtype
  offload      (fsdp_config.optimizer_offload or param_offload, for the ref too) moves weights, gradients
               and optimizer state to pinned host memory; each forward then gathers onto the GPU what it needs
  gathered     a forward holds the FSDP root (embedding, head: V*h*e each) and two decoder layers
               (the current and the prefetched one) unsharded in the compute dtype
  activations  with gradient checkpointing L*n*h*e (each layer's input) plus one layer's saved tensors;
               without it L layers' saved tensors. One layer saves per token: two RMSNorms
               2*(4h + e*h) (fp32 upcast), attention 4*e*q (q, k and v repeated to every head under a
               padding mask, and the output), MLP 4*e*i (gate, up, silu, product); plus the n*s*e mask
  log-probs    one chunk of min(logits_chunk_size, sampled tokens) rows of V fp32 logits; 5 copies live
               while scoring (logits, /T, softmax, entropy terms), 8 in training (and their gradient)
  engine       vLLM takes gpu_memory_utilization of the GPU while it generates (weights, KV cache, CUDA
               graphs). Asleep (free_cache_engine) it keeps only its CUDA graph pool (CUDA_GRAPH_GIB, when
               enforce_eager is false), its weights P*e go to host, and they come back for the weight sync.
               The hf engine holds P*e and a KV cache of agents x c x L x 2*kv*e, c = min(s, prompt +
               response length), three times: the previous turn's prefixes, this turn's cache and the
               prefixes it keeps for the next turn. With hybrid_engine=false the engine is a rollout worker
               of its own: on a GPU of its own (nothing on the actor's), on CPU a process on the host
  weight sync  the actor streams its weights one parameter at a time in the engine's dtype: twice the
               largest parameter (the embedding, V*h*e) is alive at once. To a rollout worker of its own
               rank 0 alone collects them, P*e on its host, and puts them in Ray's object store (P*e)
  cached       the actor's and the critic's ranks are two processes on one GPU, each with its own caching
               allocator. The actor hands its blocks back after its update and when its engine sleeps;
               while the critic scores and trains, the actor's process still holds the blocks of its
               largest pass since (gathered weights, activations, log-prob chunk, sync buffers). A colocated
               vLLM's own forward buffers are inside gpu_memory_utilization while it is awake, and its
               sleep hands them back
  runtime      on a GPU, each process (the actor with its engine, the critic) beyond what it allocates:
               CUDA_PROCESS_GIB (context, cuBLAS and NCCL workspaces, the caching allocator's reserve),
               calibrated on the H100 kit runs (NVML per process); on CPU each worker process's interpreter,
               torch, transformers and Ray (CPU_RUNTIME_GIB, measured)
"""

from __future__ import annotations

from grl.planner.shapes import ModelShape

SCORE_LOGIT_COPIES, TRAIN_LOGIT_COPIES = 5, 8  # fp32 logit copies alive while scoring, and while training


def element_bytes(dtype: str, device: str) -> int:
    """Bytes of the compute dtype, as the workers will resolve it (grl.compute.torch_dtype)."""
    from grl.compute import torch_dtype

    return torch_dtype(dtype, device).itemsize


def layer_activations(shape: ModelShape, tokens: int, e: int) -> float:
    """Tensors one decoder layer saves for backward (see the module docstring)."""
    h = shape.hidden
    return tokens * (2 * (4 * h + e * h) + 4 * e * shape.q + 4 * e * shape.intermediate)


def training_activations(shape: ModelShape, b: int, s: int, e: int, checkpointing: bool) -> float:
    n, mask = b * s, b * s * s * e
    if checkpointing:
        return shape.layers * n * shape.hidden * e + layer_activations(shape, n, e) + mask
    return shape.layers * layer_activations(shape, n, e) + mask


def forward_activations(shape: ModelShape, b: int, s: int, e: int) -> float:
    """Without grad a layer's tensors die with it: one layer's worth is alive at a time."""
    return layer_activations(shape, b * s, e) + b * s * s * e


def logit_bytes(shape: ModelShape, rows: int, copies: int) -> float:
    return rows * shape.vocab * 4 * copies


def root_gradient_bytes(shape: ModelShape, mixed: bool, e: int, value_head: bool = False) -> float:
    """The FSDP2 root's gradients at the end of a backward. The root's inputs (token ids) need no
    gradient, so torch 2.13 runs its post-backward in the final callback (_fully_shard/_fsdp_state.py,
    _root_post_backward_final_callback): its gradients stay unsharded in the compute dtype (bf16
    under mixed precision) until then, and foreach_reduce (_fsdp_collectives.py) copies them into a
    reduce-scatter buffer of the reduce dtype (fp32 under mixed precision) before freeing them."""
    compute, reduce = (2, 4) if mixed else (e, e)
    return shape.root_params(value_head) * (compute + reduce)


def gathered_bytes(shape: ModelShape, e: int, value_head: bool = False) -> float:
    """The FSDP2 root (embedding and head) and two decoder layers, unsharded in the compute dtype."""
    root = shape.embedding * (1 if shape.tied or value_head else 2)
    return (root + 2 * shape.layer_params) * e
