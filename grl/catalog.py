"""`grl list` (and `grl-train --list`): what a config can name, read from where the config itself reads it:
the presets of configs/preset/, the task instances of a checked config (configs/agents.yaml and what a
preset adds, `grl.config.task_blocks`) with the env each drives, and the engine registry (grl/engines)."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from grl.schema import PROGRAM


def _columns(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1]
        for row in rows
    ]


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    found = re.match(r"(.+?[.!?])(\s|$)", text)
    return found.group(1) if found else text


def module_summary(target: str) -> str:
    """The first line of the docstring of the module a "module:function" path names, read without importing
    it (an engine's module imports torch or vllm)."""
    spec = importlib.util.find_spec(target.split(":", 1)[0])
    if spec is None or spec.origin is None:
        return ""
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text()))
    return doc.splitlines()[0] if doc else ""


def _settings(blocks: dict[str, DictConfig]) -> dict[str, str]:
    """Each task instance's env_config values that tell it from the other instances of its env
    (simpleSokobanAgent's dim_room, a GEM instance's env_id), as `key=value` text."""
    plain = {name: OmegaConf.to_container(block.env_config, resolve=True) for name, block in blocks.items()}
    differ = {
        key
        for config in plain.values()
        for key in config
        if len({repr(c.get(key)) for c in plain.values()}) > 1
    }
    return {
        name: " ".join(
            f"{key}={str(value).replace(' ', '')}" for key, value in config.items() if key in differ
        )
        for name, config in plain.items()
    }


def task_rows(blocks: dict[str, DictConfig]) -> list[tuple[str, str, str]]:
    """(name, env, one line) of each checked task instance block: the first sentence of its prompt, its
    turns and tools, and the env settings that set it apart."""
    import grl.agents

    envs = {
        name: PROGRAM if b.agent_type == PROGRAM else grl.agents.env_name(b.agent_type)
        for name, b in blocks.items()
    }
    apart = {}
    for env in set(envs.values()):
        apart.update(_settings({name: block for name, block in blocks.items() if envs[name] == env}))
    rows = []
    for name, block in blocks.items():
        settings = block.agent_config
        if block.agent_type == PROGRAM:
            rows.append(
                (name, PROGRAM, f"an agent program, {settings.program} (up to {settings.max_turns} calls)")
            )
            continue
        turns = f"{settings.max_turns} turn{'s' if settings.max_turns > 1 else ''}"
        tools = f", tools: {', '.join(settings.tools)}" if settings.tools else ""
        extra = f"; {apart[name]}" if apart[name] else ""
        rows.append((name, envs[name], f"{_first_sentence(settings.prompt)} ({turns}{tools}{extra})"))
    return rows


def catalog(config_dir: str | Path | None, tasks: dict[str, DictConfig]) -> str:
    """The listing `grl list` prints: the presets of `config_dir` (default configs/), the task instance
    blocks `tasks` and the registered engines."""
    from grl.composition import presets
    from grl.engines import ENGINES

    lines = ["presets (preset=NAME; configs/preset/):", *_columns(sorted(presets(config_dir).items()))]
    lines += ["", "task instances (rollout.training=[NAME], grl play NAME; configs/agents.yaml):"]
    lines += _columns(task_rows(tasks))
    engines = [("auto", "resolved once per run for the machine (grl/machine.py)")]
    engines += [(name, module_summary(target)) for name, target in ENGINES.items()]
    lines += ["", "engines (actor_rollout_ref.rollout.name=NAME; grl/engines/):", *_columns(engines)]
    return "\n".join(lines)
