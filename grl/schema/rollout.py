"""The rollout section: the task instances, their groups, the episodes' limits and the curriculum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import II

from grl.schema.keys import ConfigError, key, one_entry_each, section


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

    @staticmethod
    def together(node, prefix: str, root) -> None:
        if node.env_key is not None and not node.levels:
            raise ConfigError(f"{prefix}levels: name the values of {node.env_key}, easiest first")
        if node.max_turns:
            one_entry_each(node, "max_turns", "levels", prefix)


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

    @staticmethod
    def together(node, prefix: str, root) -> None:
        for tasks, num, size in (
            ("training", "agent_group_num", "agent_group_size"),
            ("validation", "validation_agent_group_num", "validation_agent_group_size"),
        ):
            one_entry_each(node, num, tasks, prefix)
            one_entry_each(node, size, tasks, prefix)
        if not node.training:
            raise ConfigError(f"{prefix}training: name at least one task instance")
        for tasks in ("training", "validation"):
            names = list(node[tasks])
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ConfigError(
                    f"{prefix}{tasks}: {', '.join(twice)} named twice; raise its agent_group_num instead"
                )
        if node.max_staleness > 0 and root.actor_rollout_ref.hybrid_engine:
            raise ConfigError(
                f"{prefix}max_staleness={node.max_staleness}: rollout then runs beside the update, "
                "so the engine needs a worker of its own; add actor_rollout_ref.hybrid_engine=false"
            )
        actor = root.actor_rollout_ref.actor
        if node.max_staleness > 0 and actor.recompute_old_log_probs and actor.tis_imp_ratio_cap <= 0:
            raise ConfigError(
                f"{prefix}max_staleness={node.max_staleness}: episodes come from older weights than "
                "the update's, which the loss corrects for with truncated importance weights; set "
                "actor_rollout_ref.actor.tis_imp_ratio_cap (e.g. 2.0), or clip around the sampling policy "
                "with actor_rollout_ref.actor.recompute_old_log_probs=false"
            )
