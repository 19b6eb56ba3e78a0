"""Blame for agent programs: a program says whose doing its episode's end is by what it raises, and its
timeout is the policy's only when the model's replies kept it busy (grl/gateway/program_pool.py
`timeout_blamed`). The engine is the real tiny model, each call slowed to a known time."""

import time

import pytest

from grl.engines import SamplingParams, make_engine
from grl.gateway.program_pool import ProgramOutcome, timeout_blamed
from grl.gateway.programs import ProgramRunner
from grl.models import load_tokenizer
from grl.rollout import TaskSpec
from grl.rollout.blame import INFRA, POLICY, blame_metrics
from grl.agents import task_from_block

CALL_S = 0.4  # what each engine call takes here


class SlowEngine:
    """The real engine, each call taking at least CALL_S: a model that writes long replies."""

    def __init__(self, engine):
        self.engine = engine

    def generate(self, prompts, sampling, constraints=None):
        time.sleep(CALL_S)
        return self.engine.generate(prompts, sampling, constraints)


@pytest.fixture(scope="module")
def runner():
    engine = make_engine("hf", "tiny", dtype="float32", device="cpu")
    tokenizer = load_tokenizer("tiny")
    runner = ProgramRunner(
        SlowEngine(engine),
        tokenizer,
        context=4096,
        max_response_length=8,
        env_error_penalty=-5.0,
        max_failed_agent_ratio=1.0,
    )
    yield runner
    runner.close()
    engine.shutdown()


def task(name: str, program: str, **agent) -> TaskSpec:
    block = {
        "agent_type": "program",
        "agent_config": {"program": f"tests.gateway.blame_programs:{program}", "max_turns": 1000, **agent},
        "env_config": {},
    }
    return TaskSpec(name, task_from_block(name, block), 1, 1)


def test_a_program_s_faults_and_timeouts_are_blamed(runner):
    tasks = [
        task("policy", "blames_the_policy"),
        task("sandbox", "blames_the_sandbox"),
        task("asking", "keeps_asking", program_timeout=3),
    ]
    episodes, _ = runner.run(tasks, 0, 0, SamplingParams(temperature=1.0, seed=0))
    # Alone, so that its one call waits for no other episode's: a call queued behind others' waits for the
    # model too.
    episodes += runner.run(
        [task("hanging", "hangs_after_a_call", program_timeout=6)], 0, 3, SamplingParams(temperature=1.0)
    )[0]
    ended = {e.task: (e.blame, e.error_kind, e.score) for e in episodes}
    assert ended == {
        "policy": (POLICY, "policy", -0.1),  # the task's format penalty, trained on
        "sandbox": (INFRA, "sandbox", -5.0),  # env_error_penalty, recorded, left out of training
        "asking": (POLICY, "reply_timeout", -0.1),  # its calls waited for the model nearly all of its time
        "hanging": (INFRA, "timeout", -5.0),  # one call, then its own code ran out the clock
    }
    by_task = {e.task: e for e in episodes}
    assert "PolicyFault: the reply names no move" in by_task["policy"].error
    assert "waiting for the model's replies" in by_task["asking"].error
    metrics = blame_metrics(episodes)
    assert metrics["rollout/policy_failed_episodes"] == 2 and metrics["rollout/infra_failed_episodes"] == 2
    assert metrics["rollout/infra_failed/sandbox"] == 1 and metrics["rollout/infra_failed/timeout"] == 1


def test_a_timeout_is_the_policy_s_only_if_the_replies_kept_the_program_busy_to_the_end():
    timed_out = ProgramOutcome(error="timed out after 3 s (program_timeout)", kind="timeout")
    kinds = {
        (busy, idle): timeout_blamed(timed_out, busy, idle, timeout=3.0).kind
        for busy, idle in [(2.9, 0.0), (2.0, 0.2), (2.0, 1.0), (1.0, 0.0), (0.0, None)]
    }
    # Busy half the clock and to its end; then: it stopped asking a second before (its own code hung), it
    # waited for the model a third of its time, it never asked.
    assert kinds == {
        (2.9, 0.0): "reply_timeout",
        (2.0, 0.2): "reply_timeout",
        (2.0, 1.0): "timeout",
        (1.0, 0.0): "timeout",
        (0.0, None): "timeout",
    }
    assert timeout_blamed(ProgramOutcome(error="boom", kind="crash"), 3.0, 0.0, timeout=3.0).kind == "crash"
