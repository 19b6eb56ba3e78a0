"""Shared helpers of the agent tests: task blocks read from configs/agents.yaml."""

import copy
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = ROOT.parent / "shared" / "data"
GSM8K_TEST = SHARED_DATA / "gsm8k" / "test.jsonl"


@pytest.fixture(scope="session")
def agents_yaml() -> dict:
    return yaml.safe_load((ROOT / "configs" / "agents.yaml").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def task(agents_yaml):
    """A deep copy of a task block, with agent_config / env_config keys replaced."""

    def build(name: str, agent: dict | None = None, env: dict | None = None) -> dict:
        block = copy.deepcopy(agents_yaml[name])
        block["agent_config"].update(agent or {})
        block["env_config"].update(env or {})
        return block

    return build


def state_of(user_message: str) -> str:
    """The state a user message shows: the lines between `State:` and the budget line."""
    body = user_message.rsplit("State:\n", 1)[1]
    return body.rsplit("\n", 1)[0]
