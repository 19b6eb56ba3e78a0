"""The update side of a worker rank: mini-batches of micro-batches, the optimizer step, and the
helpers that split and weigh them. Each role's loss is its objective (grl/workers/policy.py, critic.py)."""

from __future__ import annotations

import logging
import math
import resource

import torch

from grl.rollout.allowed_sets import row_count, take_rows
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
            raise ValueError(
                f"{len(spans)} rows cannot make {count} micro-batches; every rank needs as many rows"
            )
        spans[widest : widest + 1] = [(a, (a + b) // 2), ((a + b) // 2, b)]
    return [take_rows(tensors, slice(a, b)) for a, b in spans]


def _row_spans(tensors: dict, size: int) -> list[tuple[int, int]]:
    n = row_count(tensors)
    size = max(size, 1)
    if "segment_ids" not in tensors:
        bounds = list(range(0, n, size)) + [n]
    else:
        bounds, held = [0], 0
        for i, count in enumerate(episodes_per_row(tensors)):
            if i > bounds[-1] and held + count > size:
                bounds.append(i)
                held = 0
            held += count
        bounds.append(n)
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def episodes_per_row(packed: dict) -> list[int]:
    """Episodes in each packed row (at least 1): its segments, less the prompts its episodes share."""
    counts = packed["segment_ids"].amax(-1).tolist()
    if "parent_ids" in packed:
        counts = [c - len(set(p.tolist()) - {0}) for c, p in zip(counts, packed["parent_ids"])]
    return [max(c, 1) for c in counts]


def aggregated_like_loss(stat: str) -> bool:
    """Stats reduced with `loss_agg_mode` (the losses and the entropy bonus) add up over
    micro-batches by loss units; the rest (clip fractions, ppo_kl) are token means."""
    return stat.endswith("loss") or stat == "entropy"


def is_peak(stat: str) -> bool:
    """Stats that are the largest over micro-batches, mini-batches and ranks, not a mean."""
    return stat.endswith("_max")


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


def memory_metrics(device: str, role: str = "actor") -> dict[str, float]:
    """verl's `perf/max_memory_allocated_gb` (the device's peak; on CPU the process's peak
    resident memory) and `perf/cpu_memory_used_gb` (the machine's used memory). The peak is
    the one since the previous call, which resets it: each step reports its own. Another role's
    peak is `perf/<role>/max_memory_allocated_gb` (the critic's no longer overwrites the actor's)."""
    import psutil

    if device.startswith("cuda") and torch.cuda.is_available():
        peak = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()
    else:
        peak = _peak_rss_gib_and_reset()
    if role != "actor":
        return {f"perf/{role}/max_memory_allocated_gb": peak}
    return {
        "perf/max_memory_allocated_gb": peak,
        "perf/cpu_memory_used_gb": psutil.virtual_memory().used / 2**30,
    }


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


class UpdateLoop:
    """The optimizer steps of a worker rank (grl/workers/worker.py), which provides the model
    (`module`, `optimizer`, `scheduler`), its config (`train_cfg`), its role's loss (`objective`,
    grl/workers/policy.py or critic.py) and the scoring (`_score`, `_micro_batches`, `_to_device`)."""

    def update(self, minibatches: list[dict]) -> dict[str, float]:
        """One optimizer step per element of `minibatches` (this rank's share of each global
        mini-batch, in order): for each mini-batch, for each micro-batch, weight, loss, backward;
        then the step. The driver has dropped non-finite data. Returns metrics summed over ranks."""
        mode = self.objective.agg_mode()
        micro_size = self.train_cfg.ppo_micro_batch_size_per_gpu
        totals: dict[str, float] = {}
        steps, skipped, grad_norms = 0, 0, []
        lr = self.optimizer.param_groups[0]["lr"]  # the last step's (the next one's if none is taken)
        for minibatch in minibatches:
            minibatch = self._to_device(minibatch)
            # Weights are shares of the whole mini-batch (all ranks), so the micro-batches'
            # gradients add up to the gradient of the mini-batch loss.
            tokens, units = fsdp.all_reduce_sum(
                [
                    loss_units(minibatch["loss_mask"], "token-mean"),
                    loss_units(minibatch["loss_mask"], mode, seg_of(minibatch)),
                ]
            )
            stats: dict[str, float] = {}
            for micro in self._micro_batches(minibatch, micro_size):
                out, micro = self._score(self.module, micro, grad=True)
                loss, micro_stats = self.objective.loss(out, micro, mode)
                weight = loss_units(micro["loss_mask"], mode, seg_of(micro)) / max(units, 1.0)
                token_weight = loss_units(micro["loss_mask"], "token-mean") / max(tokens, 1.0)
                # FSDP2 averages gradients over ranks; the loss is a share of a global sum, so undo it.
                (loss * weight * self.world_size).backward()
                for k, v in micro_stats.items():
                    if is_peak(k):
                        stats[k] = max(stats.get(k, -math.inf), v)
                    else:
                        stats[k] = stats.get(k, 0.0) + v * (
                            weight if aggregated_like_loss(k) else token_weight
                        )
            if tokens == 0:  # a step would be pure weight decay and momentum
                log.warning(
                    "%s rank %d: mini-batch without loss tokens; no optimizer step", self.role, self.rank
                )
                self.optimizer.zero_grad(set_to_none=True)
                continue
            lr = self.optimizer.param_groups[0]["lr"]
            norm = self._optimizer_step()
            if math.isfinite(norm):
                grad_norms.append(norm)
            else:
                skipped += 1
            for k, v in stats.items():
                totals[k] = max(totals.get(k, -math.inf), v) if is_peak(k) else totals.get(k, 0.0) + v
            steps += 1
        means, peaks = sorted(k for k in totals if not is_peak(k)), sorted(k for k in totals if is_peak(k))
        p = self.objective.prefix
        metrics = {
            f"{p}/{k}": v / max(steps, 1)
            for k, v in zip(means, fsdp.all_reduce_sum([totals[k] for k in means]))
        }
        if peaks:  # the same keys on every rank: one collective each
            metrics.update(
                {f"{p}/{k}": v for k, v in zip(peaks, fsdp.all_reduce_max([totals[k] for k in peaks]))}
            )
        metrics[f"{p}/grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
        metrics[f"{p}/lr"] = lr
        metrics[f"{p}/skipped_steps"] = float(skipped)
        metrics.update(memory_metrics(self.device, self.role))
        if self.device == "cuda":
            torch.cuda.empty_cache()  # hand the cached blocks back, so the engine can wake into them
        return metrics

    def _optimizer_step(self) -> float:
        """Clip and step; a non-finite gradient norm skips the step. The norm
        is reduced over all ranks, so every rank takes the same decision."""
        params = [p for p in self.module.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.train_cfg.grad_clip)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        norm = float(norm)
        if math.isfinite(norm):
            self.optimizer.step()
            self.scheduler.step()
        else:
            log.warning("%s rank %d: gradient norm is %s; optimizer step skipped", self.role, self.rank, norm)
        self.optimizer.zero_grad(set_to_none=True)
        return norm
