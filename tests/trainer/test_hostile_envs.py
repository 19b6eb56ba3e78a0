"""An env written by someone else cannot take down a run: one real 3-step CPU training run (tiny
model, hf engine, valid-action decoding so that every agent acts) with one task per malformed kind
of value. Each task's env misbehaves only for odd seeds (one of its two groups), so every step holds
healthy episodes of every task; at step 3 every env returns NaN rewards, so that step has nothing
to train on and must be skipped. Per task: the kind is counted, as an infrastructure failure where the
episode ended, the run finishes, and each update trained on that task's healthy episodes and on no failed
one."""

import logging
import math
from collections import Counter

import pytest
from omegaconf import OmegaConf

import grl.agents
import grl.envs
from grl.config import compose, validate
from grl.envs.base import Env, step_info
from grl.rollout import (
    build_batch,
    filter_groups,
    normalize_episode_scores,
    rollout_metrics,
    training_base_seed,
)
from grl.rollout.types import Episode, Turn
from grl.tracking import METRICS_FILE, read_jsonl


ACTIONS = ["left", "right"]
BASE_SEED = 0
ALL_BROKEN_FROM = training_base_seed(BASE_SEED, 3)  # every seed of training step 3

INFO = step_info(False, True, True)
# kind -> what the env does on a bad seed: the step result it returns (a function of the good one),
# or "actions" kinds: what valid_actions() does on the second turn.
STEP_FAULTS = {
    "nan_reward": lambda obs, r, d, i: (obs, math.nan, d, i),
    "inf_reward": lambda obs, r, d, i: (obs, math.inf, d, i),
    "neg_inf_reward": lambda obs, r, d, i: (obs, -math.inf, d, i),
    "none_reward": lambda obs, r, d, i: (obs, None, d, i),
    "text_reward": lambda obs, r, d, i: (obs, "1.0 points", d, i),
    "bytes_observation": lambda obs, r, d, i: (obs.encode(), r, d, i),
    "int_observation": lambda obs, r, d, i: (7, r, d, i),
    "none_observation": lambda obs, r, d, i: (None, r, d, i),
    "huge_observation": lambda obs, r, d, i: (obs + "x" * (10 * 2**20), r, d, i),
    "two_tuple": lambda obs, r, d, i: (obs, r),
    "five_tuple": lambda obs, r, d, i: (obs, r, d, False, i),
    "int_done": lambda obs, r, d, i: (obs, r, int(d), i),
    "info_not_dict": lambda obs, r, d, i: (obs, r, d, list(i.items())),
    "surrogate_observation": lambda obs, r, d, i: (obs + "\ud800", r, d, i),
    "nul_observation": lambda obs, r, d, i: (obs + "\x00", r, d, i),
}


def _raise():
    raise RuntimeError("valid_actions exploded")


ACTION_FAULTS = {
    "actions_raise": _raise,
    "actions_empty": lambda: [],
    "actions_not_strings": lambda: [1, 2],
}
# kind -> (the kind grl/envs/checks.py reports, what its log line shows of the value)
LOGGED = {
    "nan_reward": ("nonfinite_reward", "float nan"),
    "inf_reward": ("nonfinite_reward", "float inf"),
    "neg_inf_reward": ("nonfinite_reward", "float -inf"),
    "none_reward": ("reward", "NoneType None"),
    "text_reward": ("reward", "str '1.0 points'"),
    "bytes_observation": ("observation", "bytes b'Turn 2"),
    "int_observation": ("observation", "int 7"),
    "none_observation": ("observation", "NoneType None"),
    "huge_observation": (
        "observation_cut",
        f"{len('Turn 2 of 2. Pick left or right.') + 10 * 2**20} characters",
    ),
    "two_tuple": ("result", "a 2-tuple"),
    "five_tuple": ("result", "a 5-tuple"),
    "int_done": ("done", "int 0"),
    "info_not_dict": ("info", "list [("),
    "surrogate_observation": ("observation_repaired", "\\ud800"),
    "nul_observation": ("observation_repaired", "\\x00"),
    "actions_raise": ("exception", "valid_actions exploded"),
    "actions_empty": ("valid_actions", "empty list"),
    "actions_not_strings": ("valid_actions", "int 1"),
}
REPAIRED = {"huge_observation", "surrogate_observation", "nul_observation"}  # cut or cleaned; episode goes on
NONFINITE = {"nan_reward", "inf_reward", "neg_inf_reward"}
KINDS = list(STEP_FAULTS) + list(ACTION_FAULTS)


class HostileEnv(Env):
    """Two turns; reward 1 for `left`. On odd seeds (and every seed from ALL_BROKEN_FROM, where it
    returns NaN rewards) it misbehaves in the way `kind` says, at its first step or, for the
    valid-action kinds, when asked for the second turn's actions."""

    def __init__(self, kind: str):
        self.kind = kind

    def reset(self, seed: int) -> str:
        self.seed, self.t = seed, 0
        return self._state()

    def _state(self) -> str:
        return f"Turn {self.t + 1} of 2. Pick left or right."

    def _bad(self) -> bool:
        return self.seed % 2 == 1 and self.t == 1

    def valid_actions(self):
        if self.kind in ACTION_FAULTS and self._bad():
            return ACTION_FAULTS[self.kind]()
        return list(ACTIONS)

    def step(self, action: str):
        self.t += 1
        done = self.t == 2
        result = (
            self._state(),
            float(action == "left"),
            done,
            step_info(done and action == "left", True, True),
        )
        if self.seed >= ALL_BROKEN_FROM:
            return STEP_FAULTS["nan_reward"](*result)
        if self.kind in STEP_FAULTS and self._bad():
            return STEP_FAULTS[self.kind](*result)
        return result


def task_block(kind: str) -> dict:
    return {
        "agent_type": "hostileAgent",
        "agent_config": {
            "system_prompt": "You pick a side.",
            "prompt": "Pick left.",
            "enable_think": False,
            "max_tokens": 10,
            "max_turns": 2,
            "max_actions_per_turn": 1,
            "max_actions_all_turns": 2,
            "format_penalty": -0.1,
            "action_separator": None,
            "action_decoding": "constrained",
        },
        "env_config": {"kind": kind},
    }


def hostile_config(tmp_path):
    grl.envs.register("hostile", HostileEnv)
    grl.agents.register("hostileAgent", "hostile")
    n = len(KINDS)
    keys = {
        "model_path": "tiny",
        "n_gpus_per_node": 1,
        "trainer.device": "cpu",
        "actor_rollout_ref.rollout.name": "hf",
        "max_response_length": 10,
        "max_prompt_length": 256,
        "rollout.max_episode_length": 512,
        "rollout.seed": BASE_SEED,
        "rollout.training": f"[{','.join(KINDS)}]",
        "rollout.agent_group_num": f"[{','.join(['2'] * n)}]",
        "rollout.agent_group_size": f"[{','.join(['2'] * n)}]",
        # Step 3 breaks every episode to show the skip; the ratio's stop is tested in tests/rollout.
        "rollout.max_failed_agent_ratio": 1.0,
        "rollout.max_infra_failed_ratio": 1.0,
        "algorithm.adv_estimator": "grpo",
        "critic.enable": False,
        "total_training_steps": 3,
        "ppo_mini_batch_size": 64,
        "micro_batch_size_per_gpu": 64,
        "test_freq": -1,
        "save_freq": -1,
        "trainer.val_before_train": False,
        "trainer.export_hf": False,
        "trainer.logger": "[jsonl]",
        "resume_mode": "disable",
        "trainer.run_dir": str(tmp_path / "run"),
        "trainer.default_local_dir": str(tmp_path / "ckpt"),
        "actor_rollout_ref.model.enable_gradient_checkpointing": False,
    }
    cfg = compose([f"{k}={v}" for k, v in keys.items()])
    OmegaConf.set_struct(cfg, False)
    for kind in KINDS:
        cfg[kind] = task_block(kind)
    return validate(cfg)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The run's metrics by step, the (task, seed) of each update's trained episodes, and its log."""
    from grl.trainer.agent_trainer import AgentTrainer
    from grl.workers import init_ray

    tmp = tmp_path_factory.mktemp("hostile")
    trained: dict[int, set] = {}

    def record_batch(trainer, step, metrics, b):
        if "actor/pg_loss" in metrics:
            rows = (b["loss_mask"] > 0).any(-1).tolist()
            trained[step] = {
                (t, s) for t, s, r in zip(b.meta["task"], b.meta["seed"], rows) if r
            }  # padded rows

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    for name in ("grl.rollout", "grl.trainer"):
        logging.getLogger(name).addHandler(handler)
    try:
        init_ray(None, num_cpus=2)
        AgentTrainer.from_config(hostile_config(tmp), hooks=[record_batch]).fit()
    finally:
        for name in ("grl.rollout", "grl.trainer"):
            logging.getLogger(name).removeHandler(handler)
    history = {r["step"]: r for r in read_jsonl(tmp / "run" / METRICS_FILE)}
    return history, trained, [r.getMessage() for r in records]


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_each_malformed_kind_is_counted_and_the_healthy_episodes_train(run, kind):
    history, trained, log = run
    assert sorted(history) == [1, 2, 3]
    for step in (1, 2):
        m = history[step]
        errors, warnings = m[f"train/{kind}/env_errors"], m[f"train/{kind}/env_warnings"]
        nonfinite = m[f"train/{kind}/nonfinite_rewards"]
        if kind in REPAIRED:
            assert (errors, warnings) == (0, 2), (step, m)  # the two agents of the odd-seeded group
        else:
            assert (errors, warnings) == (2, 0), (step, m)
        assert nonfinite == (2 if kind in NONFINITE else 0)
        assert (
            math.isfinite(m["reward/mean"])
            and math.isfinite(m["reward/std"])
            and math.isfinite(m["actor/pg_loss"])
        )
        assert m[f"train/{kind}/format_ok"] == 1.0  # every agent acted
        # The update trained on this task's healthy (even-seeded) episodes, and on a failed one never.
        seeds = {s for t, s in trained[step] if t == kind}
        assert any(s % 2 == 0 for s in seeds), (step, seeds)
        assert kind in REPAIRED or all(s % 2 == 0 for s in seeds), (step, seeds)
        ended = Counter(LOGGED[k][0] for k in KINDS if k not in REPAIRED for _ in range(2))
        assert {k: m.get(f"rollout/infra_failed/{k}") for k in ended} == ended
        assert m["rollout/infra_failed_episodes"] == m["training/dropped_infra_episodes"] == ended.total()
    # A bad value is logged once per task and kind over the whole run, with an odd seed and the value's
    # type; an exception (valid_actions raising) as before, every time with its traceback.
    checked, shown = LOGGED[kind]
    if checked == "exception":
        lines = [line for line in log if f"env failure in valid_actions of task {kind} " in line]
        assert len(lines) == 4 and all(shown in line and "Traceback" in line for line in lines)
    else:
        lines = [line for line in log if f"({checked}) in task {kind} (seed " in line]
        assert len(lines) == 1 and shown in lines[0], lines
        assert int(lines[0].split("(seed ")[1].split(")")[0].split(",")[0]) % 2 == 1


@pytest.mark.slow
def test_a_step_where_every_episode_failed_is_skipped(run):
    history, trained, log = run
    assert history[3]["rollout/env_errors"] == 4 * len(KINDS) and history[3][
        "rollout/nonfinite_rewards"
    ] == 4 * len(KINDS)
    assert "actor/pg_loss" not in history[3] and 3 not in trained
    skipped = [line for line in log if "update skipped" in line]
    assert skipped == [
        f"step 3: no episode left to train on ({4 * len(KINDS)} infra failures left out); update skipped"
    ]


# ---------------------------------------------------------------- metrics and shaping past the boundary


def episodes_with(scores):
    """Two groups of two; each episode one turn of 3 sampled tokens with the given score."""
    return [
        Episode(
            task="t",
            group_id=i // 2,
            seed=i // 2,
            member=i % 2,
            score=score,
            metrics={"success": score},
            turns=[Turn(prompt_ids=[1, 2], response_ids=[3, 4, 5], response_log_probs=None, reward=score)],
        )
        for i, score in enumerate(scores)
    ]


def test_metrics_and_shaping_skip_a_nonfinite_score_that_got_through():
    from grl.trainer.metrics import reward_metrics

    eps = episodes_with([1.0, math.nan, 0.0, math.inf])
    assert reward_metrics(eps) == {
        "reward/mean": 0.5,
        "reward/std": 0.5,
        "reward/max": 1.0,
        "reward/min": 0.0,
    }
    metrics = rollout_metrics(eps)
    assert metrics["t/score"] == 0.5 and metrics["t/success"] == 0.5
    for method in ("identity", "mean_std", "asym_clip"):
        scores = normalize_episode_scores(eps, "batch", method)
        assert scores[0] > scores[2] and not math.isfinite(scores[1]) and not math.isfinite(scores[3])
    kept, stats = filter_groups(eps, 0.5)
    assert all(math.isfinite(v) for v in stats.values())
    assert [e.seed for e in kept] == [0, 0]  # one finite score per group, std 0 each: the earlier group
    batch, _ = build_batch(eps, use_turn_scores=True)
    assert len(batch) == 4  # the trainer's drop_nonfinite_rows takes out the two bad rows
