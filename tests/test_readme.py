"""The README's commands are the ones CI and users run."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(bash env_setup\.sh && [^\n]+)\n```", text)


def test_ci_runs_exactly_the_readme_test_command():
    commands = _readme_commands()
    test_commands = [c for c in commands if "pytest" in c]
    assert len(test_commands) == 1
    ci_lines = [
        line
        for line in (ROOT / ".ci/run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci_lines == test_commands


def test_readme_train_command_uses_the_installed_entry_point():
    train = [c for c in _readme_commands() if "grl-train" in c]
    assert train == ["bash env_setup.sh && .venv/bin/grl-train preset=cpu"]
    assert (ROOT / "configs/preset/cpu.yaml").exists()
