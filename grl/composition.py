"""Hydra composition: the schema's defaults, configs/agents.yaml, a preset and the command-line overrides
put together, before any check (grl/config.py checks the result).

GRL uses Hydra's compose API, not a Hydra job: nothing reads `hydra.*`, changes folder or sweeps. What a
Hydra user would type for those, and what Hydra words in its own terms (a preset it cannot find, a value
that would be a sweep), is said here in GRL's one line naming the key and the fix.
"""

from __future__ import annotations

import copy
import re
from dataclasses import fields
from pathlib import Path

from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from grl.schema import ConfigError, GRLConfig
from grl.schema.keys import defaults, did_you_mean, one_line

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
SCHEMA_NODE = "grl_schema"  # the name configs/base.yaml lists first in its defaults
RUN_FOLDERS = "trainer.run_dir (logs, curves) and trainer.default_local_dir (checkpoints)"


def presets(config_dir: str | Path | None = None) -> dict[str, str]:
    """The presets of configs/preset/ (or `config_dir`'s) -> the first line of each file's own comment."""
    found = {}
    for path in sorted(Path(config_dir or CONFIG_DIR).joinpath("preset").glob("*.yaml")):
        comments = (
            line.lstrip("#").strip() for line in path.read_text().splitlines() if line.startswith("#")
        )
        found[path.stem] = next((c for c in comments if c and not c.startswith("@package")), "")
    return found


def _split(override: str) -> tuple[str, str]:
    """An override's key (without Hydra's +, ++ or ~) and its value."""
    name, _, value = override.partition("=")
    return name.lstrip("+~"), value


def check_overrides(overrides: list[str] | tuple[str, ...], config_dir: Path) -> None:
    """What Hydra would accept and ignore, or word in its own terms: `hydra.*` settings, an unknown
    config group option (a preset's name)."""
    for override in overrides:
        name, value = _split(override)
        if name == "hydra" or name.startswith(("hydra.", "hydra/")):
            raise ConfigError(
                f"{name}: GRL composes its config with Hydra but runs no Hydra job, so hydra.* settings have "
                f"no effect; a run writes to {RUN_FOLDERS}"
            )
        group = config_dir / name
        if value in ("", "null") or value.startswith("[") or not group.is_dir():
            continue
        options = sorted(path.stem for path in group.glob("*.yaml"))
        if value not in options:
            raise ConfigError(
                f"{name}: no {name} named {value!r}{did_you_mean(value, options)}; the {name}s are "
                f"{', '.join(options)} (`grl list` describes them)"
            )


def _sweep_error(message: str) -> ConfigError | None:
    """Hydra's refusal of a sweep outside --multirun (`a,b`, `range(...)`, `choice(...)`) as the key and the
    fix."""
    found = re.match(r"(?:Ambiguous value for argument|Sweep parameters) '(.*)'", message)
    if not found:
        return None
    name, value = _split(found.group(1))
    plain = "(" not in value  # a,b: perhaps a list or a text was meant
    meant = (
        f"write a list as {name}=[{value}], quote text holding a comma ({name}='{value}'), or "
        if plain
        else ""
    )
    return ConfigError(
        f"{name}: {value!r} is a Hydra sweep, and GRL runs one config per command (no -m); {meant}"
        "run each value as its own command"
    )


_composed: dict[tuple, DictConfig] = {}


def compose(
    overrides: list[str] | tuple[str, ...] = (),
    config_name: str = "base",
    config_dir: str | Path | None = None,
) -> DictConfig:
    """Hydra composition only (no checks). A composition is kept, keyed by its inputs and the config
    files' modification times, and handed out as a copy: Hydra re-reads every YAML file on each call
    (~0.3 s), which a test suite composing the same overrides again pays each time."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.errors import HydraException

    from grl.schema import AgentConfig

    config_dir = Path(config_dir or CONFIG_DIR).resolve()
    files = tuple(sorted((str(path), path.stat().st_mtime_ns) for path in config_dir.rglob("*.yaml")))
    cache_key = (str(config_dir), config_name, tuple(overrides), files)
    if cache_key in _composed:
        return copy.deepcopy(_composed[cache_key])
    check_overrides(overrides, config_dir)
    ConfigStore.instance().store(name=SCHEMA_NODE, node=defaults(GRLConfig))
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=None):
            composed = hydra_compose(config_name=config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        message = one_line(err)
        key = getattr(err.__cause__, "full_key", None) or getattr(err, "full_key", None)
        if key and "not in struct" in message:
            parent, _, leaf = key.rpartition(".")
            if parent.endswith(".agent_config") and leaf in {f.name for f in fields(AgentConfig)}:
                raise ConfigError(
                    f"{key}: this task block does not list {leaf} (its default applies); add it with "
                    f"+{key}=..."
                ) from None
            raise ConfigError(
                f"{key}: unknown key{did_you_mean(key, _known_keys(config_dir, config_name))}"
            ) from None
        raise _sweep_error(message) or ConfigError(f"{key + ': ' if key else ''}{message}") from None
    if len(_composed) >= 256:
        _composed.pop(next(iter(_composed)))
    _composed[cache_key] = copy.deepcopy(composed)
    return composed


def all_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """Every key of a composed config node, sections and leaves, by its dotted path."""
    keys = []
    for key in node.keys():
        value = node._get_node(key)
        full = f"{prefix}{key}"
        keys.append(full)
        if isinstance(value, DictConfig):
            keys += all_keys(value, f"{full}.")
    return keys


def _known_keys(config_dir: Path, config_name: str) -> list[str]:
    try:
        return all_keys(compose((), config_name, config_dir))
    except ConfigError:
        return []
