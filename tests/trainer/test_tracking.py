import io
import json
import math

import yaml

from grl.tracking import METRICS_FILE, Tracker, console_line, read_jsonl, save_run_info
from grl.tracking.loggers import ConsoleLogger, clean


def test_jsonl_one_object_per_step_and_nan_is_null(tmp_path):
    tracker = Tracker(["jsonl"], tmp_path, "p", "e")
    tracker.log({"reward/mean": 0.5, "actor/pg_loss": float("nan"), "note": "text", "flag": True}, step=1)
    tracker.log({"val-env/simpleSokobanAgent/success": 0.25}, step=2)
    tracker.close()
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 1, "reward/mean": 0.5, "actor/pg_loss": None},
        {"step": 2, "val-env/simpleSokobanAgent/success": 0.25},
    ]


def test_resume_drops_steps_after_the_checkpoint(tmp_path):
    tracker = Tracker(["jsonl"], tmp_path, "p", "e")
    for step in (0, 1, 2, 3):
        tracker.log({"x": step}, step)
    tracker.close()
    with open(tmp_path / METRICS_FILE, "a") as f:
        f.write('{"step": 2, "x": \n')  # a line cut short by a crash
    tracker = Tracker(["jsonl"], tmp_path, "p", "e", resume_step=2)
    tracker.log({"x": 30}, 3)
    tracker.close()
    assert [(r["step"], r["x"]) for r in read_jsonl(tmp_path / METRICS_FILE)] == [
        (0, 0),
        (1, 1),
        (2, 2),
        (3, 30),
    ]
    # a fresh run (no resume) starts a new history
    Tracker(["jsonl"], tmp_path, "p", "e").close()
    assert read_jsonl(tmp_path / METRICS_FILE) == []


def test_console_line_is_one_readable_line():
    metrics = clean(
        {
            "reward/mean": 0.25,
            "actor/pg_loss": -0.01,
            "timing_s/step": 3.2,
            "val-env/simpleSokobanAgent/success": 0.5,
            "critic/vf_loss": math.inf,
        }
    )
    line = console_line(metrics, 3, 10)
    assert "\n" not in line
    assert line.startswith("step 3/10 | reward +0.250")
    assert "pg -0.0100" in line and "step_s 3.2" in line and "val-env/simpleSokobanAgent success 0.50" in line
    assert "vf" not in line  # infinite -> None -> not shown
    assert "gen_s" not in line  # no rollout time logged
    split = {
        "timing_s/gen": 11.25,
        "timing_s/gen_engine": 8.0,
        "timing_s/gen_env": 1.125,
        "timing_s/gen_other": 2.125,
    }
    assert " | gen_s 11.2 (engine 8.0 env 1.1 other 2.1) | " in console_line({**metrics, **split}, 3, 10)
    out = io.StringIO()
    ConsoleLogger(10, out).log(metrics, 3)
    assert out.getvalue() == line + "\n"


def test_run_info_and_tensorboard_and_wandb_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    info = save_run_info(tmp_path, "model_path: tiny\n")
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == {"model_path": "tiny"}
    assert json.loads((tmp_path / "run_info.json").read_text())["git_sha"] == info["git_sha"]
    tracker = Tracker(["tensorboard", "wandb"], tmp_path, "proj", "exp", config={"a": 1})
    tracker.log({"reward/mean": 1.0}, 1)
    tracker.close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert list((tmp_path / "wandb").glob("offline-run-*"))
