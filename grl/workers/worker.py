"""What every rank of a worker group does, whatever its role (grl/workers/policy.py,
critic.py): join the group's torch.distributed group, build and shard its model, score
micro-batches, train (grl/workers/update.py) and checkpoint. Every method that touches a sharded
model is a collective, so the driver calls it on all ranks with equally sized shards.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.distributed as dist

from grl.engines.base import usable_cores
from grl.rollout.batch import attention_spans
from grl.run_plan import RunPlan
from grl.schema import Trainer
from grl.workers import fsdp, lora, sharded
from grl.workers.heads import Head
from grl.workers.scoring import TokenScorer, pad_width, trim_width
from grl.workers.update import UpdateLoop, split_rows

log = logging.getLogger("grl.workers")

WRAPPER_PREFIX = "model."  # TokenScorer keeps the Hugging Face model under `.model`


def hf_names(state: dict) -> dict:
    return {k[len(WRAPPER_PREFIX) :]: v for k, v in state.items()}


class Worker(UpdateLoop):
    """A role subclasses this with its `role` (the name in logs and metrics), its `head`
    (grl/workers/heads.py:
    what its models put on the backbone) and `build()`, which sets
    `module`, `model_cfg`, `train_cfg` and `objective`. A rank is built from the run's plan and its role's
    typed config section (grl/schema/workers.py: ActorRolloutRef or Critic) and the trainer section (the
    seed, the ranks per node), not the whole config."""

    role: str
    head: Head

    def __init__(self, rank: int, plan: RunPlan, section, trainer: Trainer, logits_chunk_size: int):
        """`logits_chunk_size`: positions per chunk through the head, actor_rollout_ref.actor's for every
        role (the critic's value head too)."""
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {self.role}[{rank}] %(message)s")
        self.rank, self.plan, self.world_size, self.section = rank, plan, plan.world_size, section
        self.device = plan.device
        self.seed, self.logits_chunk_size = trainer.seed, logits_chunk_size
        torch.set_num_threads(plan.cpu_threads(usable_cores(), ranks_per_node=trainer.n_gpus_per_node))
        self.peft_model = None  # set on a LoRA policy: the adapter's config and on/off switch
        # Wall-clock times (time.time(), comparable between the processes of a node) of this rank's start-up:
        # "loaded" once setup has built its models, "engine_start"/"engine_ready" around its engine's build.
        self.startup: dict[str, float] = {}

    # ------------------------------------------------------------ set-up

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def listen(self, one_node: bool) -> tuple[str, int]:
        """Rank 0: open the group's rendezvous (on the loopback address when every rank shares this
        node) and return where the others find it."""
        self._listening = fsdp.listen_for_peers(fsdp.LOOPBACK if one_node else fsdp.node_ip())
        return self._listening.getsockname()[:2]

    def setup(self, master_addr: str, master_port: int) -> None:
        from grl.models import fetch_model

        fetch_model(self.section.model.path)
        fsdp.init_process_group(
            self.rank,
            self.world_size,
            master_addr,
            master_port,
            self.device,
            timeout_s=self.section.nccl_timeout,
            listening=getattr(self, "_listening", None),
        )
        fsdp.seed_everything(self.seed + self.rank)
        self.build()
        self.optimizer = fsdp.make_optimizer(
            [p for p in self.module.parameters() if p.requires_grad], self.train_cfg.optim
        )
        self.scheduler = fsdp.make_scheduler(self.optimizer, self.train_cfg.optim.lr_warmup_steps)
        self.startup["loaded"] = time.time()

    def startup_times(self) -> dict[str, float]:
        return self.startup

    def build(self) -> None:
        raise NotImplementedError

    def _build(self, model_cfg, fsdp_cfg, trainable: bool) -> TokenScorer:
        from grl.compute import torch_dtype

        mixed = fsdp.mixed_precision(fsdp_cfg, model_cfg.dtype, self.device)
        dtype = "float32" if (trainable and mixed) else model_cfg.dtype
        # Rank 0 reads the weights into host memory; every rank shards an empty (meta) copy and
        # receives its shards from rank 0: no device ever holds the full model, and the host one
        # copy instead of one per rank (a 7B model in fp32: 28 GB, not 8 x 28).
        head = self.head
        source = head.load(model_cfg.path, dtype=dtype, device=self.device) if self.rank == 0 else None
        model = fsdp.empty_model(head, model_cfg.path, torch_dtype(dtype, self.device))
        if trainable and head.takes_adapters and model_cfg.lora_rank > 0:
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
        scorer = TokenScorer(model, head)
        offload = fsdp.offloaded(fsdp_cfg)
        if trainable and fsdp_cfg.optimizer_offload and not fsdp_cfg.param_offload:
            log.info(
                "%s: FSDP2 offloads the optimizer together with the parameters; param offload is on too",
                self.role,
            )
        name = f"{self.role}{'' if trainable else ' (ref)'}"
        scorer.compute_dtype = fsdp.shard(
            scorer,
            fsdp.decoder_layers(model),
            self.device,
            mixed_precision=trainable and mixed,
            offload=offload,
            role=name,
        )
        fsdp.load_from_rank0(
            scorer, None if source is None else TokenScorer(source, head), self.device, offload
        )
        return scorer

    # ------------------------------------------------------------ scoring

    def _score(self, scorer: TokenScorer, tensors: dict, grad: bool):
        """Forward one micro-batch. Without grad, the FSDP2 root keeps its
        parameters gathered afterwards (no backward reshards them), so callers
        reshard once they are done; otherwise parameters() would list the
        gathered copies instead of the shards the optimizer holds."""
        trimmed, width = trim_width(tensors)
        with torch.set_grad_enabled(grad):
            out = scorer(
                trimmed["input_ids"],
                trimmed["attention_mask"],
                trimmed["position_ids"],
                attention_spans(trimmed),
                chunk_size=self.logits_chunk_size,
                temperature=self.plan.score_temperature,
                constraint_size=trimmed.get("constraint_size"),
                constraint_ids=trimmed.get("constraint_ids"),
                loss_mask=trimmed.get("loss_mask"),
                parent_ids=trimmed.get("parent_ids"),
            )
        if grad:
            return out, trimmed
        return tuple(pad_width(o, width) for o in out) if isinstance(out, tuple) else pad_width(out, width)

    def _micro_batches(self, tensors: dict, size: int) -> list[dict]:
        """`split_rows` into as many micro-batches as the busiest rank needs: every FSDP2 pass
        gathers parameters from all ranks, so a rank with an extra pass would wait forever."""
        return split_rows(tensors, size, int(fsdp.all_reduce_max([len(split_rows(tensors, size))])[0]))

    def _to_device(self, tensors: dict) -> dict:
        return {k: v.to(self.device) for k, v in tensors.items()}

    # ------------------------------------------------------------ checkpoints

    def save_checkpoint(self, path: str) -> None:
        """Collective: this rank's shards of the weights (only the adapter's in a LoRA run) and
        optimizer state, the scheduler (the learning rate's clock), this rank's RNG
        (grl/workers/sharded.py)."""
        sharded.save(
            path,
            self.role,
            self.module,
            self.optimizer,
            adapter_only=self.peft_model is not None,
            trainer_state={"scheduler": self.scheduler.state_dict(), "world_size": self.world_size},
        )

    def load_checkpoint(self, path: str) -> None:
        state, read = sharded.load(
            path, self.module, self.optimizer, self.peft_model is not None, self.world_size
        )
        self.scheduler.load_state_dict(state["scheduler"])
        log.info("%s rank %d: read %.1f MB of shards from %s", self.role, self.rank, read / 2**20, path)

    # ------------------------------------------------------------ misc

    def execute(self, fn, *args):
        """Run `fn(self, *args)` on this rank (debugging, fault injection in tests)."""
        return fn(self, *args)

    def teardown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
