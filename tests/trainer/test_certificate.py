"""The per-step certificate (grl/trainer/certificate.py).

- its figures, from real episodes and the batch built from them, equal a count by hand, and each limit
  stops the run with one line naming the figure and its key;
- a real run of the tiny model (CPU preset: PPO's old log-probs are the engine's, so the gap is measured
  on a sampled share of the episodes) prints the certificate line every step and logs its values, the
  gap at fp32 noise and every synced tensor checked;
- the same run with one tensor corrupted on its way to the engine stops within the step that synced it,
  with one line naming the tensor: with the engine in the actor's rank and in a rollout worker of its own.
"""

import pytest

from grl.rollout.batch import build_batch
from grl.rollout.types import Episode, Turn
from grl.tracking import METRICS_FILE, read_jsonl
from grl.trainer import RunAborted
from grl.trainer.agent_trainer import AgentTrainer
from grl.trainer.certificate import PREFIX, CertificateBroken, StepCertificate
from grl.schema.certificate import Certificate
from tests.trainer.test_async import config as async_run_config

CORRUPTED = "model.layers.1.mlp.down_proj.weight"


def _episode(member: int, version: int, replies: list[int], new_context_at: int | None = None) -> Episode:
    turns = [
        Turn([1, 2], [3] * n, [-0.5] * n, 0.0, new_context=(i == new_context_at))
        for i, n in enumerate(replies)
    ]
    return Episode(
        task="t", group_id=0, seed=7, turns=turns, score=float(member), member=member, policy_version=version
    )


def test_the_figures_are_the_counts_by_hand_and_each_limit_stops_with_one_line():
    # step 4 trains version 3; the episodes were sampled by versions 3, 2, 2 and 1; the last has no reply
    episodes = [
        _episode(0, 3, [2, 3]),
        _episode(1, 2, [4], None),
        _episode(2, 2, [1, 1, 1], new_context_at=2),
        _episode(3, 1, [0]),
    ]
    batch, _ = build_batch(episodes[:2])  # the update trains on the first two (filtering dropped the others)
    certificate = StepCertificate(Certificate(), max_staleness=2)
    certificate.sampled(episodes)
    rollout = {
        "rollout/infra_failed_episodes": 1.0,
        "gateway/prefix_breaks": 2.0,
        "rollout/truncated_prompts": 1.0,
    }
    values = certificate.measure(
        4, {**rollout, "training/rollout_logprob_diff_mean": 0.25}, batch, weights=None
    )
    assert (
        values[PREFIX + "staleness_max"] == 1.0 and values[PREFIX + "staleness_mean"] == 0.5
    )  # versions 3 and 2
    assert values[PREFIX + "trained_token_share"] == (5 + 4) / (5 + 4 + 3 + 0)
    assert values[PREFIX + "prefix_breaks"] == 1 + 2 + 1  # a windowed turn, the gateway's, a truncated prompt
    assert values[PREFIX + "infra_failed_fraction"] == 1 / 4
    assert values[PREFIX + "logprob_gap_mean"] == 0.25

    limits = {
        "max_logprob_gap": (0.1, "log-prob gap is 0.25 nats, over trainer.certificate.max_logprob_gap=0.1"),
        "max_prefix_breaks_per_episode": (
            0.5,
            "1 prefix breaks per episode, over trainer.certificate.max_prefix_breaks_per_episode",
        ),
        "min_trained_token_share": (
            0.8,
            "trained on 0.75 of the sampled tokens, under trainer.certificate.min_trained_token_share=0.8",
        ),
    }
    assert certificate.broken(values) is None
    for key, (limit, why) in limits.items():
        strict = StepCertificate(Certificate(**{key: limit}), max_staleness=2)
        strict.sampled(episodes)
        with pytest.raises(CertificateBroken) as info:
            strict.certify(4, {**rollout, "training/rollout_logprob_diff_mean": 0.25}, batch, weights=None)
        assert why in str(info.value) and "\n" not in str(info.value), key
    stale = StepCertificate(Certificate(), max_staleness=0)
    stale.sampled(episodes)
    assert "an episode 1 policy versions old was trained on, over rollout.max_staleness=0" in stale.broken(
        values
    )


def config(tmp_path, name, **over):
    """test_async's run of the tiny model (CPU preset), in fp32 (the gap is fp32 noise), PPO's old log-probs
    the engine's, two steps and no validation."""
    return async_run_config(
        tmp_path,
        name,
        **{
            "actor_rollout_ref.model.dtype": "float32",
            "actor_rollout_ref.actor.recompute_old_log_probs": False,
            "total_training_steps": 2,
            "test_freq": -1,
            "trainer.val_before_train": False,
            "trainer.certificate.logprob_check_fraction": 0.5,
            **over,
        },
    )


@pytest.mark.slow
def test_every_step_prints_and_logs_its_certificate(tmp_path, ray_runtime, capsys):
    cfg = config(tmp_path, "good")
    AgentTrainer.from_config(cfg).fit()
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("certificate step")]
    assert [line.split(":")[0] for line in lines] == ["certificate step 1", "certificate step 2"]
    records = {r["step"]: r for r in read_jsonl(tmp_path / "good" / "run" / METRICS_FILE)}
    for step in (1, 2):
        record = records[step]
        assert (
            record[PREFIX + "weights_tensors_checked"] > 10
        )  # every tensor of the tiny model, the tied head once
        assert record[PREFIX + "logprob_gap_tokens"] > 0
        assert record[PREFIX + "logprob_gap_mean"] < 1e-4, record[PREFIX + "logprob_gap_mean"]
        assert record[PREFIX + "staleness_max"] == 0 and record[PREFIX + "infra_failed_fraction"] == 0
        assert 0 < record[PREFIX + "trained_token_share"] <= 1
        assert f"weights {record[PREFIX + 'weights_tensors_checked']:g} tensors equal" in lines[step - 1]


@pytest.mark.slow
@pytest.mark.parametrize("apart", [False, True], ids=["engine in the rank", "engine in a rollout worker"])
def test_a_tensor_corrupted_on_its_way_to_the_engine_stops_the_run_with_one_line(
    tmp_path, ray_runtime, apart
):
    over = {"actor_rollout_ref.hybrid_engine": False, "rollout.max_staleness": 0} if apart else {}
    cfg = config(tmp_path, "broken", **over)

    def corrupt_on_the_way(worker, corrupted_name):
        """In the process that holds the engine: one tensor changes by one value between the trainer and the
        engine."""
        if worker.engine is None:  # an actor rank without an engine
            return
        load = worker.engine.update_weights

        def corrupted(named_tensors):
            items = list(named_tensors.items()) if hasattr(named_tensors, "items") else list(named_tensors)
            for i, (name, tensor) in enumerate(items):
                if name == corrupted_name:
                    tensor = tensor.clone()
                    tensor.view(-1)[0] += 1.0
                    items[i] = (name, tensor)
            load(items)

        worker.engine.update_weights = corrupted

    trainer = AgentTrainer.from_config(cfg)
    (trainer.actor.engine if apart else trainer.actor).execute(corrupt_on_the_way, CORRUPTED)
    with pytest.raises(RunAborted) as info:
        trainer.fit()
    message = str(info.value)
    assert "\n" not in message
    assert "the rollout engine's weights differ from the trainer's after the weight sync in 1 of" in message
    assert repr(CORRUPTED) in message
    # In the rank the sync ends step 1; a rollout worker loads version 1 when step 2's rollout starts.
    assert f"during step {2 if apart else 1}" in message
    assert not (tmp_path / "broken" / "run" / METRICS_FILE).exists() or all(
        r["step"] < (2 if apart else 1) for r in read_jsonl(tmp_path / "broken" / "run" / METRICS_FILE)
    )
