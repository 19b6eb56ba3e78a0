"""`grl plot` draws the logged curves of a run folder."""

import json
import subprocess
import sys

import matplotlib.image

from grl.tracking import METRICS_FILE, read_jsonl
from grl.tracking.plot import plot_run, smooth, success_metrics


def write_run(run_dir, steps=6):
    rows = []
    for step in range(1, steps + 1):
        row = {
            "step": step,
            "reward/mean": 0.1 * step,
            "response_length/mean": 40 + step,
            "actor/ppo_kl": 0.001 * step,
            "actor/entropy": 2.0 - 0.1 * step,
            "env/simpleSokobanAgent/success": step / steps,
            "env/simpleSokobanAgent/score": step / steps,
            "actor/pg_loss": 0.1,
            "critic/vf_loss": 1.0 / step,
            "actor/grad_norm": 0.5,
            "timing_s/update_actor": 2.0,
            "timing_s/gen": 3.0,
            "timing_s/gen_engine": 2.0,
            "timing_s/gen_env": 0.5,
            "timing_s/gen_other": 0.5,
        }
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
    assert image.shape[0] > 800 and image.shape[1] > 1000  # a 3-column grid of ten panels


def test_panels_name_every_quantity(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    write_run(tmp_path)
    titles = []
    real_savefig = plt.Figure.savefig

    lines = {}

    def keep_titles(fig, *args, **kwargs):
        titles.extend(ax.get_title() for ax in fig.axes if ax.get_visible())
        for ax in fig.axes:
            lines[ax.get_title()] = [
                line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")
            ]
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", keep_titles)
    plot_run(tmp_path)
    assert lines["generation: engine, env, other (s)"] == ["gen", "gen_engine", "gen_env", "gen_other"]
    assert lines["time per phase (s)"] == ["update_actor"]
    assert titles == [
        "success per task",
        "reward per task",
        "actor loss",
        "critic loss",
        "KL",
        "entropy",
        "grad norm",
        "response length (tokens)",
        "time per phase (s)",
        "generation: engine, env, other (s)",
    ]


def test_a_critic_free_run_with_a_decoy_control_draws_the_proof_in_place_of_the_critic(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    rows = [
        {
            "step": step,
            "actor/pg_loss": 0.1,
            "actor/entropy": 1.0,
            "train/tetris/success": step / 4,
            "timing_s/rollout": 3.0,
        }
        for step in range(5)
    ]
    for row in rows[::2]:
        row.update(
            {
                "val-env/tetris/success": row["step"] / 5,
                "val-env/tetris/success_swapped": 0.2,
                "val-env/tetris/input_mi": 0.1 * row["step"],
            }
        )
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    panels = {}
    real_savefig = plt.Figure.savefig

    def keep_panels(fig, *args, **kwargs):
        panels.update(
            {
                ax.get_title(): [line.get_label() for line in ax.get_lines()]
                for ax in fig.axes
                if ax.get_visible()
            }
        )
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", keep_panels)
    plot_run(tmp_path)
    assert list(panels) == [
        "success per task",
        "input_mi (nats, validation)",
        "actor loss",
        "entropy",
        "time per phase (s)",
    ]
    assert {"val-env/tetris", "val-env/tetris decoy board", "train/tetris"} <= set(panels["success per task"])
    assert "val-env/tetris" in panels["input_mi (nats, validation)"]


def test_success_curves_pair_training_and_validation_per_task(tmp_path):
    write_run(tmp_path)
    from grl.tracking import read_jsonl

    names = success_metrics(read_jsonl(tmp_path / "metrics.jsonl"))
    assert names == [
        "env/simpleSokobanAgent/success",
        "val-env/simpleSokobanAgent/success",
        "val-env/tetrisAgent_type_1_dim_4/success",
    ]


def test_train_prefix_is_read_too(tmp_path):
    rows = [{"step": 1, "train/gsm8k/success": 0.5, "val-env/gsm8k/success": 0.25}]
    assert success_metrics(rows) == ["train/gsm8k/success", "val-env/gsm8k/success"]


def test_smoothing_matches_a_plain_ema():
    values = [1.0, 0.0, 1.0, 1.0]
    w, avg, expected = 0.5, 0.0, []
    for k, v in enumerate(values, start=1):
        avg = w * avg + (1 - w) * v
        expected.append(avg / (1 - w**k))
    assert smooth(values, 0.5) == expected
    assert smooth(values, 0.0) == values


def test_cli(tmp_path):
    write_run(tmp_path)
    out = tmp_path / "x.pdf"
    result = subprocess.run(
        [sys.executable, "-m", "grl.cli", "plot", str(tmp_path), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert out.read_bytes().startswith(b"%PDF")
    missing = subprocess.run(
        [sys.executable, "-m", "grl.cli", "plot", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and "metrics.jsonl" in missing.stderr
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    empty = subprocess.run(
        [sys.executable, "-m", "grl.cli", "plot", str(tmp_path / "empty")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert empty.returncode == 2 and "no logged step" in empty.stderr


def test_tracker_draws_the_curves_a_minute_in_then_once_a_minute_and_at_the_end(tmp_path, monkeypatch):
    import grl.tracking
    from grl.tracking import Tracker

    drawn = []  # the steps logged when each drawing was made
    real_plot = grl.tracking.Tracker.plot

    def counted_plot(self):
        drawn.append(len(read_jsonl(self.run_dir / METRICS_FILE)))
        real_plot(self)

    monkeypatch.setattr(grl.tracking.Tracker, "plot", counted_plot)
    tracker = Tracker(["jsonl"], tmp_path, "p", "e")
    tracker.log({"reward/mean": 0.5, "env/simpleSokobanAgent/success": 0.25}, step=1)
    tracker.log({"reward/mean": 0.6}, step=2)  # within REPLOT_S of the start: not drawn
    assert drawn == [] and not (tmp_path / "curves.png").exists()
    monkeypatch.setattr(grl.tracking, "REPLOT_S", 0.0)  # a minute later
    tracker.log({"reward/mean": 0.7, "val-env/simpleSokobanAgent/success": 0.5}, step=3)
    assert drawn == [3] and (tmp_path / "curves.png").exists()
    monkeypatch.setattr(grl.tracking, "REPLOT_S", 3600.0)
    tracker.log({"reward/mean": 0.9}, step=4)
    tracker.close()
    assert drawn == [3, 4]
    assert matplotlib.image.imread(tmp_path / "curves.png").shape[1] > 1000

    (tmp_path / "one").mkdir()
    one_step = Tracker(["jsonl"], tmp_path / "one", "p", "e")
    one_step.log({"reward/mean": 0.5}, step=1)
    one_step.close()  # a run shorter than a minute draws once, at its end
    assert drawn == [3, 4, 1]


def drawn_panels(tmp_path, monkeypatch) -> dict:
    """Panel title -> its axes, as `plot_run` saved them."""
    import matplotlib.pyplot as plt

    panels = {}
    real_savefig = plt.Figure.savefig

    def keep_axes(fig, *args, **kwargs):
        panels.update({ax.get_title(): ax for ax in fig.axes if ax.get_visible()})
        return real_savefig(fig, *args, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", keep_axes)
    plot_run(tmp_path)
    return panels


def test_a_run_of_one_step_marks_each_point_on_integer_steps(tmp_path, monkeypatch):
    write_run(tmp_path, steps=1)
    panels = drawn_panels(tmp_path, monkeypatch)
    assert len(panels) == 10
    for title, ax in panels.items():
        drawn = [line for line in ax.get_lines() if len(line.get_xdata()) == 1]
        assert drawn, title
        # a line through one point is invisible: each point needs a marker of its own
        assert all(line.get_marker() not in (None, "None", "", " ") for line in drawn), title
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert 1.0 in ticks and all(t == int(t) for t in ticks), (title, ticks)


def test_a_long_run_draws_lines_without_markers(tmp_path, monkeypatch):
    from grl.tracking.plot import MARKED_POINTS

    write_run(tmp_path, steps=MARKED_POINTS + 1)
    lines = drawn_panels(tmp_path, monkeypatch)["entropy"].get_lines()
    assert lines and all(line.get_marker() in (None, "None", "") for line in lines)


def test_several_runs_compare_on_one_figure_by_step_and_by_minutes(tmp_path):
    from grl.tracking.plot import compare_runs, minutes

    for name in ("rl", "opd"):
        (tmp_path / name).mkdir()
        write_run(tmp_path / name)
    rows = read_jsonl(tmp_path / "rl" / METRICS_FILE)
    rows[1]["timing_s/step"], rows[3]["timing_s/testing"] = 30.0, 90.0
    assert minutes(rows) == [0.0, 0.5, 0.5, 2.0, 2.0, 2.0]  # steps and validations summed, in minutes
    out = compare_runs([tmp_path / "rl", tmp_path / "opd"], tmp_path / "compare.png", ["RL", "OPD"])
    assert matplotlib.image.imread(out).shape[1] > 800
    cli = [sys.executable, "-m", "grl.cli", "plot", str(tmp_path / "rl"), str(tmp_path / "opd")]
    unnamed = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert unnamed.returncode == 2 and "--out" in unnamed.stderr
    named = subprocess.run(
        [*cli, "--out", str(tmp_path / "c.pdf")], capture_output=True, text=True, timeout=120
    )
    assert named.returncode == 0 and (tmp_path / "c.pdf").read_bytes().startswith(b"%PDF")
