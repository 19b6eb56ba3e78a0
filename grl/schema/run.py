"""The run config: the shorthands GRL users set, the rollout, the algorithm and the trainer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import II

from grl.schema.certificate import Certificate
from grl.schema.keys import key, section
from grl.schema.teacher import Teacher
from grl.schema.workers import KL_ESTIMATORS, ActorRolloutRef, Critic


VALIDATION_CONTROLS = ("swap",)  # grl.agents.controls.VALIDATION_CONTROLS
OPD_DIVERGENCES = ("reverse", "forward")  # grl/algo/distill.py: on-policy distillation's two advantages


@dataclass
class RewardNormalization:
    grouping: str = key(
        "state", "the episodes whose scores are normalised together", choices=("state", "batch", "inductive")
    )
    method: str = key("identity", "how scores are normalised", choices=("identity", "mean_std", "asym_clip"))


@dataclass
class Curriculum:
    env_key: Optional[str] = key(
        None,
        "env_config key of the training tasks that the curriculum sets (e.g. tetris "
        "dim_x, sokoban solution_moves); null: no curriculum",
    )
    levels: list[Any] = key(
        [],
        "the key's values, easiest first; training moves on to the next when it succeeds "
        "and stays at the last (validation always plays the task as its block sets it)",
    )
    promote_at: float = key(
        0.6,
        "training success, averaged over the last `window` steps of a stage, that moves to the next value",
        gt=0,
        le=1,
    )
    window: int = key(2, "steps a stage's success is averaged over (the fewest steps a stage lasts)", ge=1)
    max_turns: list[int] = key(
        [],
        "each stage's cap on a training episode's replies, one per level (a failed attempt at an easy "
        "level costs the rollout and the update no more turns than it needs); empty: the tasks' max_turns",
        ge=1,
    )


@dataclass
class Rollout:
    training: list[str] = key(["simpleSokobanAgent"], "training task instances (configs/agents.yaml)")
    agent_group_num: list[int] = key([8], "groups per training task; a group shares one seed", ge=1)
    agent_group_size: list[int] = key([16], "agents per group", ge=1)
    validation: list[str] = key(["simpleSokobanAgent"], "validation task instances")
    validation_agent_group_num: list[int] = key([64], "groups per validation task", ge=1)
    validation_agent_group_size: list[int] = key([1], "agents per validation group", ge=1)
    validation_seed: int = key(123, "base seed of the validation games", ge=0)
    seed: int = key(
        II("trainer.seed"),
        "base seed of the training games (step s, group g -> seed + s * 100003 + g); trainer.seed seeds "
        "sampling",
    )
    truncation: str = key(
        "left",
        "what a prompt longer than max_prompt_length loses (error: stop)",
        choices=("left", "right", "error"),
    )
    use_turn_scores: bool = key(False, "reward on each turn's last token instead of the episode's")
    rollout_filter_ratio: float = key(1.0, "share of groups kept, by reward spread", gt=0, le=1)
    rollout_filter_type: str = key(
        "std", "std keeps the largest spread, std_rev the smallest", choices=("std", "std_rev")
    )
    top_up_rounds: int = key(
        0,
        "DAPO's dynamic sampling: up to this many extra rollouts of fresh puzzles a step, whose groups with "
        "reward "
        "spread replace groups whose attempts all scored alike (grl/rollout/dynamic_sampling.py)",
        ge=0,
        le=16,
    )
    reward_normalization: RewardNormalization = section(RewardNormalization)
    max_episode_length: int = key(
        4096, "tokens; a longer episode is dropped from the batch and counted", ge=1
    )
    packing: bool = key(
        False,
        "the ranks compute on episodes packed into rows (of at most max_episode_length tokens and twice "
        "the batch's longest episode), not on padded rows",
    )
    share_prompts: bool = key(
        True,
        "with packing, episodes that begin with the same prompt (a group's question or "
        "first observation) hold it once in their row: it is computed once, not once an episode",
    )
    turn_barrier: bool = key(
        True,
        "true: every agent of a training rollout takes its turn together; false: an "
        "agent asks for its next reply when its own env step returns, and each engine call "
        "serves whoever waits (uneven env or tool times); validation keeps the barrier",
    )
    curriculum: Curriculum = section(Curriculum)
    max_staleness: int = key(
        0,
        "policy versions a trained episode may lag: k > 0 generates the next k steps' "
        "episodes while the trainer updates (needs actor_rollout_ref.hybrid_engine=false and "
        "actor_rollout_ref.actor.tis_imp_ratio_cap, or recompute_old_log_probs=false); 0: each "
        "step samples from the weights it trains",
        ge=0,
    )
    weight_sync_timeout: float = key(
        600.0,
        "seconds a separate rollout engine (hybrid_engine=false) may take to load new weights before the "
        "run stops",
        gt=0,
    )
    env_workers: int = key(16, "threads resetting and stepping envs", ge=1)
    env_step_timeout: float = key(60.0, "seconds before an env step counts as a failure", gt=0)
    env_error_penalty: Optional[float] = key(
        None,
        "reward recorded for an episode whose env failed (it is not trained on); null: the task's "
        "format_penalty",
    )
    max_failed_agent_ratio: float = key(0.5, "a step where more agents fail stops with an error", ge=0, le=1)
    max_infra_failed_ratio: float = key(
        0.5,
        "a step where a larger share of the episodes failed in the infrastructure (env, tool or program "
        "errors, hangs, bad values, crashes: docs/CONTRACTS.md, Blame) stops the run with one line naming "
        "the "
        "kind, the count and the last error; such episodes are never trained on",
        ge=0,
        le=1,
    )
    infra_retries: int = key(
        0,
        "times the seeds of episodes the infrastructure ended are played again, with fresh envs, to top the "
        "batch back up (envs and tools; an agent program's are not replayed)",
        ge=0,
    )
    num_env_threads: Optional[int] = key(
        None, "GRL's name for env_workers; 0: min(32, CPUs); null: use env_workers"
    )
    num_init_threads: Optional[int] = key(
        None, "GRL's name for the reset threads: the same pool, so it also sets env_workers"
    )
    num_prompt_threads: int = key(
        0, "GRL's prompt-rendering threads", no_effect="prompts are rendered in the rollout thread"
    )
    show_tqdm: bool = key(
        False,
        "GRL's progress bars for the rollout phases",
        no_effect="progress bars show whenever trainer.logger has console",
    )


@dataclass
class KLControl:
    type: str = key(
        "fixed", "KL coefficient schedule of the KL-in-reward penalty", choices=("fixed", "adaptive")
    )
    kl_coef: float = key(0.001, "(initial) KL coefficient", ge=0)
    horizon: int = key(10000, "adaptive controller's horizon", ge=1)
    target_kl: float = key(0.1, "adaptive controller's target KL", gt=0)


@dataclass
class Algorithm:
    adv_estimator: str = key(
        "gae",
        "an estimator registered with @register_estimator (GRL's are in grl/algo/advantages.py and "
        "group_advantages.py; grl.config checks it)",
    )
    gamma: float = key(
        1.0, "token discount; gigpo and rebn discount their per-turn returns with it", ge=0, le=1
    )
    lam: float = key(1.0, "GAE lambda", ge=0, le=1)
    high_level_gamma: float = key(0.95, "turn-level discount of bi_level_gae / weighted_gae", ge=0, le=1)
    turn_advantage_weight: float = key(1.0, "w in A = A_token + w * A_turn (weighted_gae)")
    gigpo_step_weight: float = key(
        1.0, "w in A = A_episode + w * A_step (gigpo; steps grouped by identical env state)"
    )
    norm_adv_by_std_in_grpo: bool = key(True, "divide GRPO advantages by the group's standard deviation")
    kl_penalty: str = key("kl", "KL estimator of the KL-in-reward penalty", choices=KL_ESTIMATORS)
    opd_divergence: str = key(
        "reverse",
        "on-policy distillation's divergence to the teacher (adv_estimator=opd, or its term with teacher.*): "
        "reverse, advantage log p_teacher - log p_student (mode-seeking); forward, p_teacher / p_student - 1 "
        "(KL(teacher || student): mass-covering)",
        choices=OPD_DIVERGENCES,
    )
    use_kl_in_reward: bool = key(False, "subtract a KL penalty against the reference from the reward")
    kl_ctrl: KLControl = section(KLControl)


@dataclass
class Trainer:
    project_name: str = key(II("project_name"), "W&B project; part of the output folders")
    experiment_name: str = key(II("experiment_name"), "W&B run name; part of the output folders")
    logger: list[str] = key(
        ["console", "jsonl"], "where metrics go", choices=("console", "jsonl", "wandb", "tensorboard")
    )
    nnodes: int = key(II("nnodes"), "machines", ge=1)
    n_gpus_per_node: int = key(II("n_gpus_per_node"), "ranks per machine (processes on CPU)", ge=1)
    device: str = key("auto", "auto: cuda where available, else cpu", choices=("auto", "cuda", "cpu"))
    gpu_memory_gb: Optional[float] = key(
        None, "GiB per GPU the memory planner plans for (grl plan); null: what CUDA reports"
    )
    ray_address: Optional[str] = key(None, "null: $RAY_ADDRESS if set, else a local Ray runtime")
    total_training_steps: int = key(II("total_training_steps"), "training steps", ge=1)
    test_freq: int = key(II("test_freq"), "validate every N steps and after the last; -1 or 0: never", ge=-1)
    save_freq: int = key(II("save_freq"), "checkpoint every N steps; -1 or 0: only at the end", ge=-1)
    val_before_train: bool = key(True, "validate before the first step")
    val_only: bool = key(False, "validate once (after resuming, if any) and exit")
    validation_steps: int = key(
        1, "validation rollouts per validation; rollout i uses validation_seed + i", ge=1
    )
    validation_controls: list[str] = key(
        [],
        "[swap]: also validate with each agent shown a decoy game (success_swapped)",
        choices=VALIDATION_CONTROLS,
    )
    resume_mode: str = key(II("resume_mode"), "auto, disable or a global_step_N folder")
    resume_from_path: Optional[str] = key(
        None, "verl's key: a global_step_N folder; when set it replaces resume_mode"
    )
    default_local_dir: str = key(
        "checkpoints/${trainer.project_name}/${trainer.experiment_name}", "checkpoint folder"
    )
    run_dir: str = key(
        "outputs/${trainer.project_name}/${trainer.experiment_name}", "metrics, logs and the run's config"
    )
    max_ckpt_to_keep: Optional[int] = key(None, "null: keep all", ge=1)
    export_hf: bool = key(True, "also save the final actor as a Hugging Face folder")
    export_best: bool = key(
        False,
        "the Hugging Face folder holds the actor of the best validation after a "
        "training step (mean success; a tie goes to the later step) instead of the last step's; without "
        "validations, the last step's",
    )
    critic_warmup: int = key(0, "steps that update only the critic", ge=0)
    seed: int = key(42, "seeds sampling and, through rollout.seed, the training games")
    certificate: Certificate = section(Certificate)


@dataclass
class Data:
    max_prompt_length: int = key(
        II("max_prompt_length"), "GRL's spelling of max_prompt_length; a value set here replaces it"
    )
    max_response_length: int = key(
        II("max_response_length"), "GRL's spelling of max_response_length; a value set here replaces it"
    )
    train_batch_size: Optional[int] = key(
        II("train_batch_size"), "GRL's spelling of train_batch_size; a value set here replaces it"
    )


@dataclass
class System:
    CUDA_VISIBLE_DEVICES: Optional[str] = key(
        None, "as in GRL: the launch scripts export it themselves; this records it in the run config"
    )


@dataclass(unsafe_hash=True)  # grl.tools caches its isolation check per set of limits
class PythonSandbox:
    """Limits of every tool call of tasks with agent_config.tools: [python] (docs/TOOLS.md). Each call runs in
    its
    own process, in new mount, PID and network namespaces, as an unprivileged uid, in a private tmpfs
    folder."""

    wall_s: float = key(10.0, "wall-clock seconds, then the call and everything it started get SIGKILL", gt=0)
    cpu_s: int = key(10, "CPU seconds per process (RLIMIT_CPU)", ge=1)
    memory_mb: int = key(1024, "address space per process (RLIMIT_AS)", ge=1)
    max_processes: int = key(16, "processes + threads (RLIMIT_NPROC of the call's own uid)", ge=1)
    max_file_mb: int = key(16, "largest file written (RLIMIT_FSIZE)", ge=1)
    max_dir_mb: int = key(64, "size of the private working folder (a tmpfs)", ge=1)
    max_open_files: int = key(64, "RLIMIT_NOFILE", ge=1)
    max_output_bytes: int = key(65536, "stdout + stderr read back; more stops the call", ge=1)
    isolate_network: bool = key(
        True, "false opts out of the network namespace: the code then reaches the host network"
    )


@dataclass
class Tools:
    python: PythonSandbox = section(PythonSandbox)


@dataclass
class GRLConfig:
    """The whole run config. The top-level keys are shorthands GRL users set on the command line; the nested
    keys default to them and are what the run reads."""

    model_path: str = key("embedded", "hub id, local folder, `embedded` (SmolLM2-135M-Instruct) or `tiny`")
    max_prompt_length: int = key(
        1024, "tokens of context given to the engine each turn (left-truncated, system kept)", ge=1
    )
    max_response_length: int = key(128, "tokens the model may write per turn", ge=1)
    train_batch_size: Optional[int] = key(
        None, "episodes per step, checked: null or the sum of agent_group_num x agent_group_size"
    )
    ppo_mini_batch_size: int = key(32, "episodes per optimizer step (actor and critic)")
    micro_batch_size_per_gpu: int = key(4, "episodes per forward/backward on one device (every role)")
    total_training_steps: int = key(200, "shorthand for trainer.total_training_steps")
    n_gpus_per_node: int = key(1, "shorthand for trainer.n_gpus_per_node")
    nnodes: int = key(1, "shorthand for trainer.nnodes")
    test_freq: int = key(10, "shorthand for trainer.test_freq")
    save_freq: int = key(-1, "shorthand for trainer.save_freq (-1: only at the end)")
    gpu_memory_utilization: float = key(0.5, "shorthand for actor_rollout_ref.rollout.gpu_memory_utilization")
    project_name: str = key("grl", "shorthand for trainer.project_name")
    experiment_name: str = key("sokoban_ppo", "shorthand for trainer.experiment_name")
    resume_mode: str = key(
        "auto", "shorthand for trainer.resume_mode: auto, disable or a global_step_N folder"
    )
    data: Data = section(Data)
    system: System = section(System)
    tools: Tools = section(Tools)
    rollout: Rollout = section(Rollout)
    actor_rollout_ref: ActorRolloutRef = section(ActorRolloutRef)
    critic: Critic = section(Critic)
    teacher: Teacher = section(Teacher)
    algorithm: Algorithm = section(Algorithm)
    trainer: Trainer = section(Trainer)
