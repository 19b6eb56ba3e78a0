"""The tiny model and its tokenizer, loaded once for the gateway's tests."""

import pytest

from grl.engines import make_engine
from grl.gateway import SerialEngine
from grl.models import load_tokenizer


@pytest.fixture(scope="session")
def tiny():
    """(tokenizer, the engine behind a SerialEngine) of the tiny model, float32 on the CPU."""
    return load_tokenizer("tiny"), SerialEngine(make_engine("hf", "tiny", dtype="float32", device="cpu"))
