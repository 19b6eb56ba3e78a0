"""`actor_rollout_ref` and `critic`: the models, their optimizers and the rollout engine, named as in verl."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from omegaconf import II

from grl.schema.keys import ConfigError, key, section

DTYPES = ("auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16")
# The schema is the package's floor: it imports nothing of GRL's, so the fixed names of grl.algo live here
# and grl.algo imports them (agg_loss's modes, the KL estimators). Names users register (engines, advantage
# estimators) are checked by grl.config against the live registries instead.
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_ESTIMATORS = ("kl", "abs", "mse", "low_var_kl")


@dataclass
class Model:
    path: str = key(II("model_path"), "hub id, local folder, `embedded` or `tiny`")
    dtype: str = key(
        "auto",
        "auto: bfloat16 on GPU; on CPU bfloat16 where it is native (AMX, AVX512-BF16), else float32",
        choices=DTYPES,
    )
    enable_gradient_checkpointing: bool = key(
        True, "recompute activations in the backward pass to save memory"
    )
    trust_remote_code: bool = key(
        False,
        "verl's: let transformers run the model repository's own code",
        no_effect="models load with transformers' own classes only",
    )
    lora_rank: int = key(
        0,
        "> 0 trains a LoRA adapter of this rank (peft; the policy's); the ref is the base with it off; 0: "
        "full fine-tuning",
        ge=0,
    )
    lora_alpha: float = key(16.0, "LoRA scaling = lora_alpha / lora_rank")
    target_modules: Any = key(
        "all-linear", "peft's target_modules: all-linear or a list like [q_proj, v_proj]"
    )


@dataclass
class CriticModel(Model):
    """The value model: verl's LoRA keys are accepted here too, but only the policy gets an adapter."""

    lora_rank: int = key(
        0, "verl's critic LoRA rank", ge=0, no_effect="the critic is always fully fine-tuned"
    )
    lora_alpha: float = key(
        16.0, "verl's critic LoRA scaling", no_effect="the critic is always fully fine-tuned"
    )
    target_modules: Any = key(
        "all-linear", "verl's critic LoRA targets", no_effect="the critic is always fully fine-tuned"
    )


@dataclass
class Optim:
    lr: float = key(1e-6, "learning rate", gt=0)
    lr_warmup_steps: int = key(0, "optimizer steps of linear warm-up", ge=0)
    betas: list[float] = key([0.9, 0.999], "AdamW betas")
    weight_decay: float = key(0.01, "AdamW weight decay", ge=0)


@dataclass
class FSDPConfig:
    param_offload: bool = key(False, "keep parameters in host memory between uses")
    optimizer_offload: bool = key(False, "keep optimizer state in host memory")
    mixed_precision: bool = key(True, "bf16 compute, fp32 master weights (GPU only)")


@dataclass
class RefFSDPConfig:
    param_offload: bool = key(False, "keep the reference's parameters in host memory between uses")
    optimizer_offload: bool = key(
        False,
        "the reference has no optimizer: true keeps its parameters in host memory, as param_offload does",
    )
    mixed_precision: bool = key(
        True,
        "verl's mixed precision for the reference",
        no_effect="the reference is not trained: it computes in the model's dtype",
    )


@dataclass
class Actor:
    strategy: str = key(
        "fsdp2",
        "verl's sharding strategy",
        choices=("fsdp", "fsdp2"),
        no_effect="the workers always shard with FSDP2",
    )
    ppo_mini_batch_size: int = key(II("ppo_mini_batch_size"), "episodes per optimizer step", ge=1)
    ppo_micro_batch_size_per_gpu: int = key(
        II("micro_batch_size_per_gpu"), "episodes per forward/backward on one device", ge=1
    )
    ppo_epochs: int = key(1, "passes over each batch", ge=1)
    shuffle: bool = key(
        True,
        "shuffle the episodes (with rollout.share_prompts: a prompt's episodes as one) before splitting "
        "them into mini-batches",
    )
    grad_clip: float = key(1.0, "gradient norm clip", gt=0)
    clip_ratio_low: float = key(0.2, "PPO clips the ratio to 1 - low", gt=0, lt=1)
    clip_ratio_high: float = key(0.28, "PPO clips the ratio to 1 + high", gt=0)
    clip_ratio_c: float = key(3.0, "dual-clip bound on the loss of negative advantages", gt=1)
    loss_agg_mode: str = key("token-mean", "how token losses become one loss", choices=AGG_MODES)
    entropy_coeff: float = key(0.001, "weight of the entropy bonus", ge=0)
    use_kl_loss: bool = key(False, "add a KL loss against the reference policy")
    kl_loss_coef: float = key(0.001, "weight of the KL loss", ge=0)
    kl_loss_type: str = key("low_var_kl", "KL estimator of the KL loss", choices=KL_ESTIMATORS)
    tis_imp_ratio_cap: float = key(
        -1.0,
        "truncated importance sampling (verl's TIS): C > 0 weighs each token's "
        "policy loss by min(pi_old / pi_rollout, C) against engine/trainer mismatch; -1: off",
    )
    recompute_old_log_probs: bool = key(
        True,
        "score the batch with the weights about to be trained for PPO's old "
        "log-probs; false: the engine's log-probs of the sampled tokens are the old "
        "ones (verl's rollout_correction.bypass_mode), which saves that pass and, "
        "with rollout.max_staleness > 0, clips around the policy that sampled",
    )
    logits_chunk_size: int = key(1024, "tokens per chunk when turning hidden states into log-probs", ge=1)
    optim: Optim = section(Optim)
    fsdp_config: FSDPConfig = section(FSDPConfig)

    @staticmethod
    def together(node, prefix: str, root) -> None:
        micro_within_mini(node, prefix)
        if not node.recompute_old_log_probs and node.tis_imp_ratio_cap > 0:
            raise ConfigError(
                f"{prefix}tis_imp_ratio_cap: its weight pi_old / pi_engine is 1 when the "
                "engine's log-probs are the old ones (recompute_old_log_probs=false); set it to -1"
            )


def micro_within_mini(node, prefix: str) -> None:
    """A role's forward/backward takes at most one optimizer step's episodes."""
    if node.ppo_micro_batch_size_per_gpu > node.ppo_mini_batch_size:
        raise ConfigError(
            f"{prefix}ppo_micro_batch_size_per_gpu: {node.ppo_micro_batch_size_per_gpu!r} is larger than "
            f"{prefix}ppo_mini_batch_size ({node.ppo_mini_batch_size})"
        )


@dataclass
class Ref:
    log_prob_micro_batch_size_per_gpu: int = key(
        II("micro_batch_size_per_gpu"), "episodes per reference forward on one device", ge=1
    )
    fsdp_config: RefFSDPConfig = section(RefFSDPConfig)


# vLLM's rules (SamplingParams), so that what the config accepts every engine runs.
def _temperature(default: float) -> Any:
    return key(default, "sampling temperature; 0 is greedy", ge=0)


def _top_p(default: float) -> Any:
    return key(
        default,
        "nucleus sampling mass; below 1 the trainer scores each token under the softmax over the ids kept "
        "(old log-probs, reference, update, entropy; verl scores the full softmax): docs/CONTRACTS.md",
        gt=0,
        le=1,
    )


def _top_k(default: int) -> Any:
    return key(
        default,
        "sample from the k most likely tokens, and score each under the softmax over them as top_p does; -1 "
        "or 0: off",
        ge=-1,
    )


@dataclass
class SamplingOverrides:
    do_sample: bool = key(False, "false: validation is greedy and the keys below are not read")
    temperature: float = _temperature(0.0)
    top_p: float = _top_p(1.0)
    top_k: int = _top_k(-1)


@dataclass
class RolloutEngine:
    name: str = key(
        "auto",
        "auto: vllm where it imports and works, else hf; or an engine registered in grl/engines (grl.config "
        "checks it)",
    )
    temperature: float = _temperature(1.0)
    top_p: float = _top_p(1.0)
    top_k: int = _top_k(-1)
    prompt_length: int = key(
        II("max_prompt_length"), "verl's spelling of max_prompt_length; a value set here replaces it"
    )
    response_length: int = key(
        II("max_response_length"), "verl's spelling of max_response_length; a value set here replaces it"
    )
    gpu_memory_utilization: float = key(
        II("gpu_memory_utilization"), "share of the device's memory vLLM may take", gt=0, le=1
    )
    enforce_eager: bool = key(True, "false: vLLM captures CUDA graphs for decoding")
    free_cache_engine: bool = key(
        True, "sleep the engine (weights, KV cache) from the end of the rollout to the weight sync"
    )
    tensor_model_parallel_size: int = key(1, "vLLM's tensor parallel degree", ge=1)
    max_model_len: Optional[int] = key(None, "null: prompt_length + response_length")
    kv_cache_gb: Optional[float] = key(
        None,
        "GiB of keys and values the hf engine keeps and computes with; a rollout runs the rows that fit and "
        "the rest wait (vLLM sizes its own by gpu_memory_utilization). null: half the host's free memory at "
        "the start on CPU, a quarter of the GPU's on GPU",
        gt=0,
    )
    log_prob_micro_batch_size_per_gpu: int = key(
        II("micro_batch_size_per_gpu"), "episodes per old-log-prob forward on one device", ge=1
    )
    rollout_filter_ratio: float = key(
        II("rollout.rollout_filter_ratio"),
        "GRL's spelling of rollout.rollout_filter_ratio; a value set here replaces it",
    )
    rollout_filter_type: str = key(
        II("rollout.rollout_filter_type"),
        "GRL's spelling of rollout.rollout_filter_type; a value set here replaces it",
    )
    val_kwargs: SamplingOverrides = section(SamplingOverrides)

    @staticmethod
    def together(node, prefix: str, root) -> None:
        # A colocated engine lives in one actor rank and the rollout worker of hybrid_engine=false asks
        # for one GPU: Ray shows either one GPU, and vLLM refuses a larger world only once the actor is up.
        if node.tensor_model_parallel_size != 1:
            raise ConfigError(
                f"{prefix}tensor_model_parallel_size: {node.tensor_model_parallel_size!r} needs as many GPUs "
                "per engine, but each rollout engine sees one; set it to 1"
            )


@dataclass
class ActorRolloutRef:
    hybrid_engine: bool = key(
        True,
        "verl's colocation switch: true, the rollout engine lives in the actor's "
        "ranks; false, in a rollout worker of its own (on CPU with its own share of the cores, "
        "on GPU on a GPU of its own), as rollout.max_staleness > 0 needs",
    )
    nccl_timeout: float = key(
        600, "seconds a collective may wait for its peers (torch.distributed timeout)", ge=1
    )
    model: Model = section(Model)
    actor: Actor = section(Actor)
    ref: Ref = section(Ref)
    rollout: RolloutEngine = section(RolloutEngine)


@dataclass
class Critic:
    enable: bool = key(True, "an estimator that needs a critic refuses false; the others build none")
    nccl_timeout: float = key(II("actor_rollout_ref.nccl_timeout"), "seconds a collective may wait", ge=1)
    model: CriticModel = section(CriticModel)
    ppo_mini_batch_size: int = key(II("ppo_mini_batch_size"), "episodes per optimizer step", ge=1)
    ppo_micro_batch_size_per_gpu: int = key(
        II("micro_batch_size_per_gpu"), "episodes per forward/backward on one device", ge=1
    )
    ppo_epochs: int = key(II("actor_rollout_ref.actor.ppo_epochs"), "passes over each batch", ge=1)
    shuffle: bool = key(II("actor_rollout_ref.actor.shuffle"), "as the actor's")
    cliprange_value: float = key(0.5, "the value loss clips new values to old +- this", gt=0)
    grad_clip: float = key(1.0, "gradient norm clip", gt=0)
    optim: Optim = section(Optim, lr=1e-5)
    fsdp_config: FSDPConfig = section(FSDPConfig)
