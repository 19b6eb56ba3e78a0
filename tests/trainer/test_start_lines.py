"""What a run says before it trains: the banner lists only what will run, a resumed run names its
checkpoint, its step and the steps left, and a run with nothing left to train says so and exits 0
before any worker starts."""

import functools
from dataclasses import replace
from pathlib import Path

from grl.config import load_config, run_sections
from grl.run_plan import RunPlan
from grl.trainer import checkpoint as ckpt
from grl.trainer.report import start_report
from grl.trainer.resume import nothing_left_line, resume_line, resume_point

BASE = ["preset=cpu", "model_path=tiny"]


@functools.cache
def sections():
    """One composed config (a composition takes a second); each test varies its trainer section."""
    cfg = load_config(
        [*BASE, "rollout.validation=[simpleSokobanAgent]", "rollout.validation_agent_group_num=[4]"]
    )
    return run_sections(cfg), RunPlan.from_config(cfg)


def with_trainer(**keys):
    run, plan = sections()
    return replace(run, trainer=replace(run.trainer, **keys)), plan


def banner(start_step=0, **keys) -> dict[str, str]:
    run, plan = with_trainer(**keys)
    lines = start_report(run, replace(plan, device="cpu"), start_step).splitlines()[1:]
    return dict(line.strip().split(maxsplit=1) for line in lines)


def test_the_banner_lists_validation_tasks_only_when_validation_runs():
    assert banner(test_freq=5, val_before_train=False)["validation"] == "simpleSokobanAgent (4x1)"
    off = banner(test_freq=-1, val_before_train=False)["validation"]
    assert off == "off (trainer.test_freq=-1, trainer.val_before_train=false)"
    assert banner(test_freq=0, val_before_train=True)["validation"] == "simpleSokobanAgent (4x1)"
    resumed = banner(start_step=3, test_freq=0, val_before_train=True)["validation"]
    assert resumed == "off (trainer.test_freq=0; a resumed run skips trainer.val_before_train)"
    assert (
        banner(test_freq=-1, val_before_train=False, val_only=True)["validation"]
        == "simpleSokobanAgent (4x1)"
    )
    assert banner()["training"].startswith("tetrisAgent_gap_dim_4 (")
    assert banner(val_only=True)["training"] == "none (trainer.val_only)"


def fake_checkpoint(root, step):
    return ckpt.write_checkpoint(root, step, lambda tmp: None, {"global_step": step})


def test_the_resume_line_names_the_checkpoint_the_step_and_the_steps_left(tmp_path):
    path = fake_checkpoint(tmp_path, 3)

    def settings(**keys):
        return with_trainer(**{"default_local_dir": str(tmp_path), "resume_mode": "auto", **keys})[0].trainer

    five = settings(total_training_steps=5)
    assert (
        resume_line(resume_point(five), five) == f"grl-train: resumed from {path} (step 3): 2 of 5 steps left"
    )
    four = settings(total_training_steps=4)
    assert resume_line(resume_point(four), four).endswith("(step 3): 1 of 4 steps left")
    assert nothing_left_line(four) is None
    assert nothing_left_line(settings(total_training_steps=3)).startswith("grl-train: nothing left to train:")
    val_only = settings(total_training_steps=3, val_only=True)
    assert nothing_left_line(val_only) is None  # validating a finished run is something to do
    assert resume_line(resume_point(val_only), val_only).endswith(
        "trainer.val_only: validating once, training nothing"
    )
    assert resume_point(settings(resume_mode="disable")) is None


def test_a_run_with_nothing_left_says_so_in_one_line_and_exits_0_before_ray(tmp_path, capsys, monkeypatch):
    import tempfile

    from grl.train import main

    path = fake_checkpoint(tmp_path / "ckpt", 4)  # no weights: a run that went on would fail loading them
    ray_dir = Path(tempfile.mkdtemp(prefix="grl-ray-"))  # short: Ray's socket paths live in it
    monkeypatch.setenv("RAY_TMPDIR", str(ray_dir))
    status = main(
        [
            *BASE,
            f"trainer.default_local_dir={tmp_path}/ckpt",
            f"trainer.run_dir={tmp_path}/run",
            "total_training_steps=4",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert out.strip() == (
        f"grl-train: nothing left to train: {path} is step 4 of trainer.total_training_steps=4; raise "
        "trainer.total_training_steps to train on, or set trainer.resume_mode=disable (or another "
        "trainer.default_local_dir) to start over"
    ), out
    assert list(ray_dir.iterdir()) == [], "a Ray runtime was started"
    ray_dir.rmdir()
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
