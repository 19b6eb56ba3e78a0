"""The driver never initialises CUDA (which opens a context of ~0.5 GiB on GPU 0 for the whole run, one the
memory plan does not count): what it needs of the GPU, its name for the MFU and its memory for the plan,
comes from a child process, and it keeps no CUDA RNG state. Checked here with torch pretending to see a
GPU and failing the test the moment CUDA would be initialised."""

import stat
import sys

import pytest
import torch

from grl.config import load_config, run_sections
from grl.planner import peak_flops
from grl.machine import cuda_device, machine_facts
from grl.planner.memory import plan_run
from grl.rng import rng_state
from grl.trainer.metrics import mfu_inputs

H100 = ("NVIDIA H100 80GB HBM3", 85_520_809_984)


def _context_opened(*args, **kwargs):
    raise AssertionError("the driver initialised CUDA, which opens a context on GPU 0")


@pytest.fixture
def gpu_seen_no_context(monkeypatch):
    """torch in this process reports a GPU; initialising CUDA fails the test."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for module in (torch.cuda, torch.cuda.random):
        monkeypatch.setattr(module, "_lazy_init", _context_opened)
    cuda_device.cache_clear()
    yield
    cuda_device.cache_clear()


@pytest.fixture
def child_sees_h100(tmp_path, monkeypatch):
    """The child process the driver asks is a stand-in that answers as torch would on an H100."""
    name, memory = H100
    child = tmp_path / "python"
    child.write_text(f'#!/bin/sh\necho \'{{"name": "{name}", "total_memory": {memory}}}\'\n')
    child.chmod(child.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(sys, "executable", str(child))


def test_the_driver_asks_a_child_for_the_gpu(gpu_seen_no_context, child_sees_h100):
    assert machine_facts("auto", "hf").gpu_memory_gib == pytest.approx(H100[1] / 2**30)
    shape, peak = mfu_inputs("tiny", "cuda")
    assert shape is not None and peak == peak_flops("H100") > 0
    cfg = load_config(["model_path=tiny", "trainer.device=cuda", "trainer.gpu_memory_gb=null"])
    assert plan_run(run_sections(cfg)).capacity == pytest.approx(H100[1])


def test_without_an_answer_the_gpu_is_unknown_and_no_context_opens(gpu_seen_no_context):
    """Here the real child's torch sees no GPU: no memory, no MFU, and still no context in this process."""
    assert machine_facts("auto", "hf").gpu_memory_gib is None
    assert mfu_inputs("tiny", "cuda") == (None, 0.0)


def test_the_driver_keeps_no_cuda_rng_state(gpu_seen_no_context):
    assert "cuda" not in rng_state()
