"""From a composed GRL config to a training batch."""

from pathlib import Path

import pytest

from grl.config import load_config, run_sections
from grl.engines.base import SamplingParams
from grl.rollout import (
    MultiTurnRollout,
    build_batch,
    filter_groups,
    normalize_episode_scores,
    task_specs,
    training_base_seed,
)

GSM8K_TEST = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl"


@pytest.mark.shared_data("gsm8k/test.jsonl")
def test_config_rollout_to_shaped_batch(hf_engine, tokenizer):
    cfg = load_config(
        [
            "rollout.training=[simpleSokobanAgent,gsm8kAgent_5_turn]",
            "rollout.agent_group_num=[2,2]",
            "rollout.agent_group_size=[2,3]",
            "max_response_length=4",
            "rollout.seed=7",
            "simpleSokobanAgent.agent_config.max_turns=2",
            "gsm8kAgent_5_turn.agent_config.max_turns=2",
            f"gsm8kAgent_5_turn.env_config.data_path={GSM8K_TEST}",
            "gsm8kAgent_5_turn.env_config.split=test",
            "rollout.reward_normalization.grouping=batch",
            "rollout.reward_normalization.method=mean_std",
            "rollout.rollout_filter_ratio=0.5",
        ]
    )
    run = run_sections(cfg)
    ro = MultiTurnRollout.from_config(run.rollout, run.data, run.tools, hf_engine, tokenizer)
    assert ro.max_response_length == 4 and ro.env_step_timeout == 60
    base = training_base_seed(cfg.rollout.seed, step=3)
    assert base == 7 + 3 * 100003
    episodes = ro.run(
        task_specs(run.rollout, run.tasks), base, SamplingParams(temperature=1.0, seed=0)
    ).episodes
    assert [(e.group_id, e.seed) for e in episodes] == [
        (g, base + g) for g, n in ((0, 2), (1, 2), (2, 3), (3, 3)) for _ in range(n)
    ]
    r = cfg.rollout
    scores = normalize_episode_scores(
        episodes, r.reward_normalization.grouping, r.reward_normalization.method
    )
    kept, metrics = filter_groups(episodes, r.rollout_filter_ratio, r.rollout_filter_type)
    # Half of each task's two groups survive: one sokoban group of 2, one gsm8k group of 3.
    assert metrics["simpleSokobanAgent/kept_groups"] == 1 and metrics["gsm8kAgent_5_turn/kept_groups"] == 1
    score_of = dict(zip((e.uid for e in episodes), scores))
    batch, _ = build_batch(
        kept,
        use_turn_scores=r.use_turn_scores,
        max_episode_length=r.max_episode_length,
        pad_token_id=tokenizer.pad_token_id,
        scores=[score_of[e.uid] for e in kept],
    )
    assert sorted(batch.meta["task"]) == ["gsm8kAgent_5_turn"] * 3 + ["simpleSokobanAgent"] * 2
    assert batch.meta["episode_score"] == pytest.approx([score_of[u] for u in batch.meta["uid"]])
    assert batch["token_rewards"].sum(-1).tolist() == pytest.approx(batch.meta["episode_score"], abs=1e-6)


def test_gigpo_through_the_real_rollout(hf_engine, tokenizer):
    """Sokoban with the tiny random model: its replies are rarely valid moves, so agents stand
    still and revisit states; the state keys the rollout records reach GiGPO's anchor groups."""
    import hashlib
    import statistics

    import torch

    from grl.algo import make_kl_controller
    from grl.envs import make
    from grl.trainer.transforms import add_advantages

    cfg = load_config(
        [
            "rollout.training=[simpleSokobanAgent]",
            "rollout.agent_group_num=[2]",
            "rollout.agent_group_size=[3]",
            "max_response_length=4",
            "rollout.seed=11",
            "simpleSokobanAgent.agent_config.max_turns=3",
            "algorithm.adv_estimator=gigpo",
            "algorithm.gamma=0.9",
            "algorithm.gigpo_step_weight=0.5",
        ]
    )
    run = run_sections(cfg)
    episodes = (
        MultiTurnRollout.from_config(run.rollout, run.data, run.tools, hf_engine, tokenizer)
        .run(task_specs(run.rollout, run.tasks), 0, SamplingParams(temperature=1.0, seed=0))
        .episodes
    )
    env = make("sokoban", **cfg.simpleSokobanAgent.env_config)
    for ep in episodes:  # the first turn acted on the reset observation
        assert ep.turns[0].state_key == hashlib.sha1(env.reset(ep.seed).encode()).hexdigest()
    assert any(t.state_key == ep.turns[0].state_key for ep in episodes for t in ep.turns[1:])
    batch, _ = build_batch(episodes, use_turn_scores=True, pad_token_id=tokenizer.pad_token_id)
    add_advantages(batch, cfg.algorithm, make_kl_controller("fixed", 0.0))

    # the reference: per episode and turn from the Episode records themselves
    returns = {}
    for ep in episodes:
        g = 0.0
        for k in reversed(range(len(ep.turns))):
            g = ep.turns[k].reward + 0.9 * g
            returns[ep.uid, k] = g
    step_advs = []
    for row, ep in enumerate(episodes):
        mates = [e for e in episodes if e.group_id == ep.group_id]
        scores = [e.score for e in mates]
        episode_adv = (ep.score - statistics.mean(scores)) / (statistics.stdev(scores) + 1e-6)
        for k, turn in enumerate(ep.turns):
            anchor = [
                returns[e.uid, j]
                for e in mates
                for j, t in enumerate(e.turns)
                if t.state_key == turn.state_key
            ]
            step_adv = (
                0.0
                if len(anchor) == 1
                else (returns[ep.uid, k] - statistics.mean(anchor)) / (statistics.stdev(anchor) + 1e-6)
            )
            step_advs.append(step_adv)
            on_turn = (batch["turn_ids"][row] == k) & (batch["loss_mask"][row] > 0)
            expected = torch.full((int(on_turn.sum()),), episode_adv + 0.5 * step_adv)
            torch.testing.assert_close(
                batch["advantages"][row][on_turn].double(), expected.double(), atol=1e-5, rtol=0
            )
    assert any(abs(a) > 0.1 for a in step_advs)  # some anchor group had returns to compare
