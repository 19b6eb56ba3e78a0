"""The spawn-process proxy, driven with the (cheap) hf engine as its target."""

import os
import signal
from pathlib import Path

import pytest

from grl.engines import SamplingParams
from grl.engines.proxy import EngineProcessError, SubprocessEngine
from grl.models import ModelLoadError

HF = "grl.engines.hf:HFEngine"


@pytest.mark.slow
def test_calls_match_the_engine_in_process_and_errors_keep_their_type(hf_tiny, tiny_path, prompts):
    remote = SubprocessEngine(HF, {"model_path": tiny_path}, env={"OMP_NUM_THREADS": "1"})
    try:
        sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=2)
        assert remote.generate(prompts[:3], sampling) == hf_tiny.generate(prompts[:3], sampling)
        with pytest.raises(ValueError, match="prompt 0 is empty") as caught:
            remote.generate([[]], sampling)
        assert "in the engine process" in "".join(caught.value.__notes__)
        remote.update_weights(hf_tiny.model.state_dict())  # tensors cross by value
        os.kill(remote.pid, signal.SIGKILL)
        with pytest.raises(EngineProcessError, match="exited with code -9"):
            remote.generate(prompts[:1], sampling)
    finally:
        remote.shutdown()
    assert not Path(f"/proc/{remote.pid}").exists()


@pytest.mark.slow
def test_a_failed_start_raises_in_the_parent(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        SubprocessEngine(HF, {"model_path": str(tmp_path / "missing" / "model")})
