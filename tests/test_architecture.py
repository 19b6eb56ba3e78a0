"""docs/ARCHITECTURE.md is what scripts/architecture.py draws from the imports, and the imports keep the
layers."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import architecture  # noqa: E402


def test_the_map_is_drawn_from_the_code():
    assert (REPO / "docs" / "ARCHITECTURE.md").read_text() == architecture.architecture_md(), (
        "docs/ARCHITECTURE.md is out of date: run `.venv/bin/python scripts/architecture.py > "
        "docs/ARCHITECTURE.md`"
    )


def test_no_import_points_against_the_layers_and_none_closes_a_cycle():
    graph = architecture.units()
    assert architecture.against_layers(graph) == []
    assert architecture.levels(graph)[1] == []


def test_imports_are_read_from_every_form_and_cycles_have_no_level(tmp_path):
    """A package of three units, written in each import form, with a cycle between two of them."""
    pkg = tmp_path / "grl"
    (pkg / "trainer").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "envs.py").write_text('"""Envs. More."""\n')
    (pkg / "trainer" / "__init__.py").write_text('"""The loop."""\nfrom grl import envs\n')
    (pkg / "trainer" / "step.py").write_text('"""A step."""\ndef f():\n    from ..agents import x\n')
    (pkg / "agents.py").write_text('"""Agents."""\nimport grl.trainer.step\nfrom grl.envs import E\n')
    graph = architecture.units(pkg)
    assert {n: sorted(u.imports) for n, u in graph.items()} == {
        "agents": ["envs", "trainer"],
        "envs": [],
        "trainer": ["agents", "envs"],
    }
    assert graph["envs"].summary == "Envs" and graph["trainer"].modules[1] == ("step.py", "A step", 3)
    level, cyclic = architecture.levels(graph)
    assert level == {"envs": 0} and cyclic == ["agents", "trainer"]
    assert "## On a cycle" in architecture.architecture_md(graph)
