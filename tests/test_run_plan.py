"""The run plan: its decisions against the config that asks for them, and the keys it decides read
nowhere else in the package."""

import io
import math
import pickle
import re
import tokenize
from dataclasses import FrozenInstanceError, replace
from pathlib import Path

import pytest

from grl.config import load_config
from grl.run_plan import ENGINE_LOG_PROBS, PHASES, SCORED_LOG_PROBS, RunPlan

GRL = Path(__file__).resolve().parent.parent / "grl"
AHEAD = ["actor_rollout_ref.hybrid_engine=false", "rollout.max_staleness=2", "actor_rollout_ref.actor.tis_imp_ratio_cap=2"]


def plan_of(*overrides: str) -> RunPlan:
    return RunPlan.from_config(load_config(["model_path=tiny", *overrides]))


def test_what_the_config_asks_for_is_what_the_plan_decides():
    grpo = plan_of("algorithm.adv_estimator=grpo", "critic.enable=false")
    assert not grpo.use_critic and not grpo.use_reference and not grpo.reference_model
    assert grpo.phases == ("gen", "old_log_prob", "adv", "update_actor", "sync_weights")

    gae_kl = plan_of("algorithm.adv_estimator=gae", "actor_rollout_ref.actor.use_kl_loss=true")
    assert gae_kl.use_critic and gae_kl.use_reference and gae_kl.reference_model
    assert gae_kl.phases == PHASES  # every phase, in the order a step runs them

    lora = plan_of("algorithm.use_kl_in_reward=true", "actor_rollout_ref.model.lora_rank=4")
    assert lora.use_reference and lora.kl_in_reward and not lora.reference_model  # the base, adapter off

    apart = plan_of(*AHEAD, "n_gpus_per_node=2", "nnodes=3", "trainer.seed=7")
    assert (apart.engine_apart, apart.rollout_ahead, apart.max_staleness) == (True, True, 2)
    assert (apart.world_size, apart.seed, apart.old_log_probs) == (6, 7, SCORED_LOG_PROBS)
    assert apart.engine_place() == " in a worker of its own, rollouts up to 2 versions ahead"
    packed = plan_of("rollout.packing=true", "rollout.max_episode_length=512", "rollout.share_prompts=true")
    assert (packed.packing_capacity, packed.share_prompts) == (512, True)
    assert plan_of("rollout.packing=false").packing_capacity is None and plan_of("trainer.device=cpu").device == "cpu"
    colocated = plan_of("actor_rollout_ref.actor.recompute_old_log_probs=false")
    assert (colocated.engine_apart, colocated.old_log_probs, colocated.engine_place()) == (False, ENGINE_LOG_PROBS, "")


def test_the_plan_is_frozen_and_reaches_the_ranks_unchanged():
    plan = plan_of(*AHEAD)
    assert pickle.loads(pickle.dumps(plan)) == plan == plan_of(*AHEAD)
    with pytest.raises(FrozenInstanceError):
        plan.max_staleness = 0


@pytest.mark.parametrize(
    "epochs,mini,kl_in_reward,staleness",
    [(1, 8, False, 0), (2, 8, False, 0), (1, 4, False, 0), (1, 8, True, 0), (1, 8, False, 1)],
)
def test_old_log_prob_pass_is_needed_when_the_update_moves_before_it_reads_them(epochs, mini, kl_in_reward, staleness):
    plan = replace(plan_of(), ppo_epochs=epochs, ppo_mini_batch_size=mini, kl_in_reward=kl_in_reward, max_staleness=staleness)
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
                if ahead and cores >= 2 and cores - cores // 2 >= ranks:  # both at once: no more than the node
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
    "recompute_old_log_probs",
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
        if tok.type in (tokenize.STRING, tokenize.COMMENT) or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
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
    assert config_reads("seed = int(self.cfg.trainer.seed)\nn = t.get('nnodes', 1)") == ["trainer.seed", "get('nnodes'"]
    assert config_reads('log("rollout.max_staleness=%d", self.plan.max_staleness)') == []


# What a rank of a worker group runs: built from the plan and its role's typed section alone.
RANK_MODULES = ("worker", "policy", "critic", "update", "scoring", "fsdp", "lora", "sharded", "streaming", "rollout_worker")
ROOT_SECTIONS = re.compile(r"\b\w*cfg\w*\s*(?:\.\s*|\[\s*)(actor_rollout_ref|critic|trainer|rollout|algorithm|data)\b")


def test_no_rank_reads_the_root_config():
    reads = [
        f"workers/{name}.py: {m.group(0)}"
        for name in RANK_MODULES
        for m in ROOT_SECTIONS.finditer(_code_without_strings((GRL / "workers" / f"{name}.py").read_text()))
    ]
    assert reads == []
    assert ROOT_SECTIONS.search("temperature = self.cfg.actor_rollout_ref.rollout.temperature")
    assert not ROOT_SECTIONS.search("size = self.section.rollout.log_prob_micro_batch_size_per_gpu")


# Who reads which part of the root config. The builders check the whole config and build the plan and
# the components from it; every other module reads the root sections its component owns (a root key or
# a dotted prefix; `[]` is a task instance, cfg[name]) and takes the rest from the plan.
BUILDERS = ("config.py", "run_plan.py", "preflight.py", "train.py", "cli.py", "schema/")
TASKS = "[]"
ROLLOUT_OWNS = {"rollout", "tools", "max_prompt_length", "max_response_length", TASKS}
OWNERS = {
    "trainer/": {"trainer", "algorithm", "typed:algorithm", "rollout", TASKS},  # the loop, advantages, its rollout settings
    "rollout/": ROLLOUT_OWNS,
    "gateway/": ROLLOUT_OWNS,  # the rollout of agent programs
    # The planner models the workers from the typed sections their groups build them from, the engine's
    # cache from the rollout's worst case, and owns the memory it plans for.
    "planner/": {*ROLLOUT_OWNS, "trainer.gpu_memory_gb", "typed:actor_rollout_ref", "typed:critic"},
    "workers/group.py": {"typed:actor_rollout_ref", "typed:critic"},  # each rank gets its role's section
}
ROOT_READ = re.compile(r"(?<![\w.])(?:self\s*\.\s*)?cfg\s*(?:\.\s*(\w+)(?:\s*\.\s*(\w+))?|\[)")
TYPED_READ = re.compile(r"""typed_section\(\s*(?:self\.)?cfg\s*,\s*["'](\w+)["']""")


def root_reads(source: str) -> set[str]:
    """The root config's sections read in `source`, as `section.key`, `key`, `[]` or `typed:section`."""
    reads = {f"typed:{m.group(1)}" for m in TYPED_READ.finditer(source)}
    for m in ROOT_READ.finditer(_code_without_strings(source)):
        reads.add(TASKS if m.group(1) is None else ".".join(filter(None, m.groups())))
    return reads


def test_each_module_reads_only_the_config_its_component_owns():
    from typing import get_type_hints

    from grl.schema import GRLConfig

    root_keys = set(get_type_hints(GRLConfig))
    strays = []
    for path in sorted(GRL.rglob("*.py")):
        name = path.relative_to(GRL).as_posix()
        if name.startswith(BUILDERS):
            continue
        owned = next((keys for prefix, keys in OWNERS.items() if name.startswith(prefix)), set())
        for read in root_reads(path.read_text()):
            key = read.removeprefix("typed:").split(".")[0]
            if read != TASKS and key not in root_keys:
                continue  # an attribute of something else called cfg, e.g. a task instance's block
            if not any(read == o or read.startswith(o + ".") for o in owned):
                strays.append(f"{name}: {read}")
    assert strays == []
    # the scan finds each kind of read, and not the ones in messages or of other objects
    assert root_reads("x = self.cfg.actor_rollout_ref.actor.use_kl_loss") == {"actor_rollout_ref.actor"}
    assert root_reads("b = cfg[name].agent_config\nn = cfg.max_response_length") == {TASKS, "max_response_length"}
    assert root_reads('s = typed_section(cfg, "critic")  # cfg.trainer.seed') == {"typed:critic"}
    assert root_reads('log("cfg.trainer.seed"); train_cfg.ppo_epochs; self.section.rollout.name') == set()
