"""Shared models, prompts and engines for the engine tests.

Engines are session-scoped: building one costs seconds (vLLM: tens of
seconds), and none of the tests leaves its weights changed.
"""

import os
import shutil
from pathlib import Path

import pytest
from prompts import chat_prompts

# A smaller KV cache allocates faster; a user's own setting wins.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def save_perturbed(model, out_dir, seed=1, scale=10.0):
    """Save `model` with every weight moved by seeded noise, large enough that
    the random tiny model stops repeating its last prompt token (tied embeddings
    move together) and return the new state dict."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        state = {
            name: (t + scale * t.std() * torch.randn(t.shape, generator=generator)).contiguous()
            for name, t in model.state_dict().items()
            if name != "lm_head.weight"
        }
    model.save_pretrained(out_dir, state_dict=state)
    for source in Path(model.name_or_path).iterdir():  # tokenizer and chat template
        if not (Path(out_dir) / source.name).exists():
            shutil.copy(source, out_dir)
    return state


@pytest.fixture(scope="package", autouse=True)
def one_torch_thread():
    """Two OpenMP threads on two shared, busy cores run 5x slower than one
    (measured); the engines themselves keep torch's default."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def perturbed_copy():
    """save_perturbed, for tests (a conftest cannot be imported from)."""
    return save_perturbed


@pytest.fixture(scope="session")
def tiny_path():
    from grl.models import resolve_model_path

    return resolve_model_path("tiny")


@pytest.fixture(scope="session")
def embedded_path():
    from grl.models import resolve_model_path

    return resolve_model_path("embedded")


@pytest.fixture(scope="session")
def tokenizer(tiny_path):
    from grl.models import load_tokenizer

    return load_tokenizer(tiny_path)


@pytest.fixture(scope="session")
def prompts(tokenizer):
    return chat_prompts(tokenizer)


@pytest.fixture(scope="session")
def hf_tiny(tiny_path):
    from grl.engines import make_engine

    engine = make_engine("hf", tiny_path, seed=0)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="session")
def hf_embedded(embedded_path):
    from grl.engines import make_engine

    engine = make_engine("hf", embedded_path)
    yield engine
    engine.shutdown()
