"""Agent programs as tasks (grl/gateway/programs.py): real programs over the real `openai` client, served by
the tiny model through the gateway on 127.0.0.1. The batch the trainer builds holds exactly the ids each
program received; edited histories, broken programs and floods are contained and counted."""

import math
import threading
import time
from pathlib import Path

import pytest

from grl.agents import task_from_block
from grl.engines import SamplingParams, make_engine
from grl.gateway.batching import BatchingEngine
from grl.gateway.contract import ProgramTask, load_program, reward_of
from grl.gateway.programs import ProgramRunner
from grl.models import load_tokenizer
from grl.rollout import MultiTurnRollout, TaskSpec
from grl.rollout.batch import episode_tokens
from tests.gateway import programs

GSM8K = str(
    Path(__file__).resolve().parents[3] / "shared" / "data" / "gsm8k" / "{split}.jsonl"
)  # ../shared/data


class CountingEngine:
    """The real engine, with a count of its generate calls and their sizes."""

    def __init__(self, engine):
        self.engine, self.batches = engine, []

    def generate(self, prompts, sampling, constraints=None):
        self.batches.append(len(prompts))
        return self.engine.generate(prompts, sampling, constraints)

    def rows_within(self, row_tokens):
        return self.engine.rows_within(row_tokens)


@pytest.fixture(scope="module")
def engine():
    engine = CountingEngine(make_engine("hf", "tiny", dtype="float32", device="cpu", grammar=True))
    yield engine
    engine.engine.shutdown()


@pytest.fixture(scope="module")
def runner(engine):
    runner = ProgramRunner(
        engine, load_tokenizer("tiny"), context=4096, max_response_length=64, max_failed_agent_ratio=1.0
    )
    yield runner
    runner.close()


PROGRAMS = "tests.gateway.programs"


def task(
    name: str, program: str, groups: int = 1, size: int = 1, env_config: dict | None = None, **agent
) -> TaskSpec:
    block = {
        "agent_type": "program",
        "agent_config": {"program": f"{PROGRAMS}:{program}", "max_turns": 4, **agent},
        "env_config": env_config or {},
    }
    return TaskSpec(name, task_from_block(name, block), groups, size)


def trained(episode):
    """(ids, log-probs) at the positions the trainer trains on."""
    row = episode_tokens(episode, use_turn_scores=False)
    return (
        [t for t, m in zip(row.input_ids, row.loss_mask) if m],
        [p for p, m in zip(row.rollout_log_probs, row.loss_mask) if m],
        row,
    )


@pytest.mark.shared_data("gsm8k/test.jsonl", "gsm8k/train.jsonl")
def test_gsm8k_through_the_gateway_trains_on_exactly_the_ids_the_program_received(runner):
    spec = task("gsm8kProgram", "gsm8k_with_python", 2, 2, {"data_path": GSM8K}, max_turns=2, max_tokens=64)
    programs.SEEN.clear()
    episodes, metrics = runner.run([spec], 7, 0, SamplingParams(temperature=1.0, seed=11, max_new_tokens=64))
    assert metrics["gateway/calls"] == 8 and metrics["gateway/prefix_breaks"] == 0
    assert metrics["gateway/program_errors"] == 0
    for episode in episodes:
        assert episode.error is None and episode.metrics["tool_calls"] == 1.0
        seen = programs.SEEN[(episode.task, episode.seed, episode.member)]
        ids, log_probs, row = trained(episode)
        assert ids == seen[0]["completion_token_ids"][0] + seen[1]["completion_token_ids"][0]
        assert log_probs == pytest.approx(seen[0]["log_probs"][0] + seen[1]["log_probs"][0], abs=1e-6)
        # One sequence: the answer's prompt is the tool call's prompt, the tool call, then the tool's output.
        assert row.input_ids == seen[1]["prompt_token_ids"] + seen[1]["completion_token_ids"][0]
        assert set(row.context_ids) == {1}
        assert episode.turns[0].response_allowed is not None and episode.turns[1].response_allowed is None
        tool = [m for m in episode.messages if m["role"] == "tool"]
        assert (
            len(tool) == 1 and tool[0]["content"].strip().lstrip("-").isdigit()
        )  # the sandbox printed a number
    assert [e.group_id for e in episodes] == [0, 0, 1, 1] and episodes[0].seed == episodes[1].seed == 7


def test_a_program_that_rewrites_its_history_gives_a_sequence_per_call_and_is_counted(runner):
    programs.SEEN.clear()
    [episode], metrics = runner.run(
        [task("edits", "rewrites_history")], 0, 0, SamplingParams(temperature=1.0, seed=1)
    )
    assert metrics["gateway/prefix_breaks"] == 1
    seen = programs.SEEN[("edits", 0, 0)]
    ids, _, row = trained(episode)
    assert ids == seen[0]["completion_token_ids"][0] + seen[1]["completion_token_ids"][0]
    second = seen[1]["prompt_token_ids"] + seen[1]["completion_token_ids"][0]
    assert [t for t, c in zip(row.input_ids, row.context_ids) if c == 2] == second
    assert episode.turns[1].new_context and episode.score == 0.5


def test_calls_of_concurrent_programs_share_engine_calls(runner, engine):
    engine.batches.clear()
    episodes, _ = runner.run(
        [task("one", "one_call", groups=8, size=2)], 0, 0, SamplingParams(temperature=1.0)
    )
    assert len(episodes) == 16 and all(e.score == 1.0 for e in episodes)
    assert sum(engine.batches) == 16 and max(engine.batches) > 1, engine.batches


@pytest.mark.slow
def test_bad_programs_end_their_own_episodes_and_are_counted(runner):
    tasks = [
        task("good", "one_call"),
        task("raising", "raises"),
        task("hanging", "hangs", program_timeout=2),
        task("text", "returns_text"),
        task("nan", "returns_nan"),
        task("floods", "floods"),
        task("by_messages", "returns_a_function_of_the_messages"),
    ]
    start = time.monotonic()
    episodes, metrics = runner.run(tasks, 0, 0, SamplingParams(temperature=1.0, seed=0))
    by_task = {e.task: e for e in episodes}
    assert time.monotonic() - start < 120
    assert by_task["good"].error is None and by_task["good"].score == 1.0
    assert (
        by_task["raising"].error_kind == "exception" and "the program's own bug" in by_task["raising"].error
    )
    assert by_task["hanging"].error_kind == "timeout" and "program_timeout" in by_task["hanging"].error
    assert by_task["text"].error_kind == "bad_reward" and by_task["nan"].error_kind == "bad_reward"
    assert by_task["by_messages"].score == 2.0  # the user message and the reply
    penalty = -0.1  # agent_config.format_penalty's default, as for an env that fails
    assert by_task["raising"].score == penalty and by_task["text"].score == penalty
    flood = by_task["floods"]
    assert flood.error is None and flood.metrics["answered"] == 4 and len(flood.turns) == 4
    assert metrics["gateway/refused_calls"] == 996
    assert (
        metrics["gateway/program_errors"],
        metrics["gateway/program_timeouts"],
        metrics["gateway/bad_rewards"],
    ) == (1, 1, 2)
    assert not by_task["nan"].turns  # returns_nan never calls; the hung one may time out before its call
    assert metrics["gateway/episodes_without_calls"] == 1 + (not by_task["hanging"].turns)
    # The rollout goes on: the next one is served as before, and a late call of the hung program is refused.
    again, _ = runner.run([task("good", "one_call", groups=2)], 1, 0, SamplingParams(temperature=1.0))
    assert [e.score for e in again] == [1.0, 1.0]


def test_the_rollout_plays_program_and_native_tasks_side_by_side(runner):
    import grl.agents
    import grl.envs
    from tests.test_learning import FRUIT_TASK, FruitEnv

    grl.envs.register("fruit", FruitEnv)
    grl.agents.register("fruitAgent", "fruit")
    native = runner.engine.engine
    rollout = MultiTurnRollout(
        native, load_tokenizer("tiny"), max_prompt_length=1024, max_response_length=12, programs=runner
    )
    program = task("fruitProgram", "fruit_picker", 2, 2, {"wanted": "plum"}, max_turns=3, max_tokens=12)
    result = rollout.run(
        [TaskSpec("fruit", task_from_block("fruit", FRUIT_TASK), 2, 2), program],
        100,
        SamplingParams(temperature=1.0, seed=3),
    )
    assert sorted({e.group_id for e in result.episodes if e.task == "fruit"}) == [0, 1]
    assert sorted({e.group_id for e in result.episodes if e.task == "fruitProgram"}) == [2, 3]
    assert all(len(e.turns) == 3 for e in result.episodes)
    assert "fruitProgram/success" in result.metrics and result.metrics["gateway/calls"] == 12


def test_reward_and_program_checks():
    assert reward_of(2) == (2.0, {}) and reward_of({"reward": 1, "success": True}) == (1.0, {"success": 1.0})
    for bad in ("1", None, True, math.inf, {"score": 1}, {"reward": 1, "note": "x"}, {"reward": True}):
        with pytest.raises(ValueError):
            reward_of(bad)
    assert load_program(f"{PROGRAMS}:one_call") is programs.one_call
    for path, says in (
        (PROGRAMS, "expected 'package.module:function'"),
        ("no_such_module:f", "cannot import"),
        (f"{PROGRAMS}:missing", "has no callable missing"),
    ):
        with pytest.raises(ValueError, match=says):
            load_program(path)
    assert ProgramTask("t", 1, 0, 0, {}).model == "grl-policy"


def test_the_batching_engine_refuses_calls_outside_a_rollout(engine):
    from grl.gateway import BadRequest

    batching = BatchingEngine(engine)
    with pytest.raises(BadRequest, match="no rollout is running"):
        batching.generate([[1, 2]], SamplingParams(max_new_tokens=1))
    batching.serving(True)
    answer = {}
    caller = threading.Thread(
        target=lambda: answer.setdefault("out", batching.generate([[1, 2]], SamplingParams(max_new_tokens=2)))
    )
    caller.start()
    while batching.serve(wait=0.1) == 0:
        pass
    caller.join(timeout=30)
    assert len(answer["out"]) == 1 and len(answer["out"][0].token_ids) <= 2


def test_validation_controls_leave_program_tasks_out(runner):
    """A control replays a task with other agents (`swap`: shown a decoy board); a program has no agent to
    replace, so its task is validated plainly while the native task beside it gets its control."""
    import grl.agents
    import grl.envs
    from grl.agents.controls import VALIDATION_CONTROLS
    from grl.trainer.validation import validation_metrics
    from tests.test_learning import FRUIT_TASK, FruitEnv

    grl.envs.register("fruit", FruitEnv)
    grl.agents.register("fruitAgent", "fruit")
    engine, tokenizer = runner.engine.engine, load_tokenizer("tiny")
    rollout = MultiTurnRollout(
        engine, tokenizer, max_prompt_length=1024, max_response_length=12, programs=runner
    )
    swap = MultiTurnRollout(
        engine,
        tokenizer,
        max_prompt_length=1024,
        max_response_length=12,
        agent_factory=lambda name, block: VALIDATION_CONTROLS["swap"](name, block, None),
    )
    tasks = [
        TaskSpec("fruit", task_from_block("fruit", FRUIT_TASK), 2, 1),
        task("fruitProgram", "fruit_picker", 2, 1, {"wanted": "plum"}, max_turns=3, max_tokens=12),
    ]
    metrics, episodes = validation_metrics(rollout, {"swap": swap}, tasks, 5, 1, SamplingParams(greedy=True))
    assert "fruit/success_swapped" in metrics and "fruitProgram/success_swapped" not in metrics
    assert "fruitProgram/success" in metrics and len(episodes) == 4


def test_too_many_failed_programs_stop_the_rollout_in_one_line(runner):
    from grl.rollout import RolloutError

    runner.max_failed_agent_ratio = 0.5
    try:
        with pytest.raises(
            RolloutError,
            match=r"^2 of 3 programs failed, more than max_failed_agent_ratio 0.5; "
            r"first: task raising seed 0: RuntimeError: the program's own bug$",
        ):
            runner.run(
                [task("raising", "raises", groups=2), task("good", "one_call")],
                0,
                0,
                SamplingParams(temperature=1.0),
            )
    finally:
        runner.max_failed_agent_ratio = 1.0
