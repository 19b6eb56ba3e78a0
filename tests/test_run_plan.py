"""The run plan: its decisions against the config that asks for them, and the keys it decides read
nowhere else in the package."""

import ast
import io
import math
import pickle
import re
import tokenize
from dataclasses import FrozenInstanceError, replace
from pathlib import Path

import pytest

from grl.config import load_config
from grl.run_plan import PHASES, RunPlan

GRL = Path(__file__).resolve().parent.parent / "grl"
AHEAD = [
    "actor_rollout_ref.hybrid_engine=false",
    "rollout.max_staleness=2",
    "actor_rollout_ref.actor.tis_imp_ratio_cap=2",
]


def plan_of(*overrides: str) -> RunPlan:
    return RunPlan.from_config(load_config(["model_path=tiny", *overrides]))


def test_what_the_config_asks_for_is_what_the_plan_decides():
    grpo = plan_of("algorithm.adv_estimator=grpo", "critic.enable=false")
    assert not grpo.use_critic and not grpo.use_reference and not grpo.reference_model
    assert grpo.phases == ("gen", "old_log_prob", "adv", "update_actor", "sync_weights")

    gae_kl = plan_of(
        "algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true", "teacher.model_path=tiny"
    )
    assert gae_kl.use_critic and gae_kl.use_reference and gae_kl.reference_model
    assert gae_kl.teacher == "local" and plan_of().teacher is None
    assert gae_kl.phases == PHASES  # every phase, in the order a step runs them
    served = plan_of(
        "algorithm.adv_estimator=opd", "teacher.url=http://127.0.0.1:8000", "critic.enable=false"
    )
    assert served.teacher == "served" and served.phases == (
        "gen",
        "old_log_prob",
        "teacher",
        "adv",
        "update_actor",
        "sync_weights",
    )

    lora = plan_of("algorithm.use_kl_in_reward=true", "actor_rollout_ref.model.lora_rank=4")
    assert lora.use_reference and not lora.reference_model  # the base, adapter off

    apart = plan_of(*AHEAD, "n_gpus_per_node=2", "nnodes=3", "trainer.seed=7")
    assert (apart.engine_apart, apart.rollout_ahead, apart.max_staleness) == (True, True, 2)
    assert (apart.world_size, apart.seed) == (6, 7)
    assert apart.engine_place() == " in a worker of its own, rollouts up to 2 versions ahead"
    packed = plan_of("rollout.packing=true", "rollout.max_episode_length=512", "rollout.share_prompts=true")
    assert (packed.packing_capacity, packed.share_prompts) == (512, True)
    assert (
        plan_of("rollout.packing=false").packing_capacity is None
        and plan_of("trainer.device=cpu").device == "cpu"
    )
    colocated = plan_of()
    assert (colocated.engine_apart, colocated.engine_place()) == (False, "")


def test_the_plan_is_frozen_and_reaches_the_ranks_unchanged():
    plan = plan_of(*AHEAD)
    assert pickle.loads(pickle.dumps(plan)) == plan == plan_of(*AHEAD)
    with pytest.raises(FrozenInstanceError):
        plan.max_staleness = 0


def test_the_old_log_probs_come_from_the_source_the_actor_section_names():
    from grl.config import run_sections
    from grl.trainer.pipeline import EngineLogProbs, ScoredLogProbs, old_log_probs_from

    for recompute, source in ((True, ScoredLogProbs), (False, EngineLogProbs)):
        overrides = ["model_path=tiny", f"actor_rollout_ref.actor.recompute_old_log_probs={recompute}"]
        run = run_sections(load_config(overrides))
        assert (
            type(old_log_probs_from(RunPlan.from_sections(run), run.actor_rollout_ref.actor, None)) is source
        )


@pytest.mark.parametrize(
    "epochs,mini,kl_in_reward,staleness",
    [(1, 8, False, 0), (2, 8, False, 0), (1, 4, False, 0), (1, 8, True, 0), (1, 8, False, 1)],
)
def test_old_log_prob_pass_is_needed_when_the_update_moves_before_it_reads_them(
    epochs, mini, kl_in_reward, staleness
):
    plan = plan_of(
        f"actor_rollout_ref.actor.ppo_epochs={epochs}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        f"algorithm.use_kl_in_reward={kl_in_reward}",
        *(AHEAD[:1] + [f"rollout.max_staleness={staleness}", AHEAD[2]] if staleness else []),
    )
    assert plan.max_staleness == staleness
    for episodes in range(1, 20):
        # reference: the update's optimizer steps; only the first is taken at the weights that sampled, and
        # only if nothing used the old log-probs before it and the sampler was the current policy
        optimizer_steps = epochs * math.ceil(episodes / mini)
        first_step_is_all = optimizer_steps == 1 and not kl_in_reward and staleness == 0
        assert plan.old_log_prob_pass(episodes) is (not first_step_is_all), (episodes, epochs, mini)


def test_cpu_threads_split_the_node_between_the_ranks_and_an_engine_generating_beside_them():
    for ranks in (1, 2, 4):
        for ahead in (False, True):
            plan = replace(plan_of(), ranks_per_node=ranks, max_staleness=int(ahead), engine_apart=ahead)
            for cores in range(1, 33):
                rank, engine = plan.cpu_threads(cores, "cpu"), plan.cpu_threads(cores, "cpu", engine=True)
                assert rank >= 1 and engine >= 1
                if (
                    ahead and cores >= 2 and cores - cores // 2 >= ranks
                ):  # both at once: no more than the node
                    assert ranks * rank + engine <= cores and engine == cores // 2
                if not ahead:  # one at a time: the ranks share the node, the engine takes all of it
                    assert rank == max(1, cores // ranks) and engine == cores
                # on a GPU node the engine's cores are not the ranks' concern
                assert plan.cpu_threads(cores, "cuda") == max(1, cores // ranks)


# Keys whose consequences the plan decides: read from a config only by the plan's builder and by
# grl/config.py's checks (the schema declares them).
PLANNED_KEYS = (
    "max_staleness",
    "hybrid_engine",
    "n_gpus_per_node",
    "nnodes",
    "packing",
    "share_prompts",
)
ALLOWED_FILES = {GRL / "run_plan.py", GRL / "config.py"}


def _code_without_strings(source: str) -> str:
    """The source with its strings and comments blanked, so that messages naming a key do not count."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.STRING, tokenize.COMMENT) or tok.type == getattr(
            tokenize, "FSTRING_MIDDLE", -1
        ):
            out.append(" ")
        else:
            out.append(tok.string)
        out.append(" " if tok.type != tokenize.NEWLINE else "\n")
    return "".join(out)


ATTRIBUTE = re.compile(r"(\w+)\s*\.\s*(" + "|".join(PLANNED_KEYS) + r"|trainer\s*\.\s*seed)\b")
BY_NAME = re.compile(r"""(?:get\(|\[)\s*["'](?:""" + "|".join(PLANNED_KEYS) + r""")["']""")


def config_reads(source: str) -> list[str]:
    """The reads of a planned key in `source`; `plan.max_staleness`, `run.nnodes` or an object's own
    attribute read the plan, not a config."""
    return [
        re.sub(r"\s", "", m.group(2))
        for m in ATTRIBUTE.finditer(_code_without_strings(source))
        if m.group(1) not in ("plan", "run", "self")
    ] + [m.group(0) for m in BY_NAME.finditer(source)]


def test_the_keys_the_plan_decides_are_read_nowhere_else():
    readers = [
        f"{path.relative_to(GRL)}: {read}"
        for path in sorted(GRL.rglob("*.py"))
        if path not in ALLOWED_FILES and GRL / "schema" not in path.parents
        for read in config_reads(path.read_text())
    ]
    assert readers == []
    # the scan sees the reads there are, and not a message that names a key
    assert config_reads("k = cfg.rollout.max_staleness  # rollout.max_staleness") == ["max_staleness"]
    assert config_reads("seed = int(self.cfg.trainer.seed)\nn = t.get('nnodes', 1)") == [
        "trainer.seed",
        "get('nnodes'",
    ]
    assert config_reads('log("rollout.max_staleness=%d", self.plan.max_staleness)') == []


# The builders take the root config (grl.config.load_config's DictConfig) and hand every component typed
# objects: its schema sections (grl.config.RunSections), the run plan, the task blocks. A builder is one of
# these modules, a `from_config` classmethod or grl.trainer.run (grl-train's, which builds the trainer);
# nothing else turns the root config into anything.
BUILDER_MODULES = ("config.py", "run_plan.py", "preflight.py", "train.py", "cli.py", "schema/")
BUILDER_FUNCTIONS = {"from_config", "trainer/__init__.py:run"}
ROOT_ENTRIES = {"load_config", "typed_section", "run_sections", "task_instance"}


def root_config_uses(source: str, module: str = "") -> list[str]:
    """Where `source` (the module `module`) reaches the root config outside a builder function: a call that
    converts it (ROOT_ENTRIES), a parameter `cfg` unannotated or annotated DictConfig, or `self.cfg`."""
    uses = []

    def visit(node: ast.AST, in_builder: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_builder = in_builder or bool({node.name, f"{module}:{node.name}"} & BUILDER_FUNCTIONS)
            if not in_builder:
                uses.extend(
                    f"{node.name}(cfg)"
                    for a in node.args.args + node.args.kwonlyargs
                    if a.arg == "cfg" and (a.annotation is None or "DictConfig" in ast.unparse(a.annotation))
                )
        elif not in_builder and isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name in ROOT_ENTRIES:
                uses.append(f"{name}()")
        elif not in_builder and isinstance(node, ast.Attribute) and node.attr == "cfg":
            if isinstance(node.value, ast.Name) and node.value.id == "self":
                uses.append("self.cfg")
        for child in ast.iter_child_nodes(node):
            visit(child, in_builder)

    visit(ast.parse(source), False)
    return uses


def test_only_the_builders_read_the_root_config():
    uses = [
        f"{path.relative_to(GRL).as_posix()}: {use}"
        for path in sorted(GRL.rglob("*.py"))
        if not path.relative_to(GRL).as_posix().startswith(BUILDER_MODULES)
        for use in root_config_uses(path.read_text(), path.relative_to(GRL).as_posix())
    ]
    assert uses == []
    # the check sees each way in, and lets a from_config builder read the config
    assert root_config_uses("def f(cfg):\n    return cfg.trainer.seed") == ["f(cfg)"]
    assert root_config_uses("def f(cfg: DictConfig):\n    pass\ndef g(cfg: Mapping):\n    pass") == ["f(cfg)"]
    assert root_config_uses("class A:\n    def g(self):\n        return self.cfg.rollout") == ["self.cfg"]
    assert root_config_uses("s = typed_section(config, 'critic')") == ["typed_section()"]
    assert (
        root_config_uses(
            "class A:\n    @classmethod\n    def from_config(cls, cfg):\n        return run_sections(cfg)"
        )
        == []
    )


def test_the_components_are_built_from_typed_sections():
    """The signatures say what each component is built from; none takes the root config."""
    import inspect

    from grl.gateway.programs import ProgramRunner
    from grl.planner import plan
    from grl.rollout import MultiTurnRollout
    from grl.trainer.agent_trainer import AgentTrainer
    from grl.trainer.validation import Validation
    from grl.workers import ActorRolloutRefGroup, CriticGroup

    def annotations(fn) -> list[str]:
        return [
            str(p.annotation)
            for p in inspect.signature(fn).parameters.values()
            if p.annotation is not p.empty
        ]

    assert annotations(AgentTrainer.__init__)[:2] == ["RunSections", "RunPlan"]
    assert annotations(Validation.__init__)[:1] == ["RunSections"]
    assert annotations(MultiTurnRollout.from_config)[:3] == ["Rollout", "Data", "Tools"]
    assert annotations(ActorRolloutRefGroup.__init__)[:2] == ["ActorRolloutRef", "RunPlan"]
    assert annotations(CriticGroup.__init__)[:2] == ["Critic", "RunPlan"]
    assert annotations(plan)[:1] == ["RunSections"]
    assert list(inspect.signature(ProgramRunner.from_config).parameters)[:2] == ["rollout", "data"]
