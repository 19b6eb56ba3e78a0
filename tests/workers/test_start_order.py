"""The order in which start_groups builds things: on GPU the colocated engine is built only once every
group has loaded (vLLM profiles the device's free memory while it is built, and a critic loading beside
it would change what it measures); on CPU it builds beside the critic's load. Real Ray groups, the tiny
model, the ranks' own wall-clock record of their start-up (`Worker.startup`)."""

from dataclasses import replace
import pytest

from grl.config import compose, run_sections
from grl.run_plan import RunPlan
from grl.workers import start_groups

OVERRIDES = [
    "model_path=tiny",
    "n_gpus_per_node=1",
    "trainer.device=cpu",
    "algorithm.adv_estimator=gae",
    "actor_rollout_ref.rollout.name=hf",
]


def startup_times(engines_last):
    cfg = compose(OVERRIDES)
    plan = RunPlan.from_config(cfg)
    assert plan.use_critic
    actor, critic = start_groups(run_sections(cfg), plan, engines_last=engines_last)
    try:
        return actor.call("startup_times"), critic.call("startup_times")
    finally:
        actor.shutdown()
        critic.shutdown()


@pytest.mark.slow  # Ray and two groups
def test_the_engine_is_built_after_every_group_has_loaded(ray_runtime):
    actor, critic = startup_times(engines_last=True)
    engine_starts = [t["engine_start"] for t in actor if "engine_start" in t]
    assert engine_starts, "no actor rank built an engine"
    loaded = [t["loaded"] for t in actor + critic]
    assert min(engine_starts) >= max(loaded)


@pytest.mark.slow
def test_on_cpu_the_engine_is_built_with_the_actor_s_models(ray_runtime):
    """The default on CPU: the engine is part of the actor's set-up, which runs beside the critic's."""
    actor, _ = startup_times(engines_last=None)
    assert [t["engine_ready"] <= t["loaded"] for t in actor if "engine_ready" in t] == [True]


def test_on_gpu_the_engines_come_last_by_default(monkeypatch):
    """What start_groups does on a GPU, with stand-ins for the groups that record the calls."""
    import grl.workers as workers

    events = []

    class Group:
        role = "stand-in"

        def __init__(self, name, engines_in_setup=True):
            events.append((name, "loaded", engines_in_setup))

        def build_engines(self):
            events.append(("actor", "engines"))

        def call(self, method):
            return [{"loaded": 0.0}]

    monkeypatch.setattr(workers, "init_ray", lambda address: None)
    monkeypatch.setattr(
        workers,
        "ActorRolloutRefGroup",
        lambda section, plan, trainer, rollout, in_setup, teacher_path: Group("actor", in_setup),
    )
    monkeypatch.setattr(
        workers, "CriticGroup", lambda section, plan, trainer, rollout, chunk: Group("critic")
    )
    cfg = compose(OVERRIDES)
    start_groups(
        run_sections(cfg), replace(RunPlan.from_config(cfg), device="cuda")
    )  # a plan resolved on a GPU host
    assert events[-1] == ("actor", "engines")
    assert sorted(events[:-1]) == [("actor", "loaded", False), ("critic", "loaded", True)]
