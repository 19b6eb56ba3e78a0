"""scripts/install_dataset.sh: arguments, one-line failures without leftovers, and the math layout it
writes, which every math task instance then reads offline. The hub cannot be reached here, so the
"hub" datasets are local folders in the sets' hub layouts, read by the same `datasets.load_dataset` call."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grl.agents import make_agent
from grl.config import load_config, task_instance

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install_dataset.sh"
SETS = {  # one row per set, in the layout its hub dataset has
    "math500": {
        "problem": "Compute $\\dbinom{8}{4}$.",
        "solution": "$\\boxed{70}$",
        "answer": "70",
        "level": 2,
    },
    "aime24": {"id": 60, "problem": "Find the remainder.", "solution": "so \\boxed{204}.", "url": "u"},
    "aime25": {"problem": "Find the sum of the bases.", "answer": "70", "id": "0"},
    "amc23": {"id": 0, "question": "How many squares?", "answer": 12.0, "url": "u"},
    "minervamath": {"question": "Compute the wavelength.", "answer": "4.5e-7", "type": "Physics"},
}


def install(*args, env=None, cwd=None):
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONPATH": str(ROOT),
        **(env or {}),
    }
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "nothing to install"),
        (["--mathh"], "unknown argument: --mathh"),
        (["--math", "--data-dir"], "--data-dir needs a folder"),
    ],
)
def test_bad_arguments_exit_2(args, message):
    out = install(*args)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr


def test_help_names_every_set():
    out = install("--help")
    assert out.returncode == 0 and "--math" in out.stdout
    assert "math/{math500,aime24,aime25,amc23,minervamath}" in out.stdout


def test_an_unreachable_hub_is_one_line_per_item_with_a_manual_hint_and_leaves_nothing(tmp_path):
    data = tmp_path / "data"
    out = install("--math", "--gsm8k", "--data-dir", str(data), env={"HF_HOME": str(tmp_path / "hf")})
    assert out.returncode == 1 and "Traceback" not in out.stderr
    failed = [line for line in out.stderr.splitlines() if line.startswith("FAILED:")]
    assert len(failed) == 7 and all("by hand: save its" in line for line in failed)
    assert not data.exists()  # no empty folders, no .part files


@pytest.mark.slow
def test_math_install_writes_the_layout_every_math_task_reads(tmp_path, monkeypatch):
    hub = {}
    for name, row in SETS.items():
        (tmp_path / "hub" / name).mkdir(parents=True)
        (tmp_path / "hub" / name / "test.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
        hub[f"GRL_{name.upper()}_DATASET"] = str(tmp_path / "hub" / name)
    data = tmp_path / "data"
    out = install("--math", "--data-dir", str(data), env={**hub, "HF_HOME": str(tmp_path / "hf")})
    assert out.returncode == 0, out.stderr
    for name, row in SETS.items():
        written = json.loads((data / "math" / name / "test.jsonl").read_text(encoding="utf-8"))
        assert list(written)[:2] == ["problem", "answer"]
        assert written["problem"] == row.get("problem", row.get("question"))
    assert json.loads((data / "math" / "aime24" / "test.jsonl").read_text())["answer"] == "204"
    assert "have " in install("--math", "--data-dir", str(data)).stdout  # a second run keeps what is there

    monkeypatch.setenv("GRL_DATA_DIR", str(data))
    for name in SETS:
        for turns in ("single_turn", "5_turn"):
            task = f"{name}Agent_{turns}"
            cfg = load_config([f"rollout.training=[{task}]", f"rollout.validation=[{task}]"])
            agent = make_agent(task, task_instance(cfg, task))
            assert SETS[name].get("problem", SETS[name].get("question")) in agent.reset(0)[1]["content"]
            agent.close()


def test_a_broken_archive_is_one_line_and_leaves_nothing(tmp_path):
    page = tmp_path / "minidev.zip"
    page.write_text("<html>please sign in</html>")  # what a server sends instead of the archive
    data = tmp_path / "data"
    out = install("--bird", "--small", "--data-dir", str(data), env={"GRL_BIRD_MINIDEV_URL": page.as_uri()})
    assert out.returncode == 1 and "Traceback" not in out.stderr and "BadZipFile" in out.stderr
    assert "by hand: unpack it into" in out.stderr and not data.exists()
