"""`grl list` / `grl-train --list`: the presets, task instances and engines, read from where the config reads
them."""

import shutil
from pathlib import Path

import yaml

import grl.agents
from grl.cli import main
from grl.engines import ENGINES

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def listing(capsys, *args) -> dict[str, list[list[str]]]:
    """The printed sections (title -> rows split into columns at two or more spaces)."""
    assert main(["list", *args]) == 0
    sections, title = {}, None
    for line in capsys.readouterr().out.splitlines():
        if line and not line.startswith(" "):
            title = line.split(" (", 1)[0]
            sections[title] = []
        elif line.strip():
            sections[title].append([cell.strip() for cell in line.split("  ") if cell.strip()])
    return sections


def test_lists_every_preset_task_instance_and_engine(capsys):
    shown = listing(capsys)
    presets = {row[0]: row[-1] for row in shown["presets"]}
    files = sorted(CONFIGS.glob("preset/*.yaml"))
    assert sorted(presets) == [p.stem for p in files]
    for path in files:  # each preset file opens with Hydra's @package line, then what the preset is
        assert presets[path.stem] == path.read_text().splitlines()[1].removeprefix("# ")
    tasks = {row[0]: row[1:] for row in shown["task instances"]}
    blocks = yaml.safe_load((CONFIGS / "agents.yaml").read_text())
    assert sorted(tasks) == sorted(blocks)
    for name, block in blocks.items():
        env = "program" if block["agent_type"] == "program" else grl.agents.env_name(block["agent_type"])
        assert tasks[name][0] == env, name
    assert (
        "dim_room=[6,6]" in tasks["simpleSokobanAgent"][1]
        and "dim_room=[8,8]" in tasks["largeSokobanAgent"][1]
    )
    assert tasks["gsm8kAgent_5_turn"][1].startswith("Solve the math word problem. (5 turns")
    assert [row[0] for row in shown["engines"]] == ["auto", *ENGINES]
    assert all(row[-1] for row in shown["engines"])


def test_a_preset_and_a_task_of_ones_own_config_dir_are_listed(tmp_path, capsys):
    mine = tmp_path / "configs"
    shutil.copytree(CONFIGS, mine)
    (mine / "preset" / "mine.yaml").write_text(
        "# @package _global_\n# My own preset.\ntotal_training_steps: 3\n"
    )
    with open(mine / "agents.yaml", "a") as agents:
        agents.write(
            "\nmyMaze:\n  agent_type: sokobanAgent\n  agent_config:\n    prompt: Walk the maze.\n    "
            "max_turns: 3\n"
        )
    shown = listing(capsys, "--config-dir", str(mine))
    assert ["mine", "My own preset."] in shown["presets"]
    assert ["myMaze", "sokoban", "Walk the maze. (3 turns)"] in shown["task instances"]


def test_grl_train_list_prints_the_same(capsys):
    from grl import train

    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    assert train.main(["--list"]) == 0
    assert capsys.readouterr().out == listed
