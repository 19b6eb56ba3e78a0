"""The estimator registry: a new advantage estimator is its function with `@register_estimator` (and, for a
new hyperparameter, its `algorithm` key); the config's choices and rules, the trainer's inputs and
the dispatch follow from what its parameters read."""

import json
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

import grl.composition
import grl.config
import grl.sections
from grl.config import notes as config_notes
from grl.algo import ESTIMATORS, compute_advantage, make_kl_controller, register_estimator
from grl.config import ConfigError, load_config, typed_section
from grl.rollout import Batch
from grl.schema import Algorithm, GRLConfig, key, section
from grl.trainer.transforms import add_advantages
from tests.algo.batches import random_episode_batch

LOSS_MASK = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])
TOKEN_REWARDS = torch.tensor([[0.0, 0.0, 2.0], [0.0, 1.0, 0.0], [0.0, 5.0, 0.0]])


@pytest.fixture(autouse=True)
def registry_as_it_was():
    before = dict(ESTIMATORS)
    yield
    ESTIMATORS.clear()
    ESTIMATORS.update(before)


def register_group_mean():
    @register_estimator("toy")
    def group_mean(episode_scores, loss_mask, group_ids):
        """Each episode's score less its group's mean, on every generated token."""
        groups = torch.as_tensor(group_ids)
        means = torch.stack([episode_scores[groups == g].mean() for g in groups])
        advantages = torch.where(loss_mask > 0, (episode_scores - means)[:, None], 0.0)
        return advantages, advantages


def test_an_estimator_that_reads_group_ids_is_configured_checked_and_dispatched():
    register_group_mean()
    assert ESTIMATORS["toy"].group_based and not ESTIMATORS["toy"].needs_critic
    cfg = load_config(["algorithm.adv_estimator=toy", "critic.enable=false", "rollout.agent_group_size=[2]"])
    assert config_notes(cfg) == []
    with pytest.raises(ConfigError, match=r"rollout\.agent_group_size: .* toy"):
        load_config(["algorithm.adv_estimator=toy", "rollout.agent_group_size=[1]"])
    inputs = {"token_rewards": TOKEN_REWARDS, "loss_mask": LOSS_MASK, "group_ids": [0, 0, 1]}
    advantages, returns = compute_advantage(inputs, Algorithm(adv_estimator="toy"))
    assert torch.equal(advantages, torch.tensor([[0.0, 0.5, 0.5], [-0.5, -0.5, 0.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(returns, advantages)
    with pytest.raises(ValueError, match="'group_ids'"):
        compute_advantage(
            {"token_rewards": TOKEN_REWARDS, "loss_mask": LOSS_MASK}, Algorithm(adv_estimator="toy")
        )


def test_an_estimator_that_reads_values_needs_the_critic_and_is_whitened_as_declared():
    @register_estimator("toy", whiten=True)
    def critic_toy(token_rewards, values, loss_mask):
        advantages = (token_rewards - values) * loss_mask
        return advantages, advantages

    with pytest.raises(ConfigError, match="critic.enable: estimator toy needs the critic"):
        load_config(["algorithm.adv_estimator=toy", "critic.enable=false"])
    inputs = {"token_rewards": TOKEN_REWARDS, "loss_mask": LOSS_MASK, "values": 0.5 * LOSS_MASK}
    advantages, _ = compute_advantage(inputs, Algorithm(adv_estimator="toy"))
    assert advantages[LOSS_MASK > 0].mean().abs() < 1e-6 and advantages[LOSS_MASK > 0].std() == pytest.approx(
        1.0, abs=1e-5
    )
    raw, _ = compute_advantage(inputs, Algorithm(adv_estimator="toy"), whiten=False)
    assert torch.equal(raw, (TOKEN_REWARDS - 0.5) * LOSS_MASK)


def test_an_unregistered_name_is_refused():
    assert "toy" not in ESTIMATORS
    with pytest.raises(ConfigError, match="algorithm.adv_estimator: 'toy' is not one of gae, "):
        load_config(["algorithm.adv_estimator=toy"])


def test_a_registration_names_the_parameter_it_cannot_fill():
    def tempered(token_rewards, loss_mask, temperature):
        return token_rewards, token_rewards

    with pytest.raises(
        ValueError,
        match=r"'toy': parameter 'temperature' of tempered is neither a batch input \(token_rewards,",
    ):
        register_estimator("toy")(tempered)
    with pytest.raises(ValueError, match="'toy': hyperparameter 'gamma' is not a parameter of tempered"):
        register_estimator("toy", hyperparameters=("gamma", "temperature"))(tempered)
    assert "toy" not in ESTIMATORS
    register_estimator("toy", hyperparameters=("temperature",))(tempered)
    assert ESTIMATORS["toy"].inputs == ("token_rewards", "loss_mask")


def test_a_hyperparameter_the_schema_lacks_is_a_config_error():
    @register_estimator("toy", hyperparameters=("score_scale",))
    def scaled(episode_scores, loss_mask, score_scale):
        return episode_scores, episode_scores

    with pytest.raises(
        ConfigError, match=r"^algorithm\.score_scale: toy reads it, but the schema declares no such key"
    ):
        load_config(["algorithm.adv_estimator=toy"])


# A new hyperparameter is one key(...) line in the schema's `algorithm` section; the test adds it to a
# subclass that the run's schema uses, where a contributor would add the line to grl/schema/run.py.
@dataclass
class AlgorithmWithScale(Algorithm):
    score_scale: float = key(1.0, "s in A = s * score (scaled_score)", gt=0)


@dataclass
class ConfigWithScale(GRLConfig):
    algorithm: AlgorithmWithScale = section(AlgorithmWithScale)


def test_a_new_estimator_with_a_new_hyperparameter_is_its_function_registration_and_schema_key(monkeypatch):
    for module in (grl.config, grl.composition, grl.sections):  # the typed check, Hydra, the sections
        monkeypatch.setattr(module, "GRLConfig", ConfigWithScale)

    @register_estimator("scaled_score", hyperparameters=("score_scale",))  # its registration
    def scaled_score(episode_scores, loss_mask, score_scale):  # its function
        advantages = torch.where(loss_mask > 0, score_scale * episode_scores[:, None], 0.0)
        return advantages, advantages

    cfg = load_config(
        ["algorithm.adv_estimator=scaled_score", "algorithm.score_scale=3.0", "critic.enable=false"]
    )
    algorithm = typed_section(cfg, "algorithm")  # what the trainer hands add_advantages
    assert isinstance(algorithm, AlgorithmWithScale) and algorithm.score_scale == 3.0
    batch = Batch(
        {
            "token_rewards": TOKEN_REWARDS,
            "loss_mask": LOSS_MASK,
            "turn_ids": torch.zeros(3, 3, dtype=torch.long),
        },
        {"group_id": [0, 0, 1]},
    )
    assert add_advantages(batch, algorithm, make_kl_controller("fixed", 0.0)) == {}
    scores = [2.0, 1.0, 5.0]  # each row's rewards on its generated tokens
    expected = torch.tensor(
        [[0.0, 3 * scores[0], 3 * scores[0]], [3 * scores[1], 3 * scores[1], 0.0], [0.0, 3 * scores[2], 0.0]]
    )
    assert torch.equal(batch["advantages"], expected) and torch.equal(batch["returns"], expected)
    with pytest.raises(ConfigError, match=r"^algorithm\.score_scale: must be > 0"):
        load_config(
            ["algorithm.adv_estimator=scaled_score", "algorithm.score_scale=0", "critic.enable=false"]
        )


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_an_estimator_runs_on_the_inputs_it_declares(name):
    """Only what the properties declare is handed over (the trainer builds no critic and no state
    keys otherwise), and it is enough."""
    spec = ESTIMATORS[name]
    batch = random_episode_batch(6, 1234)
    optional = {
        "values": (spec.needs_critic, batch.pop("values")),
        "group_ids": (spec.group_based, [0, 0, 0, 1, 1, 1]),
        "turn_states": (
            spec.needs_step_keys,
            torch.zeros(6, int(batch["turn_ids"].max()) + 1, dtype=torch.long),
        ),
        "teacher_log_probs": (spec.needs_teacher, -torch.rand(batch["loss_mask"].shape)),
        "student_log_probs": (spec.needs_teacher, -torch.rand(batch["loss_mask"].shape)),
    }
    given = {key: value for key, (declared, value) in optional.items() if declared}
    advantages, returns = compute_advantage({**batch, **given}, Algorithm(adv_estimator=name))
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()


def test_the_registry_holds_grls_estimators_before_torch_loads():
    code = (
        "import json, sys\nfrom grl.algo.estimators import ESTIMATORS\n"
        "print(json.dumps([list(ESTIMATORS), ESTIMATORS['gae'].needs_critic, 'torch' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [list(ESTIMATORS), True, False]
