"""Import the modules of vLLM's engine that GRL's vllm rollout loads, one after another, in this interpreter.

    python engine_imports.py            # CPU rehearsal: a missing package fails; CUDA-only failures are
    listed
    python engine_imports.py --strict   # GPU: every module must import

Run in the image's packages plus the kit (the rehearsal's image-only venv, or the GPU machine with the kit on
PYTHONPATH), a `ModuleNotFoundError` naming a package outside vLLM is a wheel the kit lacks: that is how the
kit's list was found (reading the wheels' metadata missed llguidance and xgrammar, which vLLM imports while
the engine is built). On CPU, vLLM's CUDA build cannot load its extensions (no libcudart.so.13): such a
module is listed, not failed; the GPU run imports them for real. Standard library only.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# What `vllm.LLM(...)` with GRL's arguments loads on CUDA, V1 and V2 runners alike, then GRL's own modules.
MODULES = [
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.engine.arg_utils",
    "vllm.config",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.engine.core",
    "vllm.v1.engine.input_processor",
    "vllm.v1.engine.output_processor",
    "vllm.v1.executor.uniproc_executor",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.v1.worker.gpu.model_runner",
    "vllm.v1.worker.gpu.sample.sampler",
    "vllm.v1.sample.sampler",
    "vllm.v1.sample.logits_processor",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.structured_output",
    "vllm.v1.structured_output.backend_xgrammar",
    "vllm.v1.structured_output.backend_guidance",
    "vllm.v1.attention.backends.flash_attn",
    "vllm.v1.attention.backends.triton_attn",
    "vllm.model_executor.models.llama",
    "vllm.model_executor.model_loader",
    "vllm.distributed.parallel_state",
    "vllm.device_allocator.cumem",
    "vllm.tokenizers",
    "grl.engines.vllm_engine",
    "grl.engines.vllm_grammar",
]
OWN = ("vllm", "grl", "torch")  # a module of these missing is a build or CUDA problem, not a missing wheel


def probe(modules: list[str] = MODULES) -> tuple[dict[str, str], dict[str, str]]:
    """(missing package -> the module that asked for it, module -> its failure's line for other failures)."""
    missing, failed = {}, {}
    for module in modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            top = (err.name or "").split(".")[0]
            if top and top not in OWN:
                missing.setdefault(top, module)
            else:
                failed[module] = f"{type(err).__name__}: {err}"
        except Exception as err:  # noqa: BLE001 - CUDA libraries absent on CPU, a platform check: listed, judged by --strict
            failed[module] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return missing, failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="engine_imports.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--strict", action="store_true", help="every module must import (the GPU machine)")
    args = parser.parse_args(argv)
    missing, failed = probe()
    for package, module in sorted(missing.items()):
        print(f"engine_imports: missing package {package} (imported by {module}): carry its wheel (kit.txt)")
    for module, line in failed.items():
        print(f"engine_imports: {module}: {line}")
    ok = len(MODULES) - len(failed) - len(set(missing.values()))
    print(
        f"engine_imports: {ok} of {len(MODULES)} modules imported, {len(missing)} packages missing, "
        f"{len(failed)} other failures"
    )
    return 1 if missing or (args.strict and failed) else 0


if __name__ == "__main__":
    sys.exit(main())
