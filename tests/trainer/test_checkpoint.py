import json
import random

import numpy as np
import pytest
import torch

from grl.rng import rng_state, set_rng_state
from grl.trainer import checkpoint as ckpt


def write_parts(tmp):
    (tmp / "actor").mkdir()
    (tmp / "actor" / "weights.bin").write_bytes(b"w")


def test_write_marks_latest_and_resume_auto_finds_it(tmp_path):
    assert ckpt.resume_path("auto", tmp_path) is None
    path = ckpt.write_checkpoint(tmp_path, 3, write_parts, {"global_step": 3})
    assert path == tmp_path / "global_step_3"
    assert (tmp_path / "latest").read_text().strip() == "global_step_3"
    assert ckpt.resume_path("auto", tmp_path) == path
    assert ckpt.read_state(path) == {"global_step": 3}
    assert (path / "actor" / "weights.bin").read_bytes() == b"w"
    assert ckpt.resume_path("disable", tmp_path) is None
    assert ckpt.resume_path(str(path), tmp_path) == path


def test_failed_write_leaves_previous_checkpoint(tmp_path):
    ckpt.write_checkpoint(tmp_path, 1, write_parts, {"global_step": 1})

    def crash(tmp):
        write_parts(tmp)
        raise RuntimeError("worker died mid-save")

    with pytest.raises(RuntimeError):
        ckpt.write_checkpoint(tmp_path, 2, crash, {"global_step": 2})
    assert not (tmp_path / "global_step_2").exists()
    assert ckpt.resume_path("auto", tmp_path) == tmp_path / "global_step_1"
    # the next successful write removes the leftover of the crashed one
    ckpt.write_checkpoint(tmp_path, 2, write_parts, {"global_step": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_1", "global_step_2", "latest"]


def test_marker_naming_incomplete_folder_is_ignored(tmp_path):
    (tmp_path / "global_step_5").mkdir()
    (tmp_path / "latest").write_text("global_step_5\n")
    assert ckpt.resume_path("auto", tmp_path) is None
    (tmp_path / "latest").write_text("../../etc\n")
    assert ckpt.resume_path("auto", tmp_path) is None
    with pytest.raises(FileNotFoundError, match="resume_mode"):
        ckpt.resume_path(str(tmp_path / "global_step_5"), tmp_path)


def test_max_to_keep_prunes_oldest(tmp_path):
    for step in (1, 2, 3, 4):
        ckpt.write_checkpoint(tmp_path, step, write_parts, {"global_step": step}, max_to_keep=2)
    assert sorted(p.name for p in tmp_path.glob("global_step_*")) == ["global_step_3", "global_step_4"]
    ckpt.write_checkpoint(tmp_path, 4, write_parts, {"global_step": 4}, max_to_keep=None)
    assert ckpt.resume_path("auto", tmp_path) == tmp_path / "global_step_4"


def test_rng_state_round_trips_through_json():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    state = json.loads(json.dumps(rng_state()))
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_a_checkpoint_of_the_old_full_state_format_fails_with_one_line(tmp_path):
    def old_parts(tmp):
        (tmp / "actor").mkdir()
        torch.save({"w": torch.zeros(2)}, tmp / "actor" / "model.pt")
        torch.save({}, tmp / "actor" / "optim.pt")

    path = ckpt.write_checkpoint(tmp_path, 3, old_parts, {"global_step": 3})
    for mode in ("auto", str(path)):
        with pytest.raises(ValueError, match="old full-state format") as err:
            ckpt.resume_path(mode, tmp_path)
        assert "\n" not in str(err.value) and str(path / "actor") in str(err.value)


def test_rng_state_of_the_older_tensor_format_still_restores():
    """Worker checkpoints written before the states were lists held tensors and tuples."""
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(4), np.random.seed(4), torch.manual_seed(4)
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
