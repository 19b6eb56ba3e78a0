"""OpenEnv environment packages, named as OpenEnv publishes them, resolved to the app to serve here.

OpenEnv publishes an env as a Python package (`openenv init NAME` lays one out): distribution `openenv-NAME`,
module `NAME`, an `openenv.yaml` manifest whose `app` (`server.app:app`) is its FastAPI app, and the
dependencies its server needs. `resolve(package)` takes the module name or the distribution name and gives
`NAME.server.app:app`, after checking, without importing the env, what this machine must have: the module,
its server app (an env published only as a Docker image has none), and every dependency its distribution
declares. What is missing is one line, raised when the env is built, so preflight stops the run before
Ray starts.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import importlib.util
import re

import yaml
from packaging.requirements import InvalidRequirement, Requirement

_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
DEFAULT_APP = "server.app:app"  # `openenv init`'s layout, and what OpenEnv reads when a manifest has no app


def _module_of(package: str) -> str:
    """The top-level module of an installed distribution, else OpenEnv's convention (openenv-NAME: NAME)."""
    try:
        top = (importlib.metadata.distribution(package).read_text("top_level.txt") or "").split()
    except importlib.metadata.PackageNotFoundError:
        top = []
    if top:
        return top[0]
    name = package[len("openenv-") :] if package.startswith("openenv-") else package
    return name.replace("-", "_")


def _distribution_of(module: str) -> str | None:
    names = importlib.metadata.packages_distributions().get(module, [])
    return names[0] if names else None


def _missing_requirement(distribution: str) -> str | None:
    """The first dependency of `distribution` this machine lacks (not installed, or of another version)."""
    for line in importlib.metadata.requires(distribution) or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # an optional extra, or another platform's
        try:
            version = importlib.metadata.version(requirement.name)
        except importlib.metadata.PackageNotFoundError:
            return f"{requirement} (not installed)"
        if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
            return f"{requirement} (installed: {version})"
    return None


def resolve(package: str) -> str:
    """`module.server.app:app` for an env package; ValueError, one line, naming what this machine lacks."""
    where = f"openenv (package {package!r})"
    if not isinstance(package, str) or not package:
        raise ValueError(f"openenv: package must name an installed OpenEnv env package, got {package!r}")
    module = _module_of(package)
    if not _MODULE.fullmatch(module) or importlib.util.find_spec(module.split(".")[0]) is None:
        raise ValueError(
            f"{where}: not installed here (pip install openenv-{module.replace('_', '-')}, or put it on "
            "PYTHONPATH)"
        )
    manifest = importlib.resources.files(module) / "openenv.yaml"
    app = DEFAULT_APP
    if manifest.is_file():
        spec = yaml.safe_load(manifest.read_text(encoding="utf-8")) or {}
        app = spec.get("app") or DEFAULT_APP if isinstance(spec, dict) else DEFAULT_APP
    if not isinstance(app, str) or ":" not in app:
        raise ValueError(f"{where}: openenv.yaml's app must be 'module:attribute', got {app!r}")
    app_module, attribute = app.split(":", 1)
    target = f"{module}.{app_module}"
    try:
        found = importlib.util.find_spec(target) is not None
    except ImportError:  # a parent of the app's module is missing too
        found = False
    if not found:
        raise ValueError(
            f"{where}: has no server app {target} to run here (an env published as a Docker image only)"
        )
    distribution = _distribution_of(module)
    missing = _missing_requirement(distribution) if distribution else None
    if missing:
        raise ValueError(f"{where}: its server needs {missing} on this machine")
    return f"{target}:{attribute}"
