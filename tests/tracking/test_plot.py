"""`grl plot` draws the logged curves of a run folder."""

import json
import subprocess
import sys

import matplotlib.image

from grl.tracking.plot import plot_run, success_metrics


def write_run(run_dir, steps=6):
    rows = []
    for step in range(1, steps + 1):
        row = {"step": step, "reward/mean": 0.1 * step, "response_length/mean": 40 + step,
               "actor/ppo_kl": 0.001 * step, "actor/entropy": 2.0 - 0.1 * step,
               "env/simpleSokobanAgent/success": step / steps}
        if step % 2 == 0:
            row["val-env/simpleSokobanAgent/success"] = step / steps / 2
            row["val-env/tetrisAgent_type_1_dim_4/success"] = None  # non-finite values are logged as null
        rows.append(row)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_plot_writes_a_png_with_every_panel(tmp_path):
    write_run(tmp_path)
    path = plot_run(tmp_path)
    assert path == tmp_path / "curves.png"
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 200 and image.shape[1] > 1000  # five panels side by side


def test_success_curves_pair_training_and_validation_per_task(tmp_path):
    write_run(tmp_path)
    from grl.tracking import read_jsonl

    names = success_metrics(read_jsonl(tmp_path / "metrics.jsonl"))
    assert names == ["env/simpleSokobanAgent/success", "val-env/simpleSokobanAgent/success",
                     "val-env/tetrisAgent_type_1_dim_4/success"]


def test_cli(tmp_path):
    write_run(tmp_path)
    out = tmp_path / "x.png"
    result = subprocess.run([sys.executable, "-m", "grl.cli", "plot", str(tmp_path), "--out", str(out)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert out.stat().st_size > 10_000
    missing = subprocess.run([sys.executable, "-m", "grl.cli", "plot", str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "metrics.jsonl" in missing.stdout


def test_tracker_redraws_the_curves_at_each_validation(tmp_path):
    from grl.tracking import Tracker

    tracker = Tracker(["jsonl"], tmp_path, "p", "e")
    tracker.log({"reward/mean": 0.5, "env/simpleSokobanAgent/success": 0.25}, step=1)
    assert not (tmp_path / "curves.png").exists()  # no validation yet: nothing redrawn
    tracker.log({"reward/mean": 0.7, "val-env/simpleSokobanAgent/success": 0.5}, step=2)
    tracker.close()
    assert matplotlib.image.imread(tmp_path / "curves.png").shape[1] > 1000
