"""Validation with the observation-swap control and the input-dependence measures, through the trainer's
`validate` over a real engine (the tiny model, in-process hf engine, no workers)."""

import pytest

from grl.agents.controls import decoy_seed
from grl.config import compose, run_sections, validate
from grl.engines import make_engine
from grl.models import load_tokenizer
from grl.rollout import MultiTurnRollout
from grl.run_plan import RunPlan
from grl.trainer.agent_trainer import AgentTrainer

TASK = "tetrisAgent_type_1_dim_4"


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("controls")
    overrides = {
        "model_path": "tiny",
        "trainer.device": "cpu",
        "actor_rollout_ref.rollout.name": "hf",
        "max_response_length": 16,
        "rollout.validation": f"[{TASK}]",
        "rollout.validation_agent_group_num": "[6]",
        "rollout.validation_agent_group_size": "[1]",
        "trainer.validation_controls": "[swap]",
        "trainer.run_dir": str(tmp / "run"),
        "trainer.default_local_dir": str(tmp / "ckpt"),
        "critic.enable": False,
        "algorithm.adv_estimator": "grpo",
        f"{TASK}.agent_config.action_decoding": "constrained",
        f"{TASK}.agent_config.enable_think": False,
        f"{TASK}.agent_config.max_turns": 4,
    }
    cfg = validate(compose([f"{k}={v}" for k, v in overrides.items()]))
    engine = make_engine("hf", "tiny", seed=0)
    run = run_sections(cfg)
    rollout = MultiTurnRollout.from_config(run.rollout, run.data, run.tools, engine, load_tokenizer("tiny"))
    trainer = AgentTrainer(run, RunPlan.from_config(cfg), None, None, rollout)
    yield trainer
    trainer.close()
    engine.shutdown()


def test_validation_reports_the_swapped_success_and_the_input_dependence(trainer):
    metrics = trainer.validate()
    for name in ("success", "success_swapped", "input_mi", "input_mi_norm", "answer_cond_entropy"):
        assert 0.0 <= metrics[f"val-env/{TASK}/{name}"] <= max(1.0, metrics[f"val-env/{TASK}/input_mi"])
    assert metrics[f"val-env/{TASK}/input_mi"] <= 1.0986 + 1e-9  # three moves: at most log 3 nats


def test_the_swap_pass_plays_the_same_games_but_shows_the_decoys(trainer):
    trainer.validate()
    validation = trainer.validation
    true_pass = trainer.rollout.run(validation.tasks, 123, validation.sampling)
    swap_pass = validation.controls["swap"].run(validation.tasks, 123, validation.sampling)
    decoys = trainer.rollout.run(validation.tasks, decoy_seed(123), validation.sampling)
    for real, swapped, decoy in zip(true_pass.episodes, swap_pass.episodes, decoys.episodes, strict=True):
        assert swapped.seed == real.seed
        # What the model saw first is the decoy's board, token for token.
        assert swapped.messages[1] == decoy.messages[1]
        assert swapped.turns[0].prompt_ids == decoy.turns[0].prompt_ids
    # Two 4x4 games may open on the same piece; most do not.
    differ = [r.messages[1] != s.messages[1] for r, s in zip(true_pass.episodes, swap_pass.episodes)]
    assert sum(differ) >= len(differ) // 2
