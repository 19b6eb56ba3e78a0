"""Environment registry: `make(name, **env_config)` builds an env by name.

Envs are registered by module path so that importing `grl.envs` imports no
env module (and none of their optional dependencies). An env whose module
fails to import is reported as unavailable with the reason; it never breaks
the package.
"""

from __future__ import annotations

import importlib
import inspect

from grl.envs.base import Env, InfraFault, PolicyFault, step_info

_REGISTRY: dict[str, str] = {
    "sokoban": "grl.envs.sokoban:SokobanEnv",
    "tetris": "grl.envs.tetris:TetrisEnv",
    "blocksworld": "grl.envs.blocksworld:BlocksWorldEnv",
    "gsm8k": "grl.envs.gsm8k:GSM8KEnv",
    "math": "grl.envs.math:MathEnv",
    "webshop": "grl.envs.webshop:WebShopEnv",
    "bird": "grl.envs.bird:BirdEnv",
    "textworld": "grl.envs.textworld:TextWorldEnv",
    "guess_number": "grl.envs.guess_number:GuessNumberEnv",  # the example of docs/TUTORIAL.md
    "gem": "grl.envs.gem:GemEnv",  # GEM's games and reasoning-gym tasks (gem-llm)
    "openenv": "grl.envs.openenv.env:OpenEnvEnv",  # OpenEnv environments over their client (openenv-core)
}


class EnvUnavailable(RuntimeError):
    """An env is registered but cannot be built here (missing dependency)."""


def register(name: str, target: str | type[Env]) -> None:
    """Register an env class, or a "module:Class" path imported on first use."""
    if not isinstance(target, str):
        target = f"{target.__module__}:{target.__qualname__}"
    _REGISTRY[name] = target


def names() -> list[str]:
    return sorted(_REGISTRY)


def env_class(name: str) -> type[Env]:
    """The class of a registered env, or of a "package.module:Class" path."""
    if name not in _REGISTRY and ":" not in name:
        raise KeyError(
            f"unknown env {name!r}; registered: {', '.join(names())} (or give a module:Class path)"
        )
    module_name, class_name = _REGISTRY.get(name, name).split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise EnvUnavailable(f"env {name!r} is unavailable: {err}") from err
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise KeyError(f"env {name!r}: {module_name} has no Env subclass named {class_name}")
    cls.name = name
    return cls


def available() -> dict[str, str | None]:
    """Each registered env mapped to None if it imports, else the reason."""
    status: dict[str, str | None] = {}
    for name in names():
        try:
            env_class(name)
            status[name] = None
        except EnvUnavailable as err:
            status[name] = str(err)
    return status


def config_keys(name: str) -> set[str] | None:
    """The keyword arguments an env accepts, or None if it takes **kwargs."""
    params = inspect.signature(env_class(name).__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return {p for p in params if p != "self"}


def make(name: str, **env_config) -> Env:
    return env_class(name)(**env_config)


__all__ = [
    "Env",
    "EnvUnavailable",
    "InfraFault",
    "PolicyFault",
    "available",
    "config_keys",
    "env_class",
    "make",
    "names",
    "register",
    "step_info",
]
