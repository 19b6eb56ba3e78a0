"""The policy's rank: the trained model, its frozen copy (the reference: the policy without
updates) and, where the group places it, the rollout engine; and the policy's loss."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from grl.engines.weights import SyncCheck, check_sync, digesting
from grl.run_plan import RunPlan
from grl.schema import Trainer
from grl.workers import lora, sharded, streaming
from grl.workers.heads import POLICY
from grl.workers.update import seg_of
from grl.workers.worker import Worker, hf_names


class PolicyObjective:
    """The policy's loss: clipped PPO (with truncated importance weights when asked), minus the entropy
    bonus, plus the KL loss to the reference. Its inputs are advantages and the behaviour log-probs."""

    prefix = "actor"

    def __init__(self, train_cfg):
        self.section = train_cfg  # the actor section, read at each call
        # (engine, trainer) log-probs of the sampled tokens of an update without old log-probs, per
        # micro-batch
        self.sampled_log_probs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def agg_mode(self) -> str:
        return self.section.loss_agg_mode

    def uses_kl_loss(self, part: dict) -> bool:
        return self.section.use_kl_loss and "ref_log_probs" in part

    def loss(self, out, t: dict, mode: str) -> tuple[torch.Tensor, dict[str, float]]:
        from grl.algo import entropy_bonus, kl_loss, policy_loss, truncated_is_weights

        c = self.section
        log_probs, entropy = out
        # Without old log-probs the update is on-policy (one mini-batch, one epoch: the trainer skips
        # their pass), so the current ones are the behaviour policy's.
        old = t["old_log_probs"] if "old_log_probs" in t else log_probs.detach()
        seg, cap = seg_of(t), c.tis_imp_ratio_cap
        tis = truncated_is_weights(old, t["rollout_log_probs"], cap) if cap > 0 else None
        pg, m = policy_loss(
            log_probs,
            old,
            t["advantages"],
            t["loss_mask"],
            clip_ratio_low=c.clip_ratio_low,
            clip_ratio_high=c.clip_ratio_high,
            clip_ratio_c=c.clip_ratio_c,
            loss_agg_mode=mode,
            segment_ids=seg,
            is_weights=tis,
        )
        coeff = c.entropy_coeff
        ent = entropy_bonus(entropy if coeff else entropy.detach(), t["loss_mask"], mode, seg)
        loss = pg - coeff * ent
        stats = {
            "pg_loss": pg.detach().item(),
            "entropy": ent.detach().item(),
            "pg_clipfrac": float(m["pg_clipfrac"]),
            "pg_clipfrac_lower": float(m["pg_clipfrac_lower"]),
            "ppo_kl": float(m["ppo_kl"]),
        }
        if "old_log_probs" not in t:  # the engine against the trainer, which the skipped pass would report
            sampled = t["loss_mask"] > 0
            self.sampled_log_probs.append(
                (t["rollout_log_probs"][sampled].detach().cpu(), old[sampled].cpu())
            )
        if self.uses_kl_loss(t):
            kl = kl_loss(
                log_probs,
                t["ref_log_probs"],
                t["loss_mask"],
                kind=c.kl_loss_type,
                loss_agg_mode=mode,
                segment_ids=seg,
            )
            loss = loss + c.kl_loss_coef * kl
            stats["kl_loss"] = kl.detach().item()
        return loss, stats


class PolicyWorker(Worker):
    role, head = "actor", POLICY

    def __init__(
        self,
        rank: int,
        plan: RunPlan,
        section,
        trainer: Trainer,
        engine_name: str | None = None,
        engine_in_setup: bool = True,
        teacher_path: str | None = None,
    ):
        """`engine_name`: this rank holds the rollout engine; `engine_in_setup`: it is built once the models
        are, in `setup`, else when the driver calls `build_engine` (grl.workers.start_groups);
        `teacher_path`: a frozen teacher to load beside the reference (on-policy distillation)."""
        super().__init__(rank, plan, section, trainer, section.actor.logits_chunk_size)
        self.use_ref, self.engine_name, self.engine_in_setup = (
            plan.use_reference,
            engine_name,
            engine_in_setup,
        )
        self.teacher_path = teacher_path
        self.ref = self.teacher = None
        self.engine = None

    def build(self) -> None:
        section = self.section
        self.model_cfg, self.train_cfg = section.model, section.actor
        self.module = self._build(section.model, section.actor.fsdp_config, trainable=True)
        if self.plan.reference_model:
            self.ref = self._build(section.model, section.ref.fsdp_config, trainable=False)
        elif self.use_ref:  # the plan's LoRA reference: the trained model with its adapter off
            self.ref = lora.AdapterOff(self.module, self.peft_model)
        if self.teacher_path is not None:  # frozen, in the student's dtype, sharded and offloaded as the ref
            from grl.models import fetch_model

            fetch_model(self.teacher_path)
            teacher_model = replace(section.model, path=self.teacher_path, lora_rank=0)
            self.teacher = self._build(teacher_model, section.ref.fsdp_config, trainable=False)
        if self.engine_name is not None and self.engine_in_setup:
            self.build_engine()
        self.objective = PolicyObjective(self.train_cfg)

    def build_engine(self) -> None:
        from grl.workers.rollout_worker import build_engine

        self.startup["engine_start"] = time.time()
        self.engine = build_engine(self.section, self.plan, self.engine_name, self.seed + self.rank)
        self.startup["engine_ready"] = time.time()

    def update(self, minibatches: list[dict]) -> dict[str, float]:
        """The update (grl/workers/update.py). Without old log-probs (an on-policy update: the trainer skipped
        their pass, on every rank) also the engine/trainer mismatch that pass would report, over the
        sampled tokens of all ranks: its percentile needs every token, not per-micro-batch summaries."""
        self.objective.sampled_log_probs = []
        metrics = super().update(minibatches)
        if minibatches and "old_log_probs" not in minibatches[0]:
            from grl.algo.mismatch import mismatch_stats

            every_rank: list = [None] * self.world_size
            dist.all_gather_object(every_rank, self.objective.sampled_log_probs)
            pairs = [pair for rank in every_rank for pair in rank]
            engine, trainer = (torch.cat([pair[i] for pair in pairs]) for i in (0, 1))
            metrics.update({f"actor/{k}": v for k, v in mismatch_stats(engine, trainer).items()})
        return metrics

    def compute_log_probs(self, tensors: dict, model: str = "policy") -> tuple[torch.Tensor, torch.Tensor]:
        """(log_probs, entropy) of this rank's shard under `model`: the policy, the ref or the teacher (the
        frozen ones in the reference's micro-batches)."""
        scorer = {"policy": self.module, "ref": self.ref, "teacher": self.teacher}[model]
        if scorer is None:
            raise RuntimeError(f"this actor group was built without a {model} model")
        section = self.section
        size = (
            section.rollout.log_prob_micro_batch_size_per_gpu
            if model == "policy"
            else section.ref.log_prob_micro_batch_size_per_gpu
        )
        parts = [
            self._score(scorer, self._to_device(m), grad=False) for m in self._micro_batches(tensors, size)
        ]
        scorer.reshard()
        return torch.cat([p[0] for p in parts]).cpu(), torch.cat([p[1] for p in parts]).cpu()

    # ------------------------------------------------------------ the policy's weights, whole

    def _lora_scaling(self) -> float:
        return self.model_cfg.lora_alpha / self.model_cfg.lora_rank

    def _policy_tensors(self, state: dict, dtype: torch.dtype):
        """Plain Hugging Face names and full tensors in `dtype` (LoRA merged in), gathered one at a time."""
        return streaming.policy_tensors(
            state,
            dtype,
            None if self.peft_model is None else self._lora_scaling(),
            tied_lm_head=getattr(self.module.model.config, "tie_word_embeddings", False),
        )

    def export_hf(self, path: str) -> None:
        """The policy as a Hugging Face folder (config, safetensors, tokenizer); in a
        LoRA run the merged model, and the adapter alone in `adapter/` beside it.
        Collective: each weight is gathered in turn and rank 0 writes it."""
        from transformers import AutoConfig, GenerationConfig

        from grl.compute import torch_dtype

        from grl.models import load_tokenizer, resolve_model_path

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

    # ------------------------------------------------------------ engine

    def sync_weights(self) -> SyncCheck | None:
        """Full weights -> this rank's engine, in place, one tensor at a time in the engine's
        dtype. Collective: every rank runs every gather; ranks without an engine drop them. A rank
        with an engine returns what the engine holds checked against what it was sent."""
        from grl.compute import torch_dtype

        stream = self._policy_tensors(
            hf_names(self.module.state_dict()), torch_dtype(self.model_cfg.dtype, self.device)
        )
        sent: dict = {}
        if self.engine is not None:
            stream = digesting(stream, sent)
        try:
            if self.engine is not None:
                self.engine.update_weights(stream)
        finally:
            stream.drain()  # after an engine error too: the other ranks wait in these gathers
        return None if self.engine is None else check_sync(sent, self.engine.weights_digest())

    def engine_weights(self) -> tuple:
        """Collective: the full weights in the engine's dtype, on the host, put in Ray's object store by
        rank 0 for a rollout worker of its own (grl/workers/rollout_worker.py), with the digest of each
        as it left the trainer. Rank 0 returns ((handle, digests),), the others (None,): the handle
        travels inside a tuple so the driver never fetches the weights themselves."""
        import ray

        sent: dict = {}
        items = self.host_weights(sent)
        return (None,) if items is None else ((ray.put(items), sent),)

    def host_weights(self, digests: dict | None = None) -> list | None:
        """Collective: rank 0 gets the full weights in the engine's dtype as host tensors, the other
        ranks None. Every rank joins each gather, but only rank 0 sends the weights on, so the others
        drop each tensor as it comes (at 7B, 15 GB of host memory per rank that nobody reads).
        `digests`: filled on rank 0 with each tensor's digest, taken on the device."""
        from grl.compute import torch_dtype

        stream = self._policy_tensors(
            hf_names(self.module.state_dict()), torch_dtype(self.model_cfg.dtype, self.device)
        )
        if self.rank != 0:
            stream.drain()
            return None
        return [
            (name, tensor.cpu())
            for name, tensor in (stream if digests is None else digesting(stream, digests))
        ]

    def engine_generate(self, prompts: list[list[int]], sampling, constraints=None) -> list:
        return self.engine.generate(prompts, sampling, constraints)

    def engine_update_weights(self, named_tensors) -> None:
        self.engine.update_weights(named_tensors)

    def engine_call(self, method: str, *args):
        if self.engine is None:
            return None
        answer = getattr(self.engine, method)(*args)
        if method == "shutdown":
            self.engine = None
        return answer

    def teardown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        super().teardown()
