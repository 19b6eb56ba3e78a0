"""The update side of a worker rank: mini-batches of micro-batches, the PPO and value losses, the
optimizer step, and the helpers that split and weigh them."""

from __future__ import annotations

import logging
import math
import resource

import torch

from grl.workers import fsdp

log = logging.getLogger("grl.workers")


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


class PolicyObjective:
    """The policy's loss: clipped PPO (with truncated importance weights when asked), minus the entropy
    bonus, plus the KL loss to the reference. Its inputs are advantages and the behaviour log-probs."""

    prefix = "actor"
    scored_name = "log-prob ratio"

    def __init__(self, train_cfg):
        self.cfg = train_cfg  # the actor section, read at each call

    def agg_mode(self) -> str:
        return self.cfg.loss_agg_mode

    def uses_kl_loss(self, part: dict) -> bool:
        return bool(self.cfg.use_kl_loss) and "ref_log_probs" in part

    def inputs(self, part: dict) -> list[torch.Tensor]:
        """What must be finite for an episode to be trained on."""
        kl_inputs = [part["ref_log_probs"]] if self.uses_kl_loss(part) else []
        return [part["advantages"], part["old_log_probs"], *kl_inputs]

    def scored(self, out, t: dict) -> torch.Tensor:
        """What the forward pass made of the episode: its log-prob ratio."""
        return out[0] - t["old_log_probs"]

    def loss(self, out, t: dict, mode: str) -> tuple[torch.Tensor, dict[str, float]]:
        from grl.algo import entropy_bonus, kl_loss, policy_loss, truncated_is_weights

        c = self.cfg
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
        if self.uses_kl_loss(t):
            kl = kl_loss(log_probs, t["ref_log_probs"], t["loss_mask"], kind=c.kl_loss_type, loss_agg_mode=mode,
                         segment_ids=seg)
            loss = loss + float(c.kl_loss_coef) * kl
            stats["kl_loss"] = kl.detach().item()
        return loss, stats


class ValueObjective:
    """The critic's loss: the clipped value loss against the returns, a token mean."""

    prefix = "critic"
    scored_name = "value"

    def __init__(self, train_cfg):
        self.cfg = train_cfg  # the critic section

    def agg_mode(self) -> str:
        return "token-mean"

    def inputs(self, part: dict) -> list[torch.Tensor]:
        return [part["returns"], part["values"]]

    def scored(self, out, t: dict) -> torch.Tensor:
        return out

    def loss(self, out, t: dict, mode: str) -> tuple[torch.Tensor, dict[str, float]]:
        from grl.algo import masked_mean, value_loss

        loss, m = value_loss(out, t["values"], t["returns"], t["loss_mask"],
                             cliprange_value=float(self.cfg.cliprange_value), loss_agg_mode=mode, segment_ids=seg_of(t))
        return loss, {"vf_loss": loss.detach().item(), "vf_clipfrac": float(m["vf_clipfrac"]),
                      "vpred_mean": float(masked_mean(out.detach(), t["loss_mask"]))}


class UpdateLoop:
    """The optimizer-step methods of `grl.workers.worker.Worker`, which provides the model
    (`module`, `optimizer`, `scheduler`), its config (`train_cfg`), its role's loss (`objective`: a
    PolicyObjective or a ValueObjective) and the scoring (`_score`, `_micro_batches`, `_to_device`)."""

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
        p = self.objective.prefix
        metrics = {f"{p}/{k}": v / max(steps, 1) for k, v in zip(keys, summed[:-1])}
        metrics[f"{p}/grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
        metrics[f"{p}/lr"] = self.last_lr
        metrics[f"{p}/skipped_steps"] = float(self.skipped_steps - skipped_before)
        metrics[f"{p}/dropped_samples"] = summed[-1]
        metrics.update(memory_metrics(self.device))
        if self.device == "cuda":
            torch.cuda.empty_cache()  # hand the cached blocks back, so the engine can wake into them
        return metrics

    def _minibatch(self, part: dict) -> tuple[dict[str, float], float, bool]:
        """Accumulate the gradient of one mini-batch's loss; the optimizer step
        is the caller's. Episodes with non-finite inputs, ratios or losses are
        dropped. -> (stats,
        dropped episodes, whether any rank had a loss token)."""
        from grl.algo import finite_episodes

        mode = self.objective.agg_mode()
        seg = seg_of(part)
        mask = part["loss_mask"].float().clone()
        episodes = loss_units(mask, "seq-mean-token-mean", seg)
        mask[~finite_episodes(*self.objective.inputs(part), loss_mask=mask, segment_ids=seg)] = 0.0
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
        ok = finite_episodes(self.objective.scored(out, trimmed), loss_mask=mask, segment_ids=seg)
        dropped = 0.0
        if not bool(ok.all()):
            kept = mask.masked_fill(~ok, 0.0)
            dropped = loss_units(mask, "seq-mean-token-mean", seg) - loss_units(kept, "seq-mean-token-mean", seg)
            log.warning("%s rank %d: dropping %d episode(s) with a non-finite %s", self.role, self.rank, int(dropped),
                        self.objective.scored_name)
            mask = trimmed["loss_mask"] = kept
        loss, stats = self.objective.loss(out, trimmed, mode)
        if not torch.isfinite(loss):
            left = loss_units(mask, "seq-mean-token-mean", seg)
            log.warning("%s rank %d: non-finite loss; dropping the micro-batch's %d episodes", self.role, self.rank,
                        int(left))
            dropped += left
            trimmed["loss_mask"] = torch.zeros_like(mask)
            loss, stats = self.objective.loss(out, trimmed, mode)
            loss = torch.nan_to_num(loss, nan=0.0, posinf=0.0, neginf=0.0)
            stats = {k: 0.0 for k in stats}
        return loss, stats, dropped

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
