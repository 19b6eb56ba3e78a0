"""What the run does, decided once from the checked config before Ray starts.

The config says what a user asked for; the plan says what the run therefore does wherever more
than one place needs the answer: how many ranks on how many nodes, where the engine lives and how far
its rollouts run ahead, where PPO's old log-probs come from, whether a critic and a reference model
are built, how a CPU node's cores are split, and the phases of a step under their one name each. The
trainer, the worker groups and their ranks (the plan is pickled to each), the memory planner and
preflight read it; none of them works these out again. It also carries what the driver needs of the
sections the worker groups own (the model, the engine and how it samples), so that each module reads
only the sections its component owns (tests/test_run_plan.py scans the package for it).
"""

from __future__ import annotations

from dataclasses import dataclass

from grl.algo.estimators import ESTIMATORS
from grl.engines import SamplingParams, sampling_from_config
from grl.engines.base import engine_cpu_threads

# A training step's phases in order, by the one name the progress bar shows, `timing_s/<name>` times
# (verl's timer names) and the memory planner places memory in.
PHASES = ("gen", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "sync_weights")
ENGINE_LOG_PROBS, SCORED_LOG_PROBS = "engine", "scored"


@dataclass(frozen=True)
class RunPlan:
    device: str  # trainer.device as asked; `auto` is resolved against the cluster's GPUs once Ray runs
    nnodes: int
    ranks_per_node: int  # processes on CPU
    engine_apart: bool  # the engine in a rollout worker of its own (hybrid_engine=false), else in the actor's ranks
    max_staleness: int  # rollouts run up to this many policy versions ahead of the update (engine apart only)
    old_log_probs: str  # ENGINE_LOG_PROBS: the sampler's own; SCORED_LOG_PROBS: the weights about to be trained
    use_critic: bool  # the estimator reads values
    use_reference: bool  # a KL loss or a KL penalty in the reward needs reference log-probs
    reference_model: bool  # a model of its own; a LoRA run's reference is its base with the adapter off
    seed: int
    reply_grammars: bool  # some task decodes from valid actions or is a program (allowed_replies): the engine takes grammars
    score_temperature: float  # the scoring distribution is the sampling one: the rollout's temperature, 1 for greedy (0)
    logits_chunk_size: int  # positions per chunk through a head, for every role
    packing_capacity: int | None  # tokens of a packed row sent to the ranks (rollout.packing); None: an episode a row
    share_prompts: bool  # a packed row holds a group's shared first prompt once
    # Whether the update's first optimizer step is taken at the weights that sampled, so that the
    # log-probs it computes are the old ones and no pass of their own is needed (TRL's num_iterations=1).
    ppo_epochs: int
    ppo_mini_batch_size: int
    kl_in_reward: bool  # applied before the update, so it needs the old log-probs beforehand
    tis_imp_ratio_cap: float  # the truncated importance weight between the sampler's and the trained weights
    kl_loss_coef: float | None  # the actor's KL loss to the reference (a metric too); None: no KL loss
    # What the driver needs of the sections the worker groups own: the model (tokenizer, FLOPs per token,
    # banner), the engine, how it samples in training and in validation, and whether it sleeps between rollouts.
    model_path: str
    model_dtype: str
    engine_name: str
    max_response_length: int  # tokens per turn: the samplers' limit and the turn-length metrics' cap
    sampling: SamplingParams
    validation_sampling: SamplingParams
    free_cache_engine: bool
    ray_address: str | None
    weight_sync_timeout: float  # seconds a separate engine waits for the trained weights

    @classmethod
    def from_config(cls, cfg) -> RunPlan:
        from grl.rollout.tasks import decodes_constrained

        actor, engine = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout
        temperature = engine.temperature
        use_reference = actor.use_kl_loss or cfg.algorithm.use_kl_in_reward
        return cls(
            device=cfg.trainer.device,
            nnodes=cfg.trainer.nnodes,
            ranks_per_node=cfg.trainer.n_gpus_per_node,
            engine_apart=not cfg.actor_rollout_ref.hybrid_engine,
            max_staleness=cfg.rollout.max_staleness,
            old_log_probs=SCORED_LOG_PROBS if actor.recompute_old_log_probs else ENGINE_LOG_PROBS,
            use_critic=ESTIMATORS[cfg.algorithm.adv_estimator].needs_critic,
            use_reference=use_reference,
            reference_model=use_reference and cfg.actor_rollout_ref.model.lora_rank == 0,
            seed=cfg.trainer.seed,
            reply_grammars=decodes_constrained(cfg),
            score_temperature=temperature if temperature > 0 else 1.0,
            logits_chunk_size=actor.logits_chunk_size,
            packing_capacity=cfg.rollout.max_episode_length if cfg.rollout.packing else None,
            share_prompts=cfg.rollout.share_prompts,
            ppo_epochs=actor.ppo_epochs,
            ppo_mini_batch_size=actor.ppo_mini_batch_size,
            kl_in_reward=cfg.algorithm.use_kl_in_reward,
            tis_imp_ratio_cap=actor.tis_imp_ratio_cap,
            kl_loss_coef=actor.kl_loss_coef if actor.use_kl_loss else None,
            model_path=cfg.actor_rollout_ref.model.path,
            model_dtype=cfg.actor_rollout_ref.model.dtype,
            engine_name=engine.name,
            max_response_length=cfg.max_response_length,
            sampling=sampling_from_config(engine, validate=False, max_new_tokens=cfg.max_response_length),
            validation_sampling=sampling_from_config(engine, validate=True, max_new_tokens=cfg.max_response_length),
            free_cache_engine=engine.free_cache_engine,
            ray_address=cfg.trainer.ray_address,
            weight_sync_timeout=cfg.rollout.weight_sync_timeout,
        )

    @property
    def world_size(self) -> int:
        """Ranks per role."""
        return self.nnodes * self.ranks_per_node

    @property
    def rollout_ahead(self) -> bool:
        """Rollouts generate while the actor trains (grl/trainer/pipeline.py)."""
        return self.max_staleness > 0

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases this run's steps go through, in order."""
        skipped = {*(() if self.use_reference else ("ref",)), *(() if self.use_critic else ("values", "update_critic"))}
        return tuple(phase for phase in PHASES if phase not in skipped)

    def old_log_prob_pass(self, episodes: int) -> bool:
        """Whether scored old log-probs need a pass before the update: a second mini-batch or epoch
        trains on a moved policy, a KL penalty in the reward is applied before the update, and episodes
        sampled by older weights are clipped around the current weights' log-probs (the proximal policy,
        AReaL's decoupled objective) while a truncated importance weight corrects for the versions between."""
        return self.ppo_epochs > 1 or episodes > self.ppo_mini_batch_size or self.kl_in_reward or self.max_staleness > 0

    def cpu_threads(self, cores: int, device: str, engine: bool = False) -> int:
        """Threads of a process with `cores` on its node: a training rank's share (`engine=False`) or
        the engine worker's. Ray sets OMP_NUM_THREADS=1 in a fractional-CPU actor, which would leave
        an offloaded optimizer step (AdamW over the host shards) one core. On CPU the driver runs the
        phases one after another, so the ranks of the working group (and a colocated engine, in a
        rank) may share every core, except while rollouts run beside the update: the engine then
        keeps its share and the ranks split the rest."""
        beside = device == "cpu" and self.rollout_ahead
        if engine:
            return engine_cpu_threads(cores) if beside else cores
        return max(1, max(1, cores - engine_cpu_threads(cores) if beside else cores) // self.ranks_per_node)

    def engine_place(self) -> str:
        """Where the engine runs, when not in the actor's ranks (for the start banner)."""
        if not self.engine_apart:
            return ""
        k = self.max_staleness
        return " in a worker of its own" + (f", rollouts up to {k} version{'s' if k > 1 else ''} ahead" if k else "")
