"""Model shapes for planning: layer counts and widths from a model's config.json, or from a table of
the presets' models when the model is not on disk; the parameter and FLOP counts that follow from them.
Pure arithmetic: no torch."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class PlanError(ValueError):
    """The planner cannot size this config (unknown model, missing hardware size)."""


def _qwen2(layers, hidden, intermediate, heads, kv_heads, vocab=151936, tied=True) -> dict:
    """A Qwen2.5 decoder's config.json numbers (its q, k and v projections have biases)."""
    shape = dict(layers=layers, hidden=hidden, intermediate=intermediate, heads=heads, kv_heads=kv_heads)
    return {**shape, "vocab": vocab, "tied": tied, "qkv_bias": True}


# Models the presets name, for planning on a machine that has not downloaded them (their config.json).
KNOWN_MODELS = {
    "Qwen2.5-0.5B-Instruct": _qwen2(24, 896, 4864, 14, 2),
    "Qwen2.5-3B-Instruct": _qwen2(36, 2048, 11008, 16, 2),
    "Qwen2.5-7B-Instruct": _qwen2(28, 3584, 18944, 28, 4, vocab=152064, tied=False),
}


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    qkv_bias: bool = False
    head_dim: int = 0  # 0: hidden // heads

    @property
    def q(self) -> int:
        return self.heads * (self.head_dim or self.hidden // self.heads)

    @property
    def kv(self) -> int:
        return self.kv_heads * (self.head_dim or self.hidden // self.heads)

    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.q, self.kv
        return h * (q + 2 * kv) + q * h + 3 * h * self.intermediate + 2 * h + (q + 2 * kv) * self.qkv_bias

    @property
    def embedding(self) -> int:
        return self.vocab * self.hidden

    @property
    def largest_param(self) -> int:
        """The biggest single weight: the embedding, or a layer's MLP or attention matrix."""
        return max(self.embedding, self.hidden * self.intermediate, self.hidden * self.q)

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.embedding * (1 if self.tied else 2) + self.hidden

    def root_params(self, value_head: bool = False) -> int:
        """What FSDP2's root group holds, all but the decoder layers: embedding, final norm, head."""
        return (self.value_params if value_head else self.params) - self.layers * self.layer_params

    def lora_params(self, rank: int) -> int:
        """Adapter weights of rank `rank` on every linear layer (peft's all-linear): rank x (in + out)
        each."""
        h, q, kv, i = self.hidden, self.q, self.kv, self.intermediate
        return self.layers * rank * ((h + q) * 2 + (h + kv) * 2 + (h + i) * 3)

    @property
    def value_params(self) -> int:
        """The critic: the backbone and a one-wide score head (with its bias) instead of the vocabulary
        head."""
        return self.layers * self.layer_params + self.embedding + 2 * self.hidden + 1


def shape_from_config(config: dict) -> ModelShape:
    config = config.get("text_config", config)
    return ModelShape(
        layers=config["num_hidden_layers"],
        hidden=config["hidden_size"],
        intermediate=config["intermediate_size"],
        heads=config["num_attention_heads"],
        kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
        vocab=config["vocab_size"],
        tied=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=bool(config.get("attention_bias", config.get("model_type") == "qwen2")),
        head_dim=config.get("head_dim") or 0,
    )


def model_shape(name: str, key: str = "actor_rollout_ref.model.path") -> ModelShape:
    """From the model's config.json (a folder, `embedded`, `tiny`, or the Hugging Face cache), else
    from KNOWN_MODELS by the hub id's last part; `key` names the model in errors."""
    from grl.models import ModelLoadError, resolve_model_path

    try:
        resolved = Path(resolve_model_path(name))
    except ModelLoadError as err:
        raise PlanError(f"{key}: {err}") from None
    config_file = resolved / "config.json" if resolved.is_dir() else _cached_config(name)
    if config_file is not None:
        return shape_from_config(json.loads(Path(config_file).read_text()))
    known = KNOWN_MODELS.get(str(name).rstrip("/").split("/")[-1])
    if known is None:
        raise PlanError(
            f"{key}: no config.json for {name!r} here and it is not one of "
            f"{', '.join(KNOWN_MODELS)}; download it or give a local folder"
        )
    return ModelShape(**known)


def _cached_config(name: str) -> str | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(name, "config.json")
    return found if isinstance(found, str) else None


# ---------------------------------------------------------------- FLOPs (verl's FlopsCounter for dense
# decoders)

# Dense bf16 tensor-core peaks (no sparsity), matched by substring of the CUDA device name.
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "H800": 989e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40": 181.05e12,
}


def peak_flops(device_name: str) -> float:
    """The device's bf16 peak in FLOP/s; 0 for a CPU or an unknown device (no MFU is reported)."""
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in device_name), 0.0)


def train_flops(
    shape: ModelShape, tokens: int, attention_pairs: int, head_tokens: int | None = None
) -> float:
    """FLOPs of one forward and backward: 6 per weight per token through the decoder layers (attention
    and MLP matmuls), 6 per head weight per token the head scores, plus attention's score and value
    products, 12 x q x L per attended pair of positions (n^2 for a sequence of n). `head_tokens=None`
    counts as verl does: every token through the head and again through the embedding."""
    h = shape.hidden
    layers = shape.layers * (3 * h * shape.intermediate + h * (2 * shape.q + 2 * shape.kv))
    head = 2 * shape.embedding * tokens if head_tokens is None else shape.embedding * head_tokens
    return 6 * (layers * tokens + head) + 12 * attention_pairs * shape.q * shape.layers
