"""One schema (issue 26): every key is declared once, in grl/schema/, and everything else is read from it:
the YAML holds no key the schema does not know, docs/CONFIG.md is the schema's table, and no consumer
checks again the ranges and choices the schema declares."""

import ast
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import MISSING

from grl.schema import AgentConfig, GRLConfig, leaves
from grl.schema.doc import config_md

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
RUN_KEYS = {leaf.path for leaf in leaves(GRLConfig)}
AGENT_KEYS = {leaf.path for leaf in leaves(AgentConfig)}


def yaml_leaves(block: dict, prefix: str = "") -> list[str]:
    out = []
    for name, value in block.items():
        if isinstance(value, dict) and value:
            out += yaml_leaves(value, f"{prefix}{name}.")
        else:
            out.append(f"{prefix}{name}")
    return out


def task_block_problems(name: str, block: dict) -> list[str]:
    problems = [f"{name}.{k}" for k in block if k not in ("agent_type", "agent_config", "env_config")]
    return problems + [
        f"{name}.agent_config.{k}" for k in block.get("agent_config") or {} if k not in AGENT_KEYS
    ]


def test_every_schema_leaf_has_a_default_and_help():
    for cls in (GRLConfig, AgentConfig):
        for leaf in leaves(cls):
            assert leaf.default is not MISSING, f"{leaf.path}: no default"
            assert leaf.help, f"{leaf.path}: no help"


def test_base_yaml_holds_no_values():
    assert set(yaml.safe_load((CONFIGS / "base.yaml").read_text())) == {"defaults"}


@pytest.mark.parametrize("path", sorted((CONFIGS / "preset").glob("*.yaml")), ids=lambda p: p.stem)
def test_preset_keys_are_schema_keys(path):
    tasks = yaml.safe_load((CONFIGS / "agents.yaml").read_text())
    unknown = []
    for name, value in yaml.safe_load(path.read_text()).items():
        if name == "defaults":  # Hydra's: the presets this one builds on
            unknown += [d for d in value if d != "_self_" and not (CONFIGS / "preset" / f"{d}.yaml").exists()]
        elif name in tasks:
            unknown += task_block_problems(name, value)
        else:
            unknown += [k for k in yaml_leaves({name: value}) if k not in RUN_KEYS]
    assert unknown == []


def test_task_instances_use_schema_keys_only():
    unknown = []
    for name, block in yaml.safe_load((CONFIGS / "agents.yaml").read_text()).items():
        assert name not in {k.split(".")[0] for k in RUN_KEYS}, (
            f"{name}: a task instance named like a run key"
        )
        unknown += task_block_problems(name, block)
    assert unknown == []


def test_docs_key_table_is_the_schemas():
    assert (REPO / "docs" / "CONFIG.md").read_text() == config_md(), (
        "docs/CONFIG.md is out of date: run `.venv/bin/python -m grl.schema > docs/CONFIG.md`"
    )


def test_help_lists_every_key():
    from grl.schema.doc import help_text

    text = help_text()
    assert all(f"  {key}: " in text for key in RUN_KEYS)


# ---------------------------------------------------------------- no consumer re-checks

RANGE_WORDS = re.compile(
    r"must be|:\s+is not one of|choose one of|is not in [(\[]"
)  # ": {value!r} is not one of"
CHECKERS = {"grl/config.py", "grl/preflight.py"}  # and grl/schema/: where the declarations are read


def raise_texts(path: Path):
    """(line, the string parts of the raised message joined) for each raise in a file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            yield (
                node.lineno,
                "".join(
                    c.value
                    for c in ast.walk(node.exc)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                ),
            )


def rechecks(path: Path) -> list[str]:
    """Raises that judge a schema key's value: the message names the key (whole, as `.leaf:` after a
    placeholder, or as `leaf must be`) and speaks of a range or a choice."""
    leaves_named = {key.rsplit(".", 1)[-1] for key in RUN_KEYS | AGENT_KEYS}
    found = []
    for line, text in raise_texts(path):
        if not RANGE_WORDS.search(text):
            continue
        if any(key in text for key in RUN_KEYS if "." in key) or any(
            f".{leaf}:" in text or re.search(rf"\b{leaf} must be", text) for leaf in leaves_named
        ):
            found.append(f"{path.name}:{line}: {text[:80]}")
    return found


def test_no_consumer_rechecks_a_schema_key():
    sources = [
        p
        for p in (REPO / "grl").rglob("*.py")
        if "schema" not in p.relative_to(REPO).parts and str(p.relative_to(REPO)) not in CHECKERS
    ]
    assert [hit for p in sources for hit in rechecks(p)] == []


def test_the_scan_finds_a_recheck(tmp_path):
    """The scan above is not vacuous: the checks consumers used to make are caught."""
    old = tmp_path / "old.py"
    old.write_text(
        'def f(t):\n    raise ValueError(f"{path}.top_k: must be -1 (off) or >= 0, got {t}")\n'
        'def g(k):\n    raise ValueError(f"rollout.rollout_filter_type: {k!r} is not one of std, std_rev")\n'
    )
    assert len(rechecks(old)) == 2


def test_consumers_take_checked_values_without_judging_them():
    """Values the schema refuses pass straight through the consumers: the schema is the one check."""
    import torch

    from omegaconf import OmegaConf

    from grl.algo import AdaptiveKLController, policy_loss
    from grl.engines import sampling_from_config
    from grl.rollout.shaping import filter_groups

    block = OmegaConf.create(
        {"temperature": -1.0, "top_p": 0.0, "top_k": -5, "val_kwargs": {"do_sample": False}}
    )
    assert sampling_from_config(block, validate=False, max_new_tokens=4).top_k == -5
    ones = torch.ones(1, 2)
    policy_loss(ones, ones, ones, ones, clip_ratio_c=0.5)
    AdaptiveKLController(0.1, target_kl=0.0, horizon=0)
    assert filter_groups([], ratio=2.0, kind="std")[0] == []


def test_the_schema_is_the_floor_and_its_literal_choices_match_the_registries():
    """grl.schema imports nothing of GRL's (no cycle can run through it), so the names the other layers
    define are written there as literals: each must be exactly its registry (users' engines and advantage
    estimators are checked against the live registries by grl.config)."""
    import subprocess
    import sys

    import grl.agents.controls
    import grl.algo.kl
    import grl.algo.losses
    import grl.tools
    from grl.schema import run, tasks, workers

    code = (
        "import sys, grl.schema; print(sorted(m for m in sys.modules if m.startswith('grl.') and not "
        "m.startswith('grl.schema')))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    assert run.VALIDATION_CONTROLS == tuple(grl.agents.controls.VALIDATION_CONTROLS)
    assert tasks.TOOL_NAMES == tuple(grl.tools.tool_names())
    # Defined once, in the schema, which grl.algo reads: the same objects, not equal copies.
    assert (
        workers.KL_ESTIMATORS is grl.algo.kl.KL_ESTIMATORS and workers.AGG_MODES is grl.algo.losses.AGG_MODES
    )


def test_an_unregistered_advantage_estimator_is_one_line_before_anything_runs():
    from grl.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"^algorithm.adv_estimator: 'ppo2' is not one of gae, .*grpo"):
        load_config(["algorithm.adv_estimator=ppo2"])
