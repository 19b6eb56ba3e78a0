"""The tiny model and its tokenizer, loaded once for the gateway's tests."""

import pytest

from grl.engines import make_engine
from grl.gateway import Gateway, SerialEngine
from grl.models import load_tokenizer
from tests.gateway.served import serve
from tests.gateway.templates import QWEN25


@pytest.fixture(scope="session")
def tiny():
    """(tokenizer, the engine behind a SerialEngine) of the tiny model, float32 on the CPU."""
    return load_tokenizer("tiny"), SerialEngine(make_engine("hf", "tiny", dtype="float32", device="cpu"))


@pytest.fixture(scope="module")
def served(tiny):
    """(gateway, its base URL): the tiny model behind the Qwen2.5 template, served over HTTP for the
    module."""
    tokenizer, engine = tiny
    gateway = Gateway(engine, tokenizer, "tiny", max_tokens=16, context=2048, chat_template=QWEN25)
    with serve(gateway) as base:
        yield gateway, base
