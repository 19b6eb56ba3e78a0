"""Keys that two places used to read two ways (issue 26), each with one behaviour now: whichever
spelling sets a value, the consumers (engine, rollout, workers, trainer) read the same typed value, and
a bad value gets the same error, naming the key that is read."""

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from grl.config import notes as config_notes
from grl.config import NO_EFFECT, ConfigError, load_config, run_sections
from grl.engines import sampling_from_config
from grl.run_plan import RunPlan
from grl.trainer import agent_trainer
from grl.trainer.agent_trainer import AgentTrainer


def verdict(overrides: list[str]) -> str | None:
    """None if the config loads (its keys and their rules together), else the key the error names."""
    try:
        config_notes(load_config(["model_path=tiny", *overrides]))
    except ConfigError as err:
        return str(err).split(":", 1)[0]
    return None


TOP_K = [(-1, True), (0, True), (1, True), (40, True), (-2, False)]  # (value, accepted): -1 and 0 are off


@pytest.mark.parametrize("validate", [False, True], ids=["rollout.top_k", "rollout.val_kwargs.top_k"])
@pytest.mark.parametrize("top_k, accepted", TOP_K)
def test_top_k_config_and_engines_agree(top_k, accepted, validate):
    """What the config accepts the engine runs with, unchanged; what it refuses never reaches the engine."""
    key = "actor_rollout_ref.rollout.val_kwargs.top_k" if validate else "actor_rollout_ref.rollout.top_k"
    overrides = [f"{key}={top_k}", "actor_rollout_ref.rollout.val_kwargs.do_sample=true"]
    assert verdict(overrides) == (None if accepted else key)
    if accepted:
        cfg = load_config(overrides)
        assert sampling_from_config(cfg.actor_rollout_ref.rollout, validate, 16).top_k == top_k


LENGTHS = {  # the key the rollout and the planner read -> its other spellings (the engine reads the last)
    "max_prompt_length": ("data.max_prompt_length", "actor_rollout_ref.rollout.prompt_length"),
    "max_response_length": ("data.max_response_length", "actor_rollout_ref.rollout.response_length"),
}
SPELLINGS = [(key, spelling) for key, aliases in LENGTHS.items() for spelling in (key, *aliases)]


@pytest.mark.parametrize("key, spelling", SPELLINGS, ids=[s for _, s in SPELLINGS])
def test_every_length_spelling_sets_what_rollout_and_engine_read(key, spelling):
    cfg = load_config([f"{spelling}=100"])
    assert {OmegaConf.select(cfg, name) for name in (key, *LENGTHS[key])} == {100}
    with pytest.raises(ConfigError, match=rf"^{key}: must be an integer >= 1, got 0$"):
        load_config([f"{spelling}=0"])


def test_two_spellings_of_one_key_cannot_disagree():
    with pytest.raises(
        ConfigError,
        match=r"^actor_rollout_ref\.rollout\.prompt_length: 400 disagrees with "
        r"data\.max_prompt_length=300",
    ):
        load_config(["data.max_prompt_length=300", "actor_rollout_ref.rollout.prompt_length=400"])
    assert (
        load_config(
            ["data.max_prompt_length=300", "actor_rollout_ref.rollout.prompt_length=300"]
        ).max_prompt_length
        == 300
    )


@pytest.mark.parametrize("top_k, accepted", TOP_K)
def test_top_k_rule_is_vllms(top_k, accepted):
    import vllm

    try:
        vllm.SamplingParams(top_k=top_k)
    except Exception:  # noqa: BLE001 - vLLM's own validation error
        assert not accepted
    else:
        assert accepted


ACTOR_MICRO = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
# (overrides, the key refused or None): the workers' keys are checked, whichever spelling set them
MICRO_BATCH = [
    (["micro_batch_size_per_gpu=64"], ACTOR_MICRO),
    ([f"{ACTOR_MICRO}=64"], ACTOR_MICRO),
    (["actor_rollout_ref.actor.ppo_mini_batch_size=2"], ACTOR_MICRO),
    (["ppo_mini_batch_size=2", "micro_batch_size_per_gpu=2"], None),
    ([f"{ACTOR_MICRO}=0"], ACTOR_MICRO),
    (["micro_batch_size_per_gpu=0"], ACTOR_MICRO),
    (["critic.ppo_mini_batch_size=2"], "critic.ppo_micro_batch_size_per_gpu"),
    (["critic.ppo_mini_batch_size=2", "algorithm.adv_estimator=rloo", "critic.enable=false"], None),
]


@pytest.mark.parametrize("overrides, key", MICRO_BATCH, ids=[" ".join(o) for o, _ in MICRO_BATCH])
def test_micro_batch_is_checked_on_the_key_the_workers_read(overrides, key):
    assert verdict(overrides) == key


@pytest.mark.parametrize("freq, accepted", [(-1, True), (0, True), (3, True), (-2, False)])
@pytest.mark.parametrize("name", ["test_freq", "save_freq"])
def test_verls_freq_zero_is_accepted(name, freq, accepted):
    assert verdict([f"{name}={freq}"]) == (None if accepted else f"trainer.{name}")


@pytest.mark.parametrize("freq, tests, saves", [(-1, [], [6]), (0, [], [6]), (3, [3, 6], [3, 6])])
def test_the_trainer_reads_freq_zero_as_off(freq, tests, saves, tmp_path, monkeypatch):
    """-1 and 0 alike: no validation and only the final checkpoint."""
    cfg = load_config(
        [
            "model_path=tiny",
            f"test_freq={freq}",
            f"save_freq={freq}",
            "total_training_steps=6",
            "trainer.val_before_train=false",
            "trainer.export_hf=false",
            "trainer.logger=[jsonl]",
            f"trainer.run_dir={tmp_path}/run",
            f"trainer.default_local_dir={tmp_path}/ckpt",
        ]
    )
    trainer = AgentTrainer(run_sections(cfg), RunPlan.from_config(cfg), None, None, None)
    ran = {"validate": [], "save": []}
    monkeypatch.setattr(agent_trainer, "resume", lambda trainer: None)
    monkeypatch.setattr(agent_trainer, "start_report", lambda *args, **kw: "")
    monkeypatch.setattr(agent_trainer, "save", lambda trainer: ran["save"].append(trainer.global_step) or {})
    monkeypatch.setattr(trainer, "train_step", lambda step: ({}, None))
    monkeypatch.setattr(trainer.certificate, "certify", lambda *args: {})
    monkeypatch.setattr(
        trainer, "actor", SimpleNamespace(weights_check=None)
    )  # no ranks: the loop alone is tested
    monkeypatch.setattr(trainer, "validate", lambda: ran["validate"].append(trainer.global_step) or {})
    monkeypatch.setattr(trainer, "close", lambda **kw: None)
    trainer.fit()
    assert ran == {"validate": tests, "save": saves}


@pytest.mark.parametrize("key", list(NO_EFFECT))
def test_keys_nothing_reads_are_accepted_with_a_note(key):
    behaves_as, why = NO_EFFECT[key]
    # a list, not a dict: 0 == False, and a dict would give the bool keys the int's value
    others = [
        (True, "false"),
        (False, "true"),
        ("fsdp2", "fsdp"),
        (0, "8"),
        (16.0, "32"),
        ("all-linear", "[q_proj]"),
    ]
    other = next(o for value, o in others if type(value) is type(behaves_as) and value == behaves_as)
    cfg = load_config([f"{key}={other}"])
    assert f"{key}: {OmegaConf.select(cfg, key)!r} has no effect (GRL compatibility): {why}" in config_notes(
        cfg
    )
    assert not any(note.startswith(key) for note in config_notes(load_config([])))


@pytest.mark.parametrize("estimator, critic", [("gae", True), ("grpo", False), ("rebn", False)])
def test_critic_follows_the_estimator_and_the_notes_only_read(estimator, critic):
    from grl.planner import plan

    cfg = load_config(
        ["model_path=tiny", f"algorithm.adv_estimator={estimator}", "rollout.agent_group_size=[2]"]
    )
    before = OmegaConf.to_yaml(cfg)
    config_notes(cfg)
    assert OmegaConf.to_yaml(cfg) == before
    assert ("update_critic" in plan(run_sections(cfg)).phases) is critic


@pytest.mark.parametrize(
    "shorthand,key,value",
    [
        ("total_training_steps", "trainer.total_training_steps", 50),
        ("test_freq", "trainer.test_freq", 0),
        ("experiment_name", "trainer.experiment_name", "mine"),
    ],
)
def test_a_one_to_one_shorthand_shows_the_value_its_nested_key_is_given(shorthand, key, value):
    """The nested key is read; set there (over a preset that set the shorthand), both show it."""
    cfg = load_config(["preset=cpu", f"{key}={value}"])
    assert OmegaConf.select(cfg, key) == value and cfg[shorthand] == value
    cfg = load_config(["preset=cpu", f"{shorthand}={value}"])
    assert OmegaConf.select(cfg, key) == value and cfg[shorthand] == value
