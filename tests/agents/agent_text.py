"""Paths and text helpers shared by the agent tests (a module of its own: `conftest` names collide
across test folders)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = ROOT.parent / "shared" / "data"
GSM8K_TEST = SHARED_DATA / "gsm8k" / "test.jsonl"


def state_of(user_message: str) -> str:
    """The state a user message shows: the lines between `State:` and the budget line."""
    body = user_message.rsplit("State:\n", 1)[1]
    return body.rsplit("\n", 1)[0]
