"""Memory planner: predicted memory per GPU (and per node's host) for each phase of a step.

Pure arithmetic over the model's config.json and the run config, nothing allocated (torch is asked only
which dtype `auto` computes in on this CPU). What the workers decide from the config (mixed precision,
offload) the planner asks their own functions (grl/workers/fsdp.py), so the two cannot disagree.
`grl plan <overrides>` prints the table; preflight runs it before Ray starts and stops a config that
does not fit with one line naming the phase and the key to change.

The formulas, one per kind of memory, and their notation: grl/planner/formulas.py.

bench/bench_plan_accuracy.py compares the CPU preset's prediction with the measured peak resident memory
of each phase (docs/PERFORMANCE.md, "Memory planner").
"""

from __future__ import annotations

from contextlib import contextmanager

from grl.config import RunSections
from grl.machine import MachineFacts
from grl.planner.engine_memory import add_engine
from grl.planner.formulas import (
    SCORE_LOGIT_COPIES,
    TRAIN_LOGIT_COPIES,
    element_bytes,
    forward_activations,
    gathered_bytes,
    logit_bytes,
    root_gradient_bytes,
    training_activations,
)
from grl.planner.shapes import ModelShape, model_shape
from grl.planner.table import GIB, Plan
from grl.run_plan import PHASES as STEP_PHASES
from grl.run_plan import RunPlan

# What NVML showed of each H100 process of the GPU kit's runs above its allocator's peak (2026-11-27/28,
# docs/PERFORMANCE.md): 1.6-2.2 GiB for the actor rank, 1.5-2.0 for the critic's. Measured at one model size:
# the allocator's reserve, a part of it, may grow with the model.
CUDA_PROCESS_GIB = (
    1.6  # CUDA context, cuBLAS and NCCL workspaces, the caching allocator's reserve: one process
)
CPU_RUNTIME_GIB = 0.5  # RSS of a worker process with torch, transformers, Ray and grl imported (0.45 GiB)
PHASES = tuple(phase for phase in STEP_PHASES if phase != "adv")  # the advantage's tensors are small


def sampled_per_episode(sections: RunSections) -> int:
    """Tokens the model writes in one episode at most: max_turns x tokens per reply, over the training
    tasks."""
    per_task = [
        sections.tasks[name].agent_config.max_turns
        * min(sections.tasks[name].agent_config.max_tokens, sections.data.max_response_length)
        for name in sections.rollout.training
    ]
    return max(per_task)


def what_if(gpu_memory_gib: float | None) -> MachineFacts:
    """A machine to plan for without one: a GPU of `gpu_memory_gib` with vLLM, or, without it, a CPU."""
    return MachineFacts(
        gpus=1 if gpu_memory_gib else 0, gpu_memory_gib=gpu_memory_gib, vllm_usable=bool(gpu_memory_gib)
    )


# ---------------------------------------------------------------- the planner


def plan(
    sections: RunSections,
    seq_len: int | None = None,
    sampled_tokens: int | None = None,
    rollout_agents: int | None = None,
    gpu_memory_gib: float | None = None,
    shape: ModelShape | None = None,
    run: RunPlan | None = None,
) -> Plan:
    """Predict every phase's memory for a config's typed sections (grl.config.run_sections). `seq_len`
    (default rollout.max_episode_length), `sampled_tokens` per episode and `rollout_agents` default to the
    config's worst case; `run` is the run plan the workers are built from (its device, engine and GPU
    memory resolved on the machine); without it the plan is for `what_if(gpu_memory_gib)` (default
    trainer.gpu_memory_gb)."""
    # The workers' own decisions, here and not at the top: importing grl.workers imports torch.
    from grl.workers import fsdp as fsdp_rules

    # The sections the worker groups build their ranks from (grl/workers/group.py), and the same plan.
    arr, critic_cfg, rollout_cfg = sections.actor_rollout_ref, sections.critic, sections.rollout
    if run is None:
        asked = gpu_memory_gib if gpu_memory_gib is not None else sections.trainer.gpu_memory_gb
        run = RunPlan.from_sections(sections, what_if(asked))
    shape = shape or model_shape(arr.model.path)
    gpu_memory_gib = gpu_memory_gib if gpu_memory_gib is not None else run.gpu_memory_gib
    device = run.device
    on_gpu = device == "cuda"
    per_node, world = sections.trainer.n_gpus_per_node, run.world_size
    s = seq_len or rollout_cfg.max_episode_length
    sampled = min(s, sampled_tokens or sampled_per_episode(sections))
    agents = rollout_agents or max(
        sum(n * k for n, k in zip(rollout_cfg.agent_group_num, rollout_cfg.agent_group_size)),
        sum(
            n * k
            for n, k in zip(rollout_cfg.validation_agent_group_num, rollout_cfg.validation_agent_group_size)
        ),
    )
    use_ref, use_critic = run.reference_model, run.use_critic
    engine = run.engine
    phases = tuple(p for p in PHASES if p in run.phases and (p != "ref" or use_ref))
    capacity = (
        gpu_memory_gib * GIB if on_gpu and gpu_memory_gib else _host_share(per_node) if not on_gpu else None
    )
    what = f"{world} x {'GPU' if on_gpu else 'CPU rank'}"
    where = " on a GPU of its own" if on_gpu and run.engine_apart else ""
    title = (
        f"memory plan: {arr.model.path} ({shape.params / 1e9:.2f} B parameters), {what}, micro-batch "
        f"{arr.actor.ppo_micro_batch_size_per_gpu} x {s} tokens ({sampled} sampled), engine {engine}{where}"
    )
    p = Plan(title, phases, capacity, "GPU" if on_gpu else "CPU rank")

    # One table row per place: on a GPU machine offloaded state is host memory, for all ranks of the node.
    def state(component, nbytes, offloaded, phases_=None, fix=""):
        if offloaded and on_gpu:
            p.add("host", component, nbytes * per_node, phases_)
        else:
            p.add("device", component, nbytes, phases_, fix)

    if on_gpu:
        p.add("host", "runtime (worker processes)", CPU_RUNTIME_GIB * GIB * per_node * (1 + use_critic))
    else:
        p.add("device", "runtime (interpreter, libraries)", CPU_RUNTIME_GIB * GIB * (1 + use_critic))
    critic_share = dict.fromkeys(p.phases, 0.0)  # what the critic's process allocates, per phase

    @contextmanager
    def the_critic_s():
        before = {x: p.device_total(x) for x in p.phases}
        yield
        for x in p.phases:
            critic_share[x] += p.device_total(x) - before[x]

    def role(name, key, model, fsdp_config, params, update, adapter=0, value_head=False, cached=False) -> int:
        """A trained model's rows: master weights, AdamW state and gradients of its `params` (of its
        `adapter` alone when it has one: a LoRA policy's root is frozen), and FSDP2's unsharded root
        gradients; returns its compute element's bytes."""
        e = element_bytes(model.dtype, device)
        mixed = fsdp_rules.mixed_precision(fsdp_config, model.dtype, device)
        m = 4 if mixed else e
        offload = fsdp_rules.offloaded(fsdp_config)
        fix = (
            f"{key}.fsdp_config.optimizer_offload=true" if not offload else f"n_gpus_per_node={2 * per_node}"
        )
        trained = adapter or params
        state(f"{name} weights (master)", params * m / world, offload, fix=fix)
        state(f"{name} optimizer (AdamW m, v)", 2 * trained * m / world, offload, fix=fix)
        state(f"{name} gradients", trained * m / world, offload, [update], fix=fix)
        if not adapter:
            root = root_gradient_bytes(shape, mixed, e, value_head=value_head)
            p.add("device", "unsharded root gradients", root, [update], cached=cached)
        return e

    # Actor: master weights, AdamW state, gradients; what its passes gather and keep.
    adapter = shape.lora_params(arr.model.lora_rank) if arr.model.lora_rank > 0 else 0
    actor = arr.model, arr.actor.fsdp_config, shape.params, "update_actor"
    e = role("actor", "actor_rollout_ref.actor", *actor, adapter=adapter, cached=True)
    if use_ref:
        state(
            "ref weights",
            shape.params * e / world,
            fsdp_rules.offloaded(arr.ref.fsdp_config),
            fix="actor_rollout_ref.ref.fsdp_config.param_offload=true",
        )
    if use_critic:
        with the_critic_s():
            critic = critic_cfg.model, critic_cfg.fsdp_config, shape.value_params, "update_critic"
            ce = role("critic", "critic", *critic, value_head=True)
            p.add(
                "device",
                "gathered weights",
                gathered_bytes(shape, ce, value_head=True),
                ["values", "update_critic"],
            )
    p.add(
        "device",
        "gathered weights",
        gathered_bytes(shape, e),
        ["old_log_prob", "ref", "update_actor"],
        cached=True,
    )
    teacher = (
        model_shape(sections.teacher.model_path, "teacher.model_path") if run.teacher == "local" else None
    )
    if (
        teacher is not None
    ):  # frozen beside the reference, in the student's dtype, sharded and offloaded like it
        ref_offload = fsdp_rules.offloaded(arr.ref.fsdp_config)
        state("teacher weights", teacher.params * e / world, ref_offload, fix="teacher: a smaller model")
        p.add("device", "gathered weights", gathered_bytes(teacher, e), ["teacher"], cached=True)

    # Activations and the vocabulary-sized log-prob chunk of each pass.
    b_train, b_score = arr.actor.ppo_micro_batch_size_per_gpu, arr.rollout.log_prob_micro_batch_size_per_gpu
    b_ref, b_critic = arr.ref.log_prob_micro_batch_size_per_gpu, critic_cfg.ppo_micro_batch_size_per_gpu
    checkpointing = arr.model.enable_gradient_checkpointing
    act_fix = (
        "actor_rollout_ref.model.enable_gradient_checkpointing=true"
        if not checkpointing
        else f"micro_batch_size_per_gpu={max(b_train // 2, 1)}"
    )
    p.add(
        "device",
        "activations",
        forward_activations(shape, b_score, s, e),
        ["old_log_prob"],
        act_fix,
        cached=True,
    )
    p.add("device", "activations", forward_activations(shape, b_ref, s, e), ["ref"], cached=True)
    if teacher is not None:
        p.add("device", "activations", forward_activations(teacher, b_ref, s, e), ["teacher"], cached=True)
    p.add(
        "device",
        "activations",
        training_activations(shape, b_train, s, e, checkpointing),
        ["update_actor"],
        cached=True,
    )
    if use_critic:
        with the_critic_s():
            p.add("device", "activations", forward_activations(shape, b_critic, s, e), ["values"])
            p.add(
                "device",
                "activations",
                training_activations(shape, b_critic, s, e, critic_cfg.model.enable_gradient_checkpointing),
                ["update_critic"],
            )
    chunk = arr.actor.logits_chunk_size
    chunk_fix = f"actor_rollout_ref.actor.logits_chunk_size={max(chunk // 2, 1)}"
    for phase, b, copies, scorer in (
        ("old_log_prob", b_score, SCORE_LOGIT_COPIES, shape),
        ("ref", b_ref, SCORE_LOGIT_COPIES, shape),
        ("teacher", b_ref, SCORE_LOGIT_COPIES, teacher),
        ("update_actor", b_train, TRAIN_LOGIT_COPIES, shape),
    ):
        if scorer is None:
            continue
        p.add(
            "device",
            "log-prob chunk",
            logit_bytes(scorer, min(chunk, b * sampled), copies),
            [phase],
            chunk_fix,
            cached=True,
        )

    separate = run.engine_apart
    kv = run.kv_cache_gib
    add_engine(p, sections.data, arr.rollout, shape, engine, on_gpu, per_node, e, agents, s, separate, kv)

    # Weight sync: a stream (grl/workers/streaming.py) gathers one parameter at a time, cast to the
    # engine's dtype first; the gathered tensor and the engine's copy of it are alive together.
    p.add(
        "device",
        "sync buffers (largest parameter, twice)",
        2 * shape.largest_param * e,
        ["sync_weights"],
        cached=True,
    )
    if on_gpu and use_critic:
        # The engine's sleep empties the actor's cache after the rollout (vLLM's CuMemAllocator.sleep,
        # the hf engine's sleep); a process without an engine keeps the sync's blocks too.
        emptied = arr.rollout.free_cache_engine and not separate
        passes = [
            x
            for x in ("old_log_prob", "ref", "teacher", *(() if emptied else ("sync_weights",)))
            if x in p.phases
        ]
        held = max(sum(p.device.get(name, {}).get(x, 0.0) for name in p.cached) for x in passes)
        p.add("device", "cached by the actor's process", held, ["values", "update_critic"])
    if on_gpu:
        shares = {"actor": {x: p.device_total(x) - critic_share[x] for x in p.phases}}
        if use_critic:
            shares["critic"] = critic_share
        for name, share in shares.items():  # one such process a GPU
            p.add(
                "device", f"runtime: {name} process (CUDA context, allocator reserve)", CUDA_PROCESS_GIB * GIB
            )
            p.processes[name] = {x: share[x] + CUDA_PROCESS_GIB * GIB for x in p.phases}
    return p


def _host_share(ranks_per_node: int) -> float | None:
    """On CPU the 'device' is host memory, shared by the node's ranks."""
    try:
        import psutil
    except ImportError:
        return None
    return psutil.virtual_memory().total / max(ranks_per_node, 1)


def plan_run(sections: RunSections, run: RunPlan | None = None, **shapes) -> Plan:
    """The plan of a run as configured, on this machine unless `run` (the builder's plan) is given."""
    return plan(sections, run=run or RunPlan.from_sections(sections), **shapes)
