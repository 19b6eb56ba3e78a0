"""The run config: the shorthands GRL users set, the algorithm and the trainer (rollout: rollout.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import II

from grl.schema.certificate import Certificate
from grl.schema.keys import ConfigError, key, section
from grl.schema.rollout import Rollout
from grl.schema.teacher import Teacher
from grl.schema.workers import KL_ESTIMATORS, ActorRolloutRef, Critic


VALIDATION_CONTROLS = ("swap",)  # grl.agents.controls.VALIDATION_CONTROLS
OPD_DIVERGENCES = ("reverse", "forward")  # grl/algo/distill.py: on-policy distillation's two advantages


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
    val_only: bool = key(
        False,
        "validate once (after resuming, if any) and exit, starting no critic, reference model or teacher; "
        "its records go in run_dir's val_only folder",
    )
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

    @staticmethod
    def together(node, prefix: str, root) -> None:
        if node.critic_warmup >= node.total_training_steps and node.critic_warmup != 0:
            raise ConfigError(
                f"{prefix}critic_warmup: {node.critic_warmup!r} leaves no step (of "
                f"{node.total_training_steps}) that updates the actor"
            )


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

    @staticmethod
    def together(node, prefix: str, root) -> None:
        r = node.rollout
        episodes = sum(n * s for n, s in zip(r.agent_group_num, r.agent_group_size))
        if node.train_batch_size is not None and node.train_batch_size != episodes:
            raise ConfigError(
                f"train_batch_size: {node.train_batch_size} episodes per step, but rollout.agent_group_num x "
                f"agent_group_size gives {episodes}; set it to {episodes} or null"
            )
