"""The critic's rank: the value model (the policy's backbone with a scalar head) and its loss."""

from __future__ import annotations

import torch

from grl.workers.heads import VALUE
from grl.workers.update import seg_of
from grl.workers.worker import Worker


class ValueObjective:
    """The critic's loss: the clipped value loss against the returns, a token mean."""

    prefix = "critic"

    def __init__(self, train_cfg):
        self.section = train_cfg  # the critic section

    def agg_mode(self) -> str:
        return "token-mean"

    def loss(self, out, t: dict, mode: str) -> tuple[torch.Tensor, dict[str, float]]:
        from grl.algo import masked_mean, value_loss

        loss, m = value_loss(
            out,
            t["values"],
            t["returns"],
            t["loss_mask"],
            cliprange_value=self.section.cliprange_value,
            loss_agg_mode=mode,
            segment_ids=seg_of(t),
        )
        return loss, {
            "vf_loss": loss.detach().item(),
            "vf_clipfrac": float(m["vf_clipfrac"]),
            "vpred_mean": float(masked_mean(out.detach(), t["loss_mask"])),
        }


class CriticWorker(Worker):
    role, head = "critic", VALUE

    def build(self) -> None:
        self.model_cfg, self.train_cfg = self.section.model, self.section
        self.module = self._build(self.section.model, self.section.fsdp_config, trainable=True)
        self.objective = ValueObjective(self.train_cfg)

    def compute_values(self, tensors: dict) -> torch.Tensor:
        size = self.section.ppo_micro_batch_size_per_gpu
        values = torch.cat(
            [
                self._score(self.module, self._to_device(m), grad=False)
                for m in self._micro_batches(tensors, size)
            ]
        ).cpu()
        self.module.reshard()
        return values
