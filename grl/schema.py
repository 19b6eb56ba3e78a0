"""The config's typed schema: one dataclass per section, holding types only (the values live in
configs/*.yaml). `grl.config` merges a composed config into `GRLConfig`, and each task instance
block of configs/agents.yaml into `TaskInstance`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING


@dataclass
class RewardNormalization:
    grouping: str = MISSING
    method: str = MISSING


@dataclass
class Rollout:
    training: list[str] = MISSING
    agent_group_num: list[int] = MISSING
    agent_group_size: list[int] = MISSING
    validation: list[str] = MISSING
    validation_agent_group_num: list[int] = MISSING
    validation_agent_group_size: list[int] = MISSING
    validation_seed: int = MISSING
    seed: int = MISSING
    truncation: str = MISSING
    use_turn_scores: bool = MISSING
    rollout_filter_ratio: float = MISSING
    rollout_filter_type: str = MISSING
    reward_normalization: RewardNormalization = MISSING
    max_episode_length: int = MISSING
    packing: bool = MISSING
    env_workers: int = MISSING
    env_step_timeout: float = MISSING
    env_error_penalty: Optional[float] = MISSING
    max_failed_agent_ratio: float = MISSING
    num_env_threads: Optional[int] = None
    num_init_threads: Optional[int] = None
    num_prompt_threads: int = 0
    show_tqdm: bool = False


@dataclass
class Model:
    path: str = MISSING
    dtype: str = MISSING
    enable_gradient_checkpointing: bool = MISSING
    trust_remote_code: bool = False
    lora_rank: int = 0  # the policy's; 0 = full fine-tuning
    lora_alpha: float = 16.0
    target_modules: Any = "all-linear"  # peft's: "all-linear" or a list of module names


@dataclass
class Optim:
    lr: float = MISSING
    lr_warmup_steps: int = MISSING
    betas: list[float] = MISSING
    weight_decay: float = MISSING


@dataclass
class FSDPConfig:
    param_offload: bool = MISSING
    optimizer_offload: bool = False
    mixed_precision: bool = True


@dataclass
class Actor:
    strategy: str = MISSING
    ppo_mini_batch_size: int = MISSING
    ppo_micro_batch_size_per_gpu: int = MISSING
    ppo_epochs: int = MISSING
    shuffle: bool = MISSING
    grad_clip: float = MISSING
    clip_ratio_low: float = MISSING
    clip_ratio_high: float = MISSING
    clip_ratio_c: float = MISSING
    loss_agg_mode: str = MISSING
    entropy_coeff: float = MISSING
    use_kl_loss: bool = MISSING
    kl_loss_coef: float = MISSING
    kl_loss_type: str = MISSING
    tis_imp_ratio_cap: float = -1.0
    logits_chunk_size: int = MISSING
    optim: Optim = MISSING
    fsdp_config: FSDPConfig = MISSING


@dataclass
class Ref:
    log_prob_micro_batch_size_per_gpu: int = MISSING
    fsdp_config: FSDPConfig = MISSING


@dataclass
class SamplingOverrides:
    do_sample: bool = MISSING
    temperature: float = MISSING
    top_p: float = MISSING
    top_k: int = MISSING


@dataclass
class RolloutEngine:
    name: str = MISSING
    temperature: float = MISSING
    top_p: float = MISSING
    top_k: int = MISSING
    prompt_length: int = MISSING
    response_length: int = MISSING
    gpu_memory_utilization: float = MISSING
    enforce_eager: bool = MISSING
    free_cache_engine: bool = MISSING
    tensor_model_parallel_size: int = MISSING
    max_model_len: Optional[int] = MISSING
    log_prob_micro_batch_size_per_gpu: int = MISSING
    rollout_filter_ratio: float = MISSING
    rollout_filter_type: str = MISSING
    val_kwargs: SamplingOverrides = MISSING


@dataclass
class ActorRolloutRef:
    hybrid_engine: bool = MISSING
    nccl_timeout: float = MISSING
    model: Model = MISSING
    actor: Actor = MISSING
    ref: Ref = MISSING
    rollout: RolloutEngine = MISSING


@dataclass
class Critic:
    enable: bool = MISSING
    nccl_timeout: float = MISSING
    model: Model = MISSING
    ppo_mini_batch_size: int = MISSING
    ppo_micro_batch_size_per_gpu: int = MISSING
    ppo_epochs: int = MISSING
    cliprange_value: float = MISSING
    grad_clip: float = MISSING
    optim: Optim = MISSING
    fsdp_config: FSDPConfig = MISSING


@dataclass
class KLControl:
    type: str = MISSING
    kl_coef: float = MISSING
    horizon: int = MISSING
    target_kl: float = MISSING


@dataclass
class Algorithm:
    adv_estimator: str = MISSING
    gamma: float = MISSING
    lam: float = MISSING
    high_level_gamma: float = MISSING
    turn_advantage_weight: float = MISSING
    gigpo_step_weight: float = MISSING
    norm_adv_by_std_in_grpo: bool = MISSING
    kl_penalty: str = MISSING
    use_kl_in_reward: bool = MISSING
    kl_ctrl: KLControl = MISSING


@dataclass
class Trainer:
    project_name: str = MISSING
    experiment_name: str = MISSING
    logger: list[str] = MISSING
    nnodes: int = MISSING
    n_gpus_per_node: int = MISSING
    device: str = MISSING
    gpu_memory_gb: Optional[float] = None  # GiB per GPU for the memory planner; None: the device's own
    ray_address: Optional[str] = MISSING
    total_training_steps: int = MISSING
    test_freq: int = MISSING
    save_freq: int = MISSING
    val_before_train: bool = MISSING
    val_only: bool = False
    validation_steps: int = 1
    validation_controls: list[str] = MISSING
    resume_mode: str = MISSING
    resume_from_path: Optional[str] = None
    default_local_dir: str = MISSING
    run_dir: str = MISSING
    max_ckpt_to_keep: Optional[int] = MISSING
    export_hf: bool = MISSING
    critic_warmup: int = MISSING
    seed: int = MISSING


@dataclass
class Data:
    max_prompt_length: int = MISSING
    max_response_length: int = MISSING
    train_batch_size: Optional[int] = MISSING


@dataclass
class System:
    CUDA_VISIBLE_DEVICES: Optional[str] = None


@dataclass
class PythonSandbox:  # grl.tools.SandboxLimits holds the meaning of each key
    wall_s: float = MISSING
    cpu_s: int = MISSING
    memory_mb: int = MISSING
    max_processes: int = MISSING
    max_file_mb: int = MISSING
    max_dir_mb: int = MISSING
    max_open_files: int = MISSING
    max_output_bytes: int = MISSING
    isolate_network: bool = MISSING


@dataclass
class Tools:
    python: PythonSandbox = MISSING


@dataclass
class GRLConfig:
    model_path: str = MISSING
    max_prompt_length: int = MISSING
    max_response_length: int = MISSING
    train_batch_size: Optional[int] = MISSING
    ppo_mini_batch_size: int = MISSING
    micro_batch_size_per_gpu: int = MISSING
    total_training_steps: int = MISSING
    n_gpus_per_node: int = MISSING
    nnodes: int = MISSING
    test_freq: int = MISSING
    save_freq: int = MISSING
    gpu_memory_utilization: float = MISSING
    project_name: str = MISSING
    experiment_name: str = MISSING
    resume_mode: str = MISSING
    data: Data = MISSING
    system: System = field(default_factory=System)
    tools: Tools = MISSING
    rollout: Rollout = MISSING
    actor_rollout_ref: ActorRolloutRef = MISSING
    critic: Critic = MISSING
    algorithm: Algorithm = MISSING
    trainer: Trainer = MISSING


def _agent_default(name: str) -> Any:
    from grl.agents.base import AgentSettings

    return AgentSettings.__dataclass_fields__[name].default


@dataclass
class AgentConfig:
    """`agent_config` of a task instance in configs/agents.yaml."""

    # A key left out takes GRL's default (grl.agents.base.AgentSettings holds the values).
    system_prompt: str = _agent_default("system_prompt")
    prompt: str = _agent_default("prompt")
    enable_think: bool = _agent_default("enable_think")
    max_tokens: int = _agent_default("max_tokens")
    max_turns: int = _agent_default("max_turns")
    max_actions_per_turn: int = _agent_default("max_actions_per_turn")
    max_actions_all_turns: int = _agent_default("max_actions_all_turns")
    format_penalty: float = _agent_default("format_penalty")
    action_separator: Optional[str] = _agent_default("action_separator")
    action_decoding: str = _agent_default("action_decoding")  # free | constrained (env's valid_actions())
    tools: list[str] = field(default_factory=list)  # e.g. [python]: tools the model may call (grl/tools)
    max_tool_calls_per_turn: int = _agent_default("max_tool_calls_per_turn")
    max_tool_calls: int = _agent_default("max_tool_calls")
    max_tool_output_chars: int = _agent_default("max_tool_output_chars")
    max_context_window: int = _agent_default("max_context_window")  # past turns shown; -1: all


@dataclass
class TaskInstance:
    agent_type: str = MISSING
    agent_config: AgentConfig = MISSING
    env_config: dict[str, Any] = field(default_factory=dict)
