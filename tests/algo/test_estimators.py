"""The estimator registry: a new advantage estimator is one function and one `register` call, and
the config's choices, preflight's rules and the dispatch follow from what it declares."""

import pytest
import torch

from grl import preflight
from grl.algo import ESTIMATORS, compute_advantage, register
from grl.config import ConfigError, load_config
from tests.algo.batches import random_episode_batch

LOSS_MASK = torch.tensor([[0.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
TOKEN_REWARDS = torch.tensor([[0.0, 0.0, 2.0], [0.0, 1.0, 0.0]])


def toy_advantage(x):
    """Every generated token gets its episode's score, unnormalised."""
    advantages = torch.where(x.loss_mask > 0, x.episode_scores[:, None], 0.0)
    return advantages, advantages


@pytest.fixture
def toy():
    yield register("toy", toy_advantage, group_based=True)
    del ESTIMATORS["toy"]


def test_a_registered_estimator_is_configured_checked_and_dispatched(toy):
    cfg = load_config(["algorithm.adv_estimator=toy", "critic.enable=false", "rollout.agent_group_size=[2]"])
    assert preflight.check_numbers(cfg) == []
    with pytest.raises(preflight.PreflightError, match=r"rollout\.agent_group_size: .* toy"):
        preflight.check_numbers(load_config(["algorithm.adv_estimator=toy", "rollout.agent_group_size=[1]"]))
    advantages, returns = compute_advantage("toy", token_rewards=TOKEN_REWARDS, loss_mask=LOSS_MASK, group_ids=[0, 0])
    assert torch.equal(advantages, torch.tensor([[0.0, 2.0, 2.0], [1.0, 1.0, 0.0]])) and torch.equal(returns, advantages)
    with pytest.raises(ValueError, match="'group_ids'"):
        compute_advantage("toy", token_rewards=TOKEN_REWARDS, loss_mask=LOSS_MASK)


def test_a_registered_critic_estimator_needs_the_critic(toy):
    register("toy", toy_advantage, needs_critic=True, whiten=True)
    with pytest.raises(ConfigError, match="critic.enable: estimator toy needs the critic"):
        load_config(["algorithm.adv_estimator=toy", "critic.enable=false"])
    advantages, _ = compute_advantage("toy", token_rewards=TOKEN_REWARDS, loss_mask=LOSS_MASK, values=LOSS_MASK)
    assert advantages[LOSS_MASK > 0].mean().abs() < 1e-6  # whitened by the dispatcher, as declared


def test_an_unregistered_name_is_refused():
    assert "toy" not in ESTIMATORS
    with pytest.raises(ConfigError, match="algorithm.adv_estimator: 'toy' is not one of gae, "):
        load_config(["algorithm.adv_estimator=toy"])


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_an_estimator_runs_on_the_inputs_it_declares(name):
    """Only what the properties declare is handed over (the trainer builds no critic and no state
    keys otherwise), and it is enough."""
    spec = ESTIMATORS[name]
    batch = random_episode_batch(6, 1234)
    optional = {
        "values": (spec.needs_critic, batch.pop("values")),
        "group_ids": (spec.group_based, [0, 0, 0, 1, 1, 1]),
        "turn_states": (spec.needs_step_keys, torch.zeros(6, int(batch["turn_ids"].max()) + 1, dtype=torch.long)),
    }
    given = {key: value for key, (declared, value) in optional.items() if declared}
    advantages, returns = compute_advantage(name, **batch, **given)
    assert torch.isfinite(advantages).all() and torch.isfinite(returns).all()
