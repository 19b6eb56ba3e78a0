"""The multi-turn rollout with the real HF engine (tiny model), real task
instances from configs/agents.yaml, and scripted envs that fail on purpose."""

import copy
import logging
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest
from omegaconf import OmegaConf

import grl.agents
import grl.envs
from grl.agents.tasks import TaskHooks
from grl.config import CONFIG_DIR
from grl.engines.base import Engine, SamplingParams
from grl.envs.base import Env, step_info
from grl.rollout import MultiTurnRollout, RolloutError, TaskSpec, build_batch
from grl.rollout.chat import ChatTokens, truncate_prompt
from grl.rollout.clock import gen_times

AGENTS = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "agents.yaml"), resolve=True)
GSM8K_TEST = Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "test.jsonl"
REPLY_TOKENS = 6
CONSTRAINED_TOKENS = 10
DECODINGS = ("free", "constrained")


class ScriptedEnv(Env):
    """An episode of `length` steps (default `seed % 3 + 1`), reward 1 per step.
    The seeds in `slow_seeds` take `delay` seconds a step. With `fault`, the seeds in `fault_seeds` (all when
    empty) fail: `reset`
    raises at reset, `raise` raises, `hang` blocks and `nan` returns a NaN reward
    on step `fault_step`."""

    instances: ClassVar[list["ScriptedEnv"]] = []
    release = threading.Event()

    def __init__(
        self,
        fault: str = "none",
        fault_step: int = 3,
        fault_seeds: list | None = None,
        length: int = 0,
        slow_seeds: list | None = None,
        delay: float = 0.0,
    ):
        self.fault, self.fault_step, self.fault_seeds, self.length = (
            fault,
            fault_step,
            fault_seeds or [],
            length,
        )
        self.slow_seeds, self.delay = slow_seeds or [], delay
        self.resets = self.steps = 0
        ScriptedEnv.instances.append(self)

    def _faulty(self, seed: int) -> bool:
        return not self.fault_seeds or seed in self.fault_seeds

    def reset(self, seed: int) -> str:
        if self.fault == "reset" and self._faulty(seed):
            raise RuntimeError(f"scripted reset failure for seed {seed}")
        self.seed, self.t, self.end = seed, 0, self.length or seed % 3 + 1
        self.resets += 1
        return f"Square 0 of {self.end}."

    def step(self, action: str):
        if self.seed in self.slow_seeds:
            time.sleep(self.delay)
        self.t += 1
        self.steps += 1
        if self.t == self.fault_step and self._faulty(self.seed):
            if self.fault == "raise":
                raise RuntimeError("scripted step failure")
            if self.fault == "hang":
                ScriptedEnv.release.wait(60)
            if self.fault == "nan":
                return "Square ?", float("nan"), False, step_info(False, True, True)
        done = self.t >= self.end
        return f"Square {self.t} of {self.end}.", 1.0, done, step_info(done, True, True)

    def valid_actions(self):
        return ["go", "stay"]  # the hooks play "go" whatever the model picks


class AlwaysAct(TaskHooks):
    """Every reply is one action, so the env steps whatever the random model writes."""

    def actions(self, answer, separator):
        return ["go"]


grl.envs.register("scripted_rollout_test", ScriptedEnv)
grl.agents.register("scriptedRolloutAgent", "scripted_rollout_test", AlwaysAct())


def scripted(name="scripted", groups=2, size=2, max_turns=4, decoding="free", **env_config) -> TaskSpec:
    """With `decoding="constrained"` the model may only write `<answer>go</answer>` or
    `<answer>stay</answer>` (at most 10 tokens with the end token), so its format is always right."""
    agent_config = {
        "system_prompt": "You are a test agent.",
        "prompt": "Walk.",
        "enable_think": False,
        "max_tokens": REPLY_TOKENS if decoding == "free" else CONSTRAINED_TOKENS,
        "max_turns": max_turns,
        "max_actions_per_turn": 1,
        "max_actions_all_turns": 10,
        "format_penalty": -0.1,
        "action_separator": None,
        "action_decoding": decoding,
    }
    block = {"agent_type": "scriptedRolloutAgent", "agent_config": agent_config, "env_config": env_config}
    return TaskSpec(name, grl.agents.task_from_block(name, block), groups, size)


def real_task(name, groups=1, size=2, max_turns=2, agent: dict | None = None, **env_config) -> TaskSpec:
    block = copy.deepcopy(AGENTS[name])
    block["agent_config"].update(max_turns=max_turns, **(agent or {}))
    block["env_config"].update(env_config)
    return TaskSpec(name, grl.agents.task_from_block(name, block), groups, size)


class RecordingEngine(Engine):
    """The real engine, with every prompt it is given and what it returned."""

    def __init__(self, inner: Engine):
        self.inner = inner
        self.calls: list[tuple[list[list[int]], list]] = []

    def generate(self, prompt_token_ids, sampling):
        outputs = self.inner.generate(prompt_token_ids, sampling)
        self.calls.append(([list(p) for p in prompt_token_ids], outputs))
        return outputs


def rollout(engine, tokenizer, **kw):
    options = {
        "max_prompt_length": 4096,
        "max_response_length": CONSTRAINED_TOKENS,
        "env_workers": 4,
        "env_step_timeout": 30,
    }
    options.update(kw)
    return MultiTurnRollout(engine, tokenizer, **options)


def prompts_before(episode):
    """The full (untruncated) engine prompt of each turn."""
    ids, prompts = [], []
    for turn in episode.turns:
        ids += turn.prompt_ids
        prompts.append(list(ids))
        ids += turn.response_ids
    return prompts


SAMPLED = SamplingParams(temperature=1.0, seed=11)
GREEDY = SamplingParams(greedy=True)


# ---------------------------------------------------------------- token bookkeeping


@pytest.mark.shared_data("gsm8k/test.jsonl")
def test_loss_mask_tokens_are_exactly_the_sampled_replies(hf_engine, tokenizer):
    engine = RecordingEngine(hf_engine)
    ro = rollout(engine, tokenizer)
    tasks = [
        real_task("simpleSokobanAgent"),
        real_task("gsm8kAgent_5_turn", data_path=str(GSM8K_TEST), split="test"),
        scripted(groups=1),
    ]
    result = ro.run(tasks, base_seed=5, sampling=SAMPLED)
    episodes = result.episodes
    assert [(e.task, e.group_id, e.seed, e.member) for e in episodes] == [
        ("simpleSokobanAgent", 0, 5, 0),
        ("simpleSokobanAgent", 0, 5, 1),
        ("gsm8kAgent_5_turn", 1, 6, 0),
        ("gsm8kAgent_5_turn", 1, 6, 1),
        ("scripted", 2, 7, 0),
        ("scripted", 2, 7, 1),
    ]
    # Every prompt the engine saw is an episode's ids so far, and each of its
    # outputs is the reply recorded for that turn: nothing else reached it.
    seen = sorted(
        (tuple(p), tuple(o.token_ids)) for prompts, outs in engine.calls for p, o in zip(prompts, outs)
    )
    expected = sorted(
        (tuple(p), tuple(t.response_ids)) for e in episodes for p, t in zip(prompts_before(e), e.turns)
    )
    assert seen == expected

    batch, _ = build_batch(episodes)
    for row, episode in enumerate(episodes):
        ids, mask, turn_ids = batch["input_ids"][row], batch["loss_mask"][row], batch["turn_ids"][row]
        replies = [m["content"] for m in episode.messages if m["role"] == "assistant"]
        assert len(replies) == len(episode.turns)
        for k, turn in enumerate(episode.turns):
            sampled = ids[(mask == 1) & (turn_ids == k)].tolist()
            assert sampled == turn.response_ids
            assert tokenizer.decode(sampled, skip_special_tokens=True) == replies[k]
        assert mask.sum().item() == sum(len(t.response_ids) for t in episode.turns)
        assert batch["rollout_log_probs"][row][mask == 1].tolist() == pytest.approx(
            [x for t in episode.turns for x in t.response_log_probs]
        )
    assert {
        "simpleSokobanAgent/success",
        "gsm8kAgent_5_turn/success",
        "scripted/num_turns",
        "scripted/response_length",
        "scripted/env_errors",
    } <= set(result.metrics)


@pytest.mark.parametrize("window", [0, 1])
def test_a_context_window_prompts_every_turn_afresh(hf_engine, tokenizer, window):
    """agent_config.max_context_window: the engine's prompt at every turn is the agent's windowed chat
    rendered whole (the instructions, the last `window` turns, the current state), and the turn's
    prompt_ids are exactly that prompt."""
    engine = RecordingEngine(hf_engine)
    agent = {"max_context_window": window, "action_decoding": "free", "max_tokens": REPLY_TOKENS}
    task = real_task("tetrisAgent_type_1_dim_4", groups=1, size=2, max_turns=4, agent=agent)
    episodes = rollout(engine, tokenizer).run([task], base_seed=3, sampling=SAMPLED).episodes
    chat = ChatTokens(tokenizer)
    seen = sorted(tuple(p) for prompts, _ in engine.calls for p in prompts)
    assert seen == sorted(tuple(t.prompt_ids) for e in episodes for t in e.turns)
    assert any(len(e.turns) >= 3 for e in episodes)
    for e in episodes:
        assert all(t.new_context for t in e.turns)
        for k, turn in enumerate(e.turns):
            text = tokenizer.decode(turn.prompt_ids)
            assert text.startswith(tokenizer.decode(chat.encode(chat.render(e.messages[:1], False))))
            assert text.count(". State:\n") == min(k, window) + 1, (k, text)
            assert f"Turn {k + 1}. State" in text and f"Turn {k - window}. State" not in text
            assert text.count(e.messages[1]["content"][:60]) == 1  # the instructions, once
    batch, _ = build_batch(episodes)
    assert batch["context_ids"].amax(1).tolist() == [len(e.turns) for e in episodes]


def test_greedy_rollout_is_deterministic(hf_engine, tokenizer):
    tasks = [scripted(groups=2, size=2), real_task("simpleSokobanAgent", groups=1, size=1, max_turns=1)]

    def signature():
        episodes = rollout(hf_engine, tokenizer).run(tasks, base_seed=40, sampling=GREEDY).episodes
        return [
            (e.group_id, e.seed, e.score, [(t.prompt_ids, t.response_ids) for t in e.turns]) for e in episodes
        ]

    first, second = signature(), signature()
    assert first == second
    assert [(g, s) for g, s, _, _ in first] == [(0, 40), (0, 40), (1, 41), (1, 41), (2, 42)]


def test_finished_agents_leave_the_batch_and_prompts_keep_the_system(hf_engine, tokenizer):
    engine = RecordingEngine(hf_engine)
    limit = 90
    ro = rollout(engine, tokenizer, max_prompt_length=limit)
    result = ro.run(
        [scripted(groups=3, size=2)], base_seed=0, sampling=GREEDY
    )  # seeds 0, 1, 2: 1, 2, 3 turns
    episodes = result.episodes
    assert [len(e.turns) for e in episodes] == [1, 1, 2, 2, 3, 3]
    assert [len(prompts) for prompts, _ in engine.calls] == [6, 4, 2]

    chat = ChatTokens(tokenizer)
    messages = [{"role": "system", "content": "You are a test agent."}, {"role": "user", "content": "x"}]
    system_ids = chat.encode(chat.render(messages[:1], generation_prompt=False))
    sent = [p for prompts, _ in engine.calls for p in prompts]
    full = [p for e in episodes for p in prompts_before(e)]
    assert sorted(map(tuple, sent)) == sorted(tuple(truncate_prompt(p, limit, len(system_ids))) for p in full)
    assert any(len(p) > limit for p in full)  # truncation happened ...
    assert all(
        len(p) <= limit and p[: len(system_ids)] == system_ids for p in sent
    )  # ... and kept the system prompt
    assert result.metrics["rollout/truncated_prompts"] == sum(len(p) > limit for p in full)

    lengths = sorted(e.num_tokens for e in episodes)
    batch, metrics = build_batch(episodes, max_episode_length=lengths[3])
    assert metrics["rollout/dropped_overlong"] == sum(n > lengths[3] for n in lengths) > 0
    assert len(batch) == 6 - metrics["rollout/dropped_overlong"]


# ---------------------------------------------------------------- without the turn barrier


def episode_signature(episodes):
    return [
        (e.seed, e.score, e.error, [(t.prompt_ids, t.response_ids, t.reward) for t in e.turns])
        for e in episodes
    ]


@pytest.mark.slow
def test_without_the_turn_barrier_a_slow_env_holds_only_its_own_agent(hf_engine, tokenizer):
    """Seed 1's env takes 1 s a step: the other agents play all their turns meanwhile, and every
    episode is the one the barrier gives (greedy)."""
    task = scripted(groups=3, size=1, length=3, slow_seeds=[1], delay=1.0)
    engine = RecordingEngine(hf_engine)
    free = rollout(engine, tokenizer).run([task], base_seed=0, sampling=GREEDY, turn_barrier=False).episodes
    together = rollout(hf_engine, tokenizer).run([task], base_seed=0, sampling=GREEDY).episodes
    assert episode_signature(free) == episode_signature(together)
    # turn 1 together; the fast agents' turns 2 and 3 while the slow env steps; then the slow agent alone
    assert [len(prompts) for prompts, _ in engine.calls] == [3, 2, 2, 1, 1]


def test_without_the_turn_barrier_a_reply_depends_on_its_agent_and_turn_not_on_who_waited_with_it(
    hf_engine, tokenizer
):
    tasks = [scripted(groups=2, size=2, length=3, slow_seeds=[5], delay=0.5)]
    uneven = rollout(hf_engine, tokenizer).run(tasks, base_seed=5, sampling=SAMPLED, turn_barrier=False)
    even = rollout(hf_engine, tokenizer).run(
        [scripted(groups=2, size=2, length=3)], base_seed=5, sampling=SAMPLED, turn_barrier=False
    )
    assert episode_signature(uneven.episodes) == episode_signature(even.episodes)
    replies = [tuple(t.response_ids) for e in even.episodes for t in e.turns]
    assert len(set(replies)) > len(replies) // 2  # the agents of a group drew their own replies


class TimedEngine(Engine):
    """The real engine, with the seconds its calls took, timed here."""

    def __init__(self, inner: Engine):
        self.inner, self.seconds = inner, 0.0

    def generate(self, prompt_token_ids, sampling):
        start = time.perf_counter()
        try:
            return self.inner.generate(prompt_token_ids, sampling)
        finally:
            self.seconds += time.perf_counter() - start


@pytest.mark.parametrize("turn_barrier", [True, False])
def test_the_rollout_time_splits_into_engine_env_and_other_per_task(hf_engine, tokenizer, turn_barrier):
    """The slow task's env sleeps 0.25 s a step (2 agents x 2 steps): its env seconds are at least the 1 s
    slept, the fast task's far less; the engine's part is what the engine's own calls took; the parts and
    the rest add up to the rollout's wall time."""
    slow, fast = (
        scripted("slow", groups=1, length=2, slow_seeds=[0], delay=0.25),
        scripted("fast", groups=1, length=2),
    )
    engine = TimedEngine(hf_engine)
    start = time.perf_counter()
    result = rollout(engine, tokenizer).run(
        [slow, fast], base_seed=0, sampling=GREEDY, turn_barrier=turn_barrier
    )
    wall = time.perf_counter() - start
    times = gen_times(wall, result.times)
    assert times["gen_engine"] == pytest.approx(engine.seconds, abs=0.01)
    assert times["gen_env/slow"] >= 1.0 > 0.2 > times["gen_env/fast"]
    # With the barrier every turn waits for the slow task's step (its two agents' side by side); without it
    # the fast agents' engine calls run meanwhile, and only the slow agents' last step is waited on alone.
    assert times["gen_env"] >= (0.5 if turn_barrier else 0.24)
    assert "gen_programs" not in times
    parts = times["gen_engine"] + times["gen_env"] + times["gen_other"]
    assert parts == pytest.approx(wall, abs=1e-9) and times["gen_other"] < 0.5 * wall


# ---------------------------------------------------------------- env faults
# Each runs with free decoding (a random model: every reply misses its format, -0.1) and with
# valid-action decoding (every reply is a valid answer: the model really acts).


def format_penalty(decoding):
    return -0.1 if decoding == "free" else 0.0


@pytest.mark.parametrize("decoding", DECODINGS)
def test_env_raising_on_third_step_ends_only_that_episode(hf_engine, tokenizer, caplog, decoding):
    ro = rollout(hf_engine, tokenizer, env_error_penalty=-5.0)
    task = scripted(
        groups=2, size=2, fault="raise", fault_step=3, fault_seeds=[101], length=4, decoding=decoding
    )
    with caplog.at_level(logging.ERROR, logger="grl.rollout"):
        result = ro.run([task], base_seed=100, sampling=GREEDY)
    healthy, failed = result.episodes[:2], result.episodes[2:]
    turn = 1.0 + format_penalty(decoding)
    assert [len(e.turns) for e in healthy] == [4, 4] and [e.score for e in healthy] == pytest.approx(
        [4 * turn] * 2
    )
    assert all(e.error is None for e in healthy)
    assert [len(e.turns) for e in failed] == [3, 3]
    assert [[t.reward for t in e.turns] for e in failed] == [pytest.approx([turn, turn, -5.0])] * 2
    assert all("scripted step failure" in e.error and e.error_kind == "exception" for e in failed)
    assert result.metrics["scripted/env_errors"] == 2 and result.metrics["scripted/nonfinite_rewards"] == 0
    assert (
        result.metrics["rollout/infra_failed_episodes"] == 2
        and result.metrics["rollout/infra_failed/exception"] == 2
    )
    assert trained_seeds(result.episodes) == [100, 100]  # the infrastructure's failures are not trained on
    if decoding == "constrained":
        assert result.metrics["scripted/format_ok"] == 1.0
    records = [r.getMessage() for r in caplog.records if r.name == "grl.rollout"]
    assert len(records) == 2 and all("scripted" in r and "seed 101" in r for r in records)


@pytest.mark.parametrize("decoding", DECODINGS)
def test_env_failing_at_reset_is_logged_with_traceback_and_default_penalty(
    hf_engine, tokenizer, caplog, decoding
):
    ro = rollout(hf_engine, tokenizer)
    task = scripted(groups=2, size=2, fault="reset", fault_seeds=[0], decoding=decoding)
    with caplog.at_level(logging.ERROR, logger="grl.rollout"):
        result = ro.run([task], base_seed=0, sampling=GREEDY)
    assert [len(e.turns) for e in result.episodes] == [0, 0, 2, 2]
    assert "Traceback" in caplog.text and "scripted reset failure for seed 0" in caplog.text
    batch, metrics = build_batch(result.episodes)
    assert len(batch) == 2 and metrics["rollout/dropped_empty"] == 2
    assert result.metrics["rollout/infra_failed/exception"] == 2 and trained_seeds(result.episodes) == [1, 1]


@pytest.mark.parametrize("decoding", DECODINGS)
def test_hung_env_times_out_is_abandoned_and_never_reused(hf_engine, tokenizer, decoding):
    ScriptedEnv.release.clear()
    ScriptedEnv.instances.clear()
    # One env worker: a pool starved by the hung step would never run the other agents' steps.
    ro = rollout(hf_engine, tokenizer, env_workers=1, env_step_timeout=0.5)
    task = scripted(
        groups=2, size=2, fault="hang", fault_step=2, fault_seeds=[201], length=3, decoding=decoding
    )
    try:
        result = ro.run([task], base_seed=200, sampling=GREEDY)
        assert [len(e.turns) for e in result.episodes] == [3, 3, 2, 2]
        assert all("timed out" in e.error and e.error_kind == "timeout" for e in result.episodes[2:])
        assert (
            result.episodes[2].turns[-1].reward == -0.1
        )  # the task's format penalty, recorded, not trained on
        assert result.metrics["rollout/infra_failed/timeout"] == 2 and trained_seeds(result.episodes) == [
            200,
            200,
        ]
        hung = [env for env in ScriptedEnv.instances if env.seed == 201]
        assert len(hung) == 2
        ro.run([task], base_seed=300, sampling=GREEDY)  # seeds 300, 301: no fault
        assert [(env.resets, env.steps) for env in hung] == [(1, 2), (1, 2)]
        assert len(ScriptedEnv.instances) == 6  # two fresh envs replaced the hung ones
    finally:
        ScriptedEnv.release.set()


@pytest.mark.parametrize("decoding", DECODINGS)
def test_too_many_failures_stop_the_step(hf_engine, tokenizer, decoding):
    ro = rollout(hf_engine, tokenizer, max_failed_agent_ratio=0.25)
    with pytest.raises(RolloutError, match="2 of 4 agents failed.*max_failed_agent_ratio"):
        ro.run(
            [
                scripted(
                    groups=2,
                    size=2,
                    fault="raise",
                    fault_step=1,
                    fault_seeds=[1],
                    length=3,
                    decoding=decoding,
                )
            ],
            base_seed=0,
            sampling=GREEDY,
        )
    # At the default 50%, the same half-failed step goes on; all failing stops it at reset.
    ro = rollout(hf_engine, tokenizer)
    result = ro.run(
        [
            scripted(
                groups=2, size=2, fault="raise", fault_step=1, fault_seeds=[1], length=3, decoding=decoding
            )
        ],
        base_seed=0,
        sampling=GREEDY,
    )
    assert result.metrics["rollout/env_errors"] == 2
    with pytest.raises(RolloutError, match="4 of 4 agents failed"):
        ro.run([scripted(groups=2, size=2, fault="reset", decoding=decoding)], base_seed=0, sampling=GREEDY)
    # Bad values count as failures too: a mostly broken step still stops.
    with pytest.raises(RolloutError, match="3 of 4 agents failed.*non-finite reward"):
        ro.run(
            [
                scripted(
                    groups=4,
                    size=1,
                    fault="nan",
                    fault_step=1,
                    fault_seeds=[0, 1, 2],
                    length=3,
                    decoding=decoding,
                )
            ],
            base_seed=0,
            sampling=GREEDY,
        )


@pytest.mark.parametrize("decoding", DECODINGS)
def test_nan_reward_ends_the_episode_is_counted_and_logged_once(hf_engine, tokenizer, caplog, decoding):
    ro = rollout(hf_engine, tokenizer, env_error_penalty=-5.0)
    task = scripted(
        groups=2, size=2, fault="nan", fault_step=2, fault_seeds=[11], length=3, decoding=decoding
    )
    with caplog.at_level(logging.WARNING, logger="grl.rollout"):
        result = ro.run([task], base_seed=10, sampling=GREEDY)
        ro.run([task], base_seed=10, sampling=GREEDY)  # the same faults again: counted, not logged
    healthy, failed = result.episodes[:2], result.episodes[2:]
    turn = 1.0 + format_penalty(decoding)
    assert all(e.error is None and e.score == pytest.approx(3 * turn) for e in healthy)
    assert [[t.reward for t in e.turns] for e in failed] == [pytest.approx([turn, -5.0])] * 2
    assert all(e.error_kind == "nonfinite_reward" for e in failed)
    assert result.metrics["scripted/env_errors"] == 2 and result.metrics["scripted/nonfinite_rewards"] == 2
    assert result.metrics["rollout/nonfinite_rewards"] == 2
    records = [r.getMessage() for r in caplog.records if r.name == "grl.rollout"]
    assert len(records) == 1, records
    assert "nonfinite_reward" in records[0] and "seed 11" in records[0] and "float nan" in records[0]
    batch, _ = build_batch(result.episodes, use_turn_scores=True)
    assert len(batch) == 4 and bool(batch["token_rewards"].isfinite().all())
    assert result.metrics["rollout/infra_failed/nonfinite_reward"] == 2 and trained_seeds(
        result.episodes
    ) == [10, 10]


def trained_seeds(episodes):
    """The seeds of the episodes the trainer's batch holds (grl/trainer/transforms.py)."""
    from grl.trainer.transforms import shape_batch
    from tests.algo.test_infra_baselines import rollout_cfg

    return shape_batch(episodes, rollout_cfg(), pad_token_id=0)[0].meta["seed"]
