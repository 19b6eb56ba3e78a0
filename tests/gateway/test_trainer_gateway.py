"""The trainer's gateway keeps the run's `rollout.truncation`: a program's call longer than the context is cut
from the left (also under `right`, which would drop the newest message, the one the reply answers) unless the
run refuses long prompts (`error`)."""

from types import SimpleNamespace

import pytest

from grl.gateway.programs import ProgramRunner


@pytest.mark.parametrize("truncation, expected", [("left", "left"), ("right", "left"), ("error", "error")])
def test_the_trainers_gateway_truncates_as_the_run_says(tiny, truncation, expected):
    tokenizer, engine = tiny
    rollout = SimpleNamespace(truncation=truncation, env_error_penalty=None, max_failed_agent_ratio=0.5)
    data = SimpleNamespace(max_prompt_length=64, max_response_length=16)
    runner = ProgramRunner.from_config(rollout, data, engine.engine, tokenizer)
    try:
        assert runner.gateway.truncation == expected and runner.gateway.context == 80
    finally:
        runner.close()
