"""Valid-action decoding end to end: a constrained rollout of the real games through the actor
group's engine, the token batch, and the trainer's log-probs (the ranks scoring padded or packed rows) of the
same tokens.
The policy that is trained must be the policy that acted: same mask, same temperature."""

from dataclasses import replace
from pathlib import Path

import pytest
from grl.config import compose, run_sections, validate
from grl.engines import sampling_from_config
from grl.rollout import MultiTurnRollout, build_batch, task_specs
from grl.rollout.types import Batch
from grl.run_plan import RunPlan
from grl.trainer.metrics import rollout_mismatch_metrics

WEBSHOP = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "webshop"
# WebShop: free <think> text, then a click or a search with free-text keywords.
TASKS = ["simpleSokobanAgent", "blocksworldAgent_text", "tetrisAgent_type_1_dim_4", "webshopAgent"]
pytestmark = [
    pytest.mark.slow,  # a two-rank actor group and rollouts of four tasks
    pytest.mark.shared_data("webshop/products_1k.jsonl", "webshop/items_ins_v2_1000.json"),
]


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("constrained")
    overrides = {
        "model_path": "tiny",
        "trainer.device": "cpu",
        "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.rollout.temperature": 0.7,
        "max_response_length": 48,
        "max_prompt_length": 4096,
        "rollout.training": f"[{','.join(TASKS)}]",
        "rollout.agent_group_num": f"[{','.join(['2'] * len(TASKS))}]",
        "rollout.agent_group_size": f"[{','.join(['2'] * len(TASKS))}]",
        "trainer.run_dir": str(tmp / "run"),
        "trainer.default_local_dir": str(tmp / "ckpt"),
        "critic.enable": False,
        "algorithm.adv_estimator": "grpo",
    }
    for task in TASKS:
        overrides[f"{task}.agent_config.action_decoding"] = "constrained"
        overrides[f"{task}.agent_config.max_turns"] = 3
    overrides["webshopAgent.env_config.products_path"] = str(WEBSHOP / "products_1k.jsonl")
    overrides["webshopAgent.env_config.title_parser"] = "plain"
    overrides["webshopAgent.env_config.goals_path"] = str(WEBSHOP / "items_ins_v2_1000.json")
    return validate(compose([f"{k}={v}" for k, v in overrides.items()]))


@pytest.fixture(scope="module")
def actor(cfg):
    from grl.workers import ActorRolloutRefGroup, init_ray

    init_ray(None, num_cpus=2)
    group = ActorRolloutRefGroup.from_config(cfg, RunPlan.from_config(cfg))
    yield group
    group.shutdown()


@pytest.fixture(params=[False, True], ids=["padded", "packed"])
def packing(request, actor, cfg):
    """`rollout.packing` of the actor group (its plan's packing capacity): whether the ranks score packed
    rows."""
    planned = actor.plan
    actor.plan = replace(planned, packing_capacity=cfg.rollout.max_episode_length if request.param else None)
    yield request.param
    actor.plan = planned


@pytest.fixture(scope="module")
def episodes(cfg, actor):
    from grl.models import load_tokenizer

    run = run_sections(cfg)
    rollout = MultiTurnRollout.from_config(
        run.rollout, run.data, run.tools, actor.engine, load_tokenizer(run.actor_rollout_ref.model.path)
    )
    sampling = sampling_from_config(run.actor_rollout_ref.rollout, validate=False, max_new_tokens=48)
    result = rollout.run(task_specs(run.rollout, run.tasks), 7, sampling)
    rollout.close()
    return result


def test_every_constrained_answer_parses_and_every_action_is_valid(episodes):
    for task in TASKS:
        assert episodes.metrics[f"{task}/format_ok"] == 1.0
        assert episodes.metrics[f"{task}/action_is_valid"] == 1.0
    assert all(t.response_allowed is not None for ep in episodes.episodes for t in ep.turns)


def test_trainer_log_probs_equal_the_engine_s(actor, episodes, packing):
    batch, _ = build_batch(episodes.episodes, max_episode_length=4096)
    assert batch["constraint_ids"].dim() == 1 and batch["constraint_size"].shape == batch["input_ids"].shape
    batch["old_log_probs"], _ = actor.compute_log_probs(batch)
    mismatch = rollout_mismatch_metrics(batch)
    assert mismatch["training/rollout_logprob_diff_max"] < 1e-4, mismatch
    # Scored without the mask, the same tokens get other log-probs: the check above can fail.
    plain = Batch({k: v for k, v in batch.tensors.items() if not k.startswith("constraint")}, batch.meta)
    plain["old_log_probs"], _ = actor.compute_log_probs(plain)
    assert rollout_mismatch_metrics(plain)["training/rollout_logprob_diff_max"] > 1e-2


def test_with_a_context_window_the_trainer_scores_what_the_engine_saw(cfg, actor, packing):
    """agent_config.max_context_window=1: every turn is prompted afresh with the last turn and the
    current board; the actor group scores each reply from that prompt alone."""
    from grl.models import load_tokenizer

    run = run_sections(cfg)
    specs = task_specs(run.rollout, run.tasks)[:2]
    for spec in specs:
        spec.config.agent_config.max_context_window = 1
    rollout = MultiTurnRollout.from_config(
        run.rollout, run.data, run.tools, actor.engine, load_tokenizer(run.actor_rollout_ref.model.path)
    )
    sampling = sampling_from_config(run.actor_rollout_ref.rollout, validate=False, max_new_tokens=48)
    result = rollout.run(specs, 13, sampling)
    rollout.close()
    batch, _ = build_batch(result.episodes, max_episode_length=4096)
    assert int(batch["context_ids"].max()) == 3  # some episode played all three turns
    batch["old_log_probs"], _ = actor.compute_log_probs(batch)
    assert rollout_mismatch_metrics(batch)["training/rollout_logprob_diff_max"] < 1e-4
    whole = Batch({k: v for k, v in batch.tensors.items() if k != "context_ids"}, batch.meta)
    whole["old_log_probs"], _ = actor.compute_log_probs(whole)  # one chat: later replies see earlier prompts
    assert rollout_mismatch_metrics(whole)["training/rollout_logprob_diff_max"] > 1e-2


def test_left_truncation_shows_in_the_mismatch_metrics(cfg, actor):
    """The engine samples from a left-truncated prompt while the trainer scores the whole episode:
    the trained policy is then not the one that acted, and the metrics say so."""
    from grl.models import load_tokenizer

    rollout = MultiTurnRollout(
        actor.engine,
        load_tokenizer(cfg.actor_rollout_ref.model.path),
        max_prompt_length=128,
        max_response_length=48,
    )
    sampling = sampling_from_config(cfg.actor_rollout_ref.rollout, validate=False, max_new_tokens=48)
    run = run_sections(cfg)
    result = rollout.run(task_specs(run.rollout, run.tasks)[:1], 11, sampling)
    rollout.close()
    assert result.metrics["rollout/truncated_prompts"] > 0
    batch, _ = build_batch(result.episodes, max_episode_length=4096)
    batch["old_log_probs"], _ = actor.compute_log_probs(batch)
    assert rollout_mismatch_metrics(batch)["training/rollout_logprob_diff_max"] > 1e-2
