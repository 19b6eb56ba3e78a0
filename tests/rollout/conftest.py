import pytest


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The tiny model is far faster on one thread than on two contended ones
    (other test processes share this machine's cores)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def hf_engine():
    """The real HF engine with the tiny random model, loaded once for these tests."""
    from grl.engines import EngineOptions
    from grl.engines.hf import HFEngine

    return HFEngine("tiny", EngineOptions(dtype="float32", device="cpu"))


@pytest.fixture(scope="session")
def tokenizer(hf_engine):
    return hf_engine.tokenizer
