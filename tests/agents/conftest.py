"""Shared helpers of the agent tests: task blocks read from configs/agents.yaml."""

import copy

import pytest
import yaml
from agent_text import ROOT


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
