"""LoRA on the policy through `peft`: the adapter the trainer learns, the merged
weights the engine and the exported model get, and the adapter-only checkpoint.

State dicts here use Hugging Face names of the adapted model, where peft has
replaced each target `Linear` `x.proj` by `x.proj.base_layer` (the frozen
weight) plus `x.proj.lora_A.default` / `x.proj.lora_B.default`.
"""

from __future__ import annotations

from pathlib import Path

import torch

ADAPTER = "default"  # peft's name for the one adapter
BASE = ".base_layer."
PEFT_PREFIX = "base_model.model."  # where the adapted model sits inside a PeftModel


def lora_config(model_cfg):
    from peft import LoraConfig

    rank, alpha = model_cfg.lora_rank, model_cfg.lora_alpha
    targets = model_cfg.target_modules
    targets = targets if isinstance(targets, str) else [str(t) for t in targets]
    # Dropout off: PPO compares log-probs of one policy across forwards, noise would bias the ratio.
    return LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none")


def add_adapter(model: torch.nn.Module, model_cfg):
    """-> the PeftModel; its `.base_model.model` is `model` with LoRA layers in place
    and every weight but the adapter's frozen."""
    from peft import get_peft_model

    return get_peft_model(model, lora_config(model_cfg))


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def adapter_state(state: dict) -> dict:
    """The adapter's tensors only: what a LoRA checkpoint holds."""
    return {k: v for k, v in state.items() if is_adapter(k)}


def merged_weight(
    weight: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float
) -> torch.Tensor:
    """One adapted Linear's plain weight: W' = W + scaling * B @ A (in fp32, back to W's dtype)."""
    return (weight.float() + scaling * (lora_b.float() @ lora_a.float())).to(weight.dtype)


def adapter_names(layer: str) -> tuple[str, str]:
    """The names of the A and B matrices of the adapted Linear `layer`."""
    return f"{layer}.lora_A.{ADAPTER}.weight", f"{layer}.lora_B.{ADAPTER}.weight"


def plain_name(name: str) -> str:
    """`x.proj.base_layer.weight` -> `x.proj.weight`; other names unchanged."""
    return name.replace(BASE, ".")


def merged_weights(state: dict, scaling: float) -> dict:
    """Plain Hugging Face weights of the adapted model: W' = W + scaling * B @ A on
    every adapted Linear, adapter tensors dropped, other names unchanged."""
    out = {}
    for name, value in state.items():
        if is_adapter(name):
            continue
        if name.endswith(BASE + "weight"):
            a, b = adapter_names(name.split(BASE)[0])
            value = merged_weight(value, state[a], state[b], scaling)
        out[plain_name(name)] = value
    return out


def save_adapter(state: dict, config, folder: Path) -> None:
    """The adapter as peft writes it (adapter_config.json + adapter_model.safetensors),
    so `PeftModel.from_pretrained(base, folder)` loads it."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(folder))
    weights = {
        PEFT_PREFIX + k.replace(f".{ADAPTER}.", "."): v.contiguous() for k, v in adapter_state(state).items()
    }
    save_file(weights, str(folder / "adapter_model.safetensors"))


class AdapterOff:
    """The reference policy of a LoRA run: the trained module scored with its adapter
    disabled, so the base model is not held twice."""

    def __init__(self, module: torch.nn.Module, peft_model):
        self.module, self.peft_model = module, peft_model

    def __call__(self, *args, **kwargs):
        with self.peft_model.disable_adapter():
            return self.module(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self.module, name)
