"""docs/ARCHITECTURE.md, drawn from grl's imports: `python scripts/architecture.py > docs/ARCHITECTURE.md`.

A unit is a top-level package or module of grl (grl/trainer/, grl/config.py); an edge is one unit importing
another anywhere in its files (a lazy import inside a function counts: it is still a dependency). A unit's
level is 0 when it imports no other unit, else one more than the highest level it imports, so every arrow
points down the page; a cycle has no level and is listed instead. tests/test_architecture.py keeps the file
equal to what this prints.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "grl"
# The layers of docs/SYSTEMDESIGN.md, lowest first: a layer may import those before it, never one after.
LAYERS = ("envs", "agents", "rollout", "algo", "workers", "trainer")


@dataclass
class Unit:
    name: str
    summary: str
    lines: int = 0
    modules: list[tuple[str, str, int]] = field(default_factory=list)  # (file, first docstring line, lines)
    imports: set[str] = field(default_factory=set)


def first_line(tree: ast.Module) -> str:
    doc = ast.get_docstring(tree) or ""
    return doc.strip().split("\n\n")[0].replace("\n", " ").split(". ")[0].rstrip(".")


def imported_units(tree: ast.Module, module: str) -> set[str]:
    """The grl units `tree` (the module `module`, dotted) imports, relative imports resolved."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: -node.level]
                base = ".".join([*parent, base] if base else parent)
            names = [base] + [f"{base}.{alias.name}" for alias in node.names] if base == "grl" else [base]
        else:
            continue
        found |= {name.split(".")[1] for name in names if name.startswith("grl.")}
    return found


def units(package: Path = PACKAGE) -> dict[str, Unit]:
    out: dict[str, Unit] = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        name = rel.parts[0].removesuffix(".py")
        if name == "__init__":
            continue
        tree = ast.parse(path.read_text())
        dotted = ".".join(["grl", *rel.with_suffix("").parts]).removesuffix(".__init__")
        lines = len(path.read_text().splitlines())
        unit = out.setdefault(name, Unit(name, ""))
        unit.lines += lines
        if len(rel.parts) == 1 or rel.parts[1:] == ("__init__.py",):
            unit.summary = first_line(tree)
        if len(rel.parts) > 1:
            unit.modules.append(("/".join(rel.parts[1:]), first_line(tree), lines))
        unit.imports |= imported_units(tree, dotted) - {name}
    return out


def levels(graph: dict[str, Unit]) -> tuple[dict[str, int], list[str]]:
    """Each unit's level, and the units on or behind a cycle (which have none)."""
    level: dict[str, int] = {}
    left = dict(graph)
    while True:
        ready = [n for n, u in left.items() if all(i in level for i in u.imports if i in graph)]
        if not ready:
            return level, sorted(left)
        for n in ready:
            level[n] = 1 + max((level[i] for i in graph[n].imports if i in graph), default=-1)
            del left[n]


def against_layers(graph: dict[str, Unit]) -> list[tuple[str, str]]:
    """Imports from a layer of LAYERS to a later one."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    return sorted(
        (a, b) for a, u in graph.items() for b in u.imports if a in rank and b in rank and rank[a] < rank[b]
    )


def figures(graph: dict[str, Unit]) -> dict[str, int]:
    level, cyclic = levels(graph)
    edges = [(a, b) for a, u in graph.items() for b in u.imports if b in graph]
    return {
        "units": len(graph),
        "levels": 1 + max(level.values(), default=-1),
        "edges": len(edges),
        "edges against the layers": len(against_layers(graph)),
        "units on a cycle": len(cyclic),
    }


def architecture_md(graph: dict[str, Unit] | None = None) -> str:
    graph = units() if graph is None else graph
    level, cyclic = levels(graph)
    head = ", ".join(f"{v} {k}" for k, v in figures(graph).items())
    out = [
        "# Architecture",
        "",
        "Drawn from the code by `python scripts/architecture.py > docs/ARCHITECTURE.md` "
        "(tests/test_architecture.py",
        "keeps it so). Each unit is a top-level package or module of grl/; it imports only units on lower "
        "levels,",
        "so the page reads from what a run is built of (bottom) to what starts it (top). The data's path "
        "through",
        "a step is another order: docs/CONTRACTS.md.",
        "",
        f"Figures: {head}.",
        "",
    ]
    for lv in sorted(set(level.values()), reverse=True):
        out += [f"## Level {lv}", ""]
        for name in sorted(n for n in level if level[n] == lv):
            unit = graph[name]
            uses = ", ".join(sorted(i for i in unit.imports if i in graph)) or "nothing of grl"
            kind = f"grl/{name}/" if unit.modules else f"grl/{name}.py"
            out.append(
                f"- **{kind}** ({unit.lines} lines): {unit.summary or '(no docstring)'}. Imports {uses}."
            )
            for file, summary, lines in unit.modules:
                out.append(f"  - `{file}` ({lines}): {summary or '(no docstring)'}")
        out.append("")
    if cyclic:
        out += [
            "## On a cycle",
            "",
            *[f"- grl/{n}: imports {', '.join(sorted(graph[n].imports))}" for n in cyclic],
            "",
        ]
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(architecture_md())
