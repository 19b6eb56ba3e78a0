"""The run plan: its decisions against the config that asks for them, none of them a copy of a section's
key; the Run grl-train builds once."""

import ast
import math
import pickle
from dataclasses import FrozenInstanceError, asdict, fields, is_dataclass, replace
from pathlib import Path

import pytest

from grl.config import load_config
from grl.machine import machine_facts
from grl.run_plan import PHASES, RunPlan, build_run

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
    validating = plan_of(
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "teacher.model_path=tiny",
        "trainer.val_only=true",
    )
    assert not (validating.use_critic or validating.use_reference or validating.reference_model)
    assert validating.teacher is None  # a val-only run trains nothing, so it starts none of them
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
    assert (apart.engine_apart, apart.rollout_ahead, apart.world_size) == (True, True, 6)
    assert apart.engine_place(2) == " in a worker of its own, rollouts up to 2 versions ahead"
    packed = plan_of("rollout.packing=true", "rollout.max_episode_length=512", "rollout.share_prompts=true")
    assert packed.packing_capacity == 512
    assert (
        plan_of("rollout.packing=false").packing_capacity is None
        and plan_of("trainer.device=cpu").device == "cpu"
    )
    colocated = plan_of()
    assert (colocated.engine_apart, colocated.rollout_ahead, colocated.engine_place(0)) == (False, False, "")


def test_the_plan_is_frozen_and_reaches_the_ranks_unchanged():
    cfg = load_config(["model_path=tiny", *AHEAD])
    facts = machine_facts("cpu", "hf")  # the free memory the KV budget is a share of, asked once
    plan = RunPlan.from_config(cfg, facts)
    assert pickle.loads(pickle.dumps(plan)) == plan == RunPlan.from_config(cfg, facts)
    with pytest.raises(FrozenInstanceError):
        plan.rollout_ahead = False


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
    assert plan.rollout_ahead is (staleness > 0)
    for episodes in range(1, 20):
        # reference: the update's optimizer steps; only the first is taken at the weights that sampled, and
        # only if nothing used the old log-probs before it and the sampler was the current policy
        optimizer_steps = epochs * math.ceil(episodes / mini)
        first_step_is_all = optimizer_steps == 1 and not kl_in_reward and staleness == 0
        assert plan.old_log_prob_pass(episodes) is (not first_step_is_all), (episodes, epochs, mini)


def test_cpu_threads_split_the_node_between_the_ranks_and_an_engine_generating_beside_them():
    for ranks in (1, 2, 4):
        for ahead in (False, True):
            plan = replace(plan_of(), device="cpu", rollout_ahead=ahead, engine_apart=ahead)
            for cores in range(1, 33):
                rank = plan.cpu_threads(cores, ranks_per_node=ranks)
                engine = plan.cpu_threads(cores, engine=True)
                assert rank >= 1 and engine >= 1
                if (
                    ahead and cores >= 2 and cores - cores // 2 >= ranks
                ):  # both at once: no more than the node
                    assert ranks * rank + engine <= cores and engine == cores // 2
                if not ahead:  # one at a time: the ranks share the node, the engine takes all of it
                    assert rank == max(1, cores // ranks) and engine == cores
                # on a GPU node the engine's cores are not the ranks' concern
                gpu = replace(plan, device="cuda")
                assert gpu.cpu_threads(cores, ranks_per_node=ranks) == max(1, cores // ranks)


def section_keys(value) -> dict[str, list]:
    """Every leaf key of a typed section (a schema dataclass, its nested sections and dicts) by its last
    name -> its values."""
    items = asdict(value).items() if is_dataclass(value) else value.items()
    keys: dict[str, list] = {}
    for name, item in items:
        if is_dataclass(item) or isinstance(item, dict):
            for sub, values in section_keys(item).items():
                keys.setdefault(sub, []).extend(values)
        else:
            keys.setdefault(name, []).append(item)
    return keys


# Configs in which each key a copy would mirror (the seed, the ranks, the staleness, the chunk size, the
# packing, the temperature) takes another value.
PLAN_CONFIGS = (
    (),
    (
        *AHEAD,
        "n_gpus_per_node=2",
        "nnodes=3",
        "trainer.seed=7",
        "actor_rollout_ref.actor.logits_chunk_size=64",
        "actor_rollout_ref.rollout.temperature=0.5",
    ),
    (
        "rollout.packing=true",
        "rollout.max_episode_length=512",
        "rollout.share_prompts=false",
        "trainer.device=cpu",
        "actor_rollout_ref.rollout.temperature=0",
    ),
)


def test_no_plan_field_is_a_copy_of_a_section_key():
    """A RunPlan field named as a section's key, or holding one key's value in every config, would be that
    key copied: its readers should read the section. `device` and `engine` share their keys' names because
    they resolve `auto` (the test below); a flag may agree with a flag, a count with a count by chance, so
    only numbers and strings that no decision touched are compared by value."""
    runs = [build_run(load_config(["model_path=tiny", *overrides])) for overrides in PLAN_CONFIGS]

    def keys(run) -> dict[str, object]:
        return {
            f"{section}.{name}": value
            for section in (f.name for f in fields(run.sections) if f.name != "record")
            for name, value in section_keys(getattr(run.sections, section)).items()
        }

    names = {key.rpartition(".")[2] for run in runs for key in keys(run)}
    copied = [f.name for f in fields(RunPlan) if f.name in names and f.name not in ("device", "engine")]
    assert copied == []
    by_key = [keys(run) for run in runs]
    for field in fields(RunPlan):
        values = [getattr(run.plan, field.name) for run in runs]
        if isinstance(values[0], bool) or values[0] is None or len(set(map(repr, values))) == 1:
            continue  # a flag, or a value the configs do not vary
        mirrored = [key for key in by_key[0] if all(k.get(key) == [v] for k, v in zip(by_key, values))]
        assert mirrored == [], f"RunPlan.{field.name} holds {mirrored[0]} in every config"
    # the checks see a copy: the trainer's seed (7 in the second config) is a key a field must not mirror
    assert by_key[1]["trainer.seed"] == [7] and "seed" in names


def test_the_resolved_fields_decide_where_the_config_leaves_it_to_the_machine():
    """`device` and `engine` share their keys' names; they hold the answer to `auto`, never `auto`."""
    run = build_run(
        load_config(["model_path=tiny", "trainer.device=auto", "actor_rollout_ref.rollout.name=auto"])
    )
    assert run.sections.trainer.device == "auto" and run.plan.device in ("cpu", "cuda")
    assert run.sections.actor_rollout_ref.rollout.name == "auto" and run.plan.engine in ("hf", "vllm")


# The builders take the root config (grl.config.load_config's DictConfig) and hand every component typed
# objects: its schema sections (grl.schema.RunSections), the run plan, the task blocks. A builder is one of
# these modules or a `from_config` classmethod; grl-train's trainer is started from the Run it built once
# (grl.run_plan.build_run), and nothing else turns the root config into anything.
BUILDER_MODULES = ("config.py", "sections.py", "run_plan.py", "preflight", "train.py", "cli.py", "schema/")
BUILDER_FUNCTIONS = {"from_config"}
ROOT_ENTRIES = {"load_config", "typed_section", "run_sections", "build_run", "task_instance"}


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
    assert annotations(Validation.__init__)[:2] == ["list[TaskSpec]", "SamplingParams"]
    assert annotations(Validation.of_run)[:1] == ["RunSections"]
    assert annotations(MultiTurnRollout.from_config)[:3] == ["Rollout", "Data", "Tools"]
    assert annotations(ActorRolloutRefGroup.__init__)[:2] == ["ActorRolloutRef", "RunPlan"]
    assert annotations(CriticGroup.__init__)[:2] == ["Critic", "RunPlan"]
    assert annotations(plan)[:1] == ["RunSections"]
    assert list(inspect.signature(ProgramRunner.from_config).parameters)[:2] == ["rollout", "data"]


def test_grl_train_types_the_config_once_and_trains_the_run_it_built(tmp_path, monkeypatch):
    """grl-train's whole path before the workers (config, run, preflight, the trainer's entry) converts the
    config to its sections once: the Run preflight checked is the one the trainer is handed."""
    import grl.config
    import grl.sections
    import grl.trainer
    from grl import train
    from grl.run_plan import Run

    conversions, sections, trained = [], [], []
    convert, typed = grl.sections.run_sections, grl.sections.typed_section

    def counted(cfg):
        conversions.append(cfg)
        return convert(cfg)

    def counted_section(cfg, name):
        sections.append(name)
        return typed(cfg, name)

    for module in (grl.sections, grl.config):
        monkeypatch.setattr(module, "run_sections", counted)
        monkeypatch.setattr(module, "typed_section", counted_section)
    monkeypatch.setattr(grl.trainer, "run", trained.append)  # the boundary: no worker starts
    folders = [f"trainer.run_dir={tmp_path}/run", f"trainer.default_local_dir={tmp_path}/ckpt"]
    assert train.main(["preset=cpu", "model_path=tiny", *folders]) == 0
    assert len(conversions) == 1 and len(trained) == 1 and isinstance(trained[0], Run)
    # every section conversion is that one run's (its eight sections), none of a check or a builder
    typed_sections = [f.name for f in fields(trained[0].sections) if f.name not in ("tasks", "record")]
    assert sorted(sections) == sorted(typed_sections)
    assert trained[0].sections.trainer.run_dir == f"{tmp_path}/run"


def test_the_engines_kv_budget_is_the_key_else_a_share_of_the_devices_memory():
    from grl.config import ConfigError
    from grl.machine import MachineFacts
    from grl.run_plan import KV_SHARE_OF_FREE_HOST, KV_SHARE_OF_GPU, kv_budget

    facts = MachineFacts(gpus=0, gpu_memory_gib=None, vllm_usable=False, host_free_gib=20.0)
    assert kv_budget(3.0, "cpu", facts, None) == 3.0
    assert kv_budget(None, "cpu", facts, None) == KV_SHARE_OF_FREE_HOST * 20.0
    assert kv_budget(None, "cpu", replace(facts, host_free_gib=20.7), None) == KV_SHARE_OF_FREE_HOST * 20.0
    assert kv_budget(None, "cuda", facts, 80.0) == KV_SHARE_OF_GPU * 80.0
    assert kv_budget(None, "cpu", replace(facts, host_free_gib=None), None) is None
    assert plan_of("actor_rollout_ref.rollout.kv_cache_gb=2.5").kv_cache_gib == 2.5
    with pytest.raises(ConfigError, match="kv_cache_gb"):
        plan_of("actor_rollout_ref.rollout.kv_cache_gb=0")
