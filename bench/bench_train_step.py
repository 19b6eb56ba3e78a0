"""One CPU training step of the cpu preset: time per phase, peak memory, the update's share of the
ranks' matmul peak, and the actor update's speed against a bare PyTorch loop on the same tokens.

    .venv/bin/python bench/bench_train_step.py [--step-only] [hydra overrides ...]

The step runs through the real stack (Ray workers, FSDP2, the rollout engine).
The baseline then trains a fresh copy of the same model in this process on the
very batch the actor update saw, with the same mini-batches, micro-batches
and row trimming: forward, log-softmax of the sampled tokens, a policy-gradient
loss on the loss mask, backward, AdamW. It uses as many threads as one worker
rank, so the ratio measures the trainer's overhead (sharding, chunked
log-probs, the PPO loss terms, Ray transfers), not the thread count.
`--step-only` skips the baseline: the phase times of one step, to compare levers.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import threading
import time

from grl.run_plan import PHASES as STEP_PHASES

PHASES = (*STEP_PHASES, "step")  # a step's phases (grl/run_plan.py), then the whole step


class PeakRSS:
    """Samples the resident memory of this process and of the Ray worker
    processes (their titles start with `ray::`) every `interval` seconds."""

    def __init__(self, interval: float = 0.2):
        import psutil

        self.psutil, self.interval = psutil, interval
        self.peak_workers = self.peak_one_worker = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        sizes = []
        for proc in self.psutil.process_iter(["cmdline", "memory_info"]):
            cmd = proc.info.get("cmdline") or []
            if cmd and cmd[0].startswith("ray::Worker") and proc.info.get("memory_info"):
                sizes.append(proc.info["memory_info"].rss)
        if sizes:
            self.peak_workers = max(self.peak_workers, sum(sizes))
            self.peak_one_worker = max(self.peak_one_worker, max(sizes))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def bare_update(model_path: str, batch, cfg, threads: int) -> float:
    """Seconds a plain PyTorch loop takes for the actor update's work on `batch`."""
    import torch

    from grl.compute import torch_dtype

    from grl.models import load_causal_lm
    from grl.workers.scoring import trim_width

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    # fp32 weights, computing in the dtype the actor computes in (bf16 autocast where `auto` picks bf16)
    model = load_causal_lm(model_path, "float32", "cpu").train()
    compute = torch_dtype(cfg.actor_rollout_ref.model.dtype, "cpu")
    actor = cfg.actor_rollout_ref.actor
    optim = torch.optim.AdamW(
        model.parameters(),
        lr=actor.optim.lr,
        betas=tuple(actor.optim.betas),
        weight_decay=actor.optim.weight_decay,
    )
    keys = ("input_ids", "attention_mask", "position_ids", "loss_mask", "advantages")
    tensors = {k: batch[k] for k in keys}
    rows = tensors["input_ids"].shape[0]

    def micro_loss(part) -> torch.Tensor:
        part, _ = trim_width(part)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=compute == torch.bfloat16):
            logits = (
                model(
                    input_ids=part["input_ids"],
                    attention_mask=part["attention_mask"],
                    position_ids=part["position_ids"],
                )
                .logits[:, :-1]
                .float()
            )
        log_probs = logits.log_softmax(-1).gather(-1, part["input_ids"][:, 1:, None])[..., 0]
        mask = part["loss_mask"][:, 1:]
        return -(log_probs * part["advantages"][:, 1:] * mask).sum() / mask.sum().clamp(min=1)

    with torch.no_grad():  # warm-up, as the workers' old-log-prob pass warms theirs
        micro_loss({k: v[:1] for k, v in tensors.items()})
    start = time.perf_counter()
    for _ in range(actor.ppo_epochs):
        for lo in range(0, rows, actor.ppo_mini_batch_size):
            mini = {k: v[lo : lo + actor.ppo_mini_batch_size] for k, v in tensors.items()}
            n = mini["input_ids"].shape[0]
            for mlo in range(0, n, actor.ppo_micro_batch_size_per_gpu):
                part = {k: v[mlo : mlo + actor.ppo_micro_batch_size_per_gpu] for k, v in mini.items()}
                (micro_loss(part) * part["input_ids"].shape[0] / n).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), actor.grad_clip)
            optim.step()
            optim.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def one_step_trainer(argv: list[str]):
    """-> (config, trainer, worker start-up seconds) for one step of the cpu preset, nothing saved."""
    from grl.config import load_config
    from grl.trainer.agent_trainer import AgentTrainer

    out = tempfile.mkdtemp(prefix="grl-bench-")
    cfg = load_config(
        [
            "preset=cpu",
            "total_training_steps=1",
            "trainer.val_before_train=false",
            "trainer.logger=[]",
            "resume_mode=disable",
            "trainer.export_hf=false",
            f"trainer.run_dir={out}/run",
            f"trainer.default_local_dir={out}/ckpt",
            *argv,
        ]
    )
    started = time.perf_counter()
    trainer = AgentTrainer.from_config(cfg)
    return cfg, trainer, time.perf_counter() - started


def main(argv: list[str]) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from grl.models import resolve_model_path

    step_only = "--step-only" in argv
    cfg, trainer, startup = one_step_trainer([a for a in argv if a != "--step-only"])
    try:
        with PeakRSS() as memory:
            metrics, batch = trainer.train_step(1)
        threads = trainer.actor.execute(lambda worker: __import__("torch").get_num_threads())[0]
    finally:
        trainer.close()

    mask, attention = batch["loss_mask"], batch["attention_mask"]
    tokens = int(attention.sum())
    print(
        f"cpu preset, one training step ({cfg.actor_rollout_ref.model.path}, {len(batch)} episodes, "
        f"{tokens} tokens of which {int(mask.sum())} sampled; padding {1 - tokens / attention.numel():.1%} "
        f"of the padded batch); worker start-up {startup:.1f} s"
    )
    for phase in PHASES:
        if f"timing_s/{phase}" in metrics:
            print(f"  {phase:<14} {metrics[f'timing_s/{phase}']:8.2f} s")
    if "perf/mfu/actor" in metrics:
        print(
            f"  the update's share of the matmul peak (perf/mfu/actor): {metrics['perf/mfu/actor']:.2f} of "
            f"{trainer.peak_flops / 1e9:.0f} GFLOP/s a rank (F.linear forward + backward at the model's MLP "
            f"shape, its dtype and threads: grl/workers/peak.py)"
        )
    print(
        f"  peak RSS: Ray workers {memory.peak_workers / 2**30:.2f} GiB in all, largest "
        f"{memory.peak_one_worker / 2**30:.2f} GiB; driver "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB"
    )

    if step_only:
        return
    bare = bare_update(resolve_model_path(cfg.actor_rollout_ref.model.path), batch, cfg, threads)
    update = metrics["timing_s/update_actor"]
    print(
        f"actor update: {tokens / update:.0f} tokens/s; bare PyTorch loop on the same tokens "
        f"({threads} thread{'s' if threads > 1 else ''}, as a worker rank): {tokens / bare:.0f} tokens/s; "
        f"ratio {bare / update:.2f} (1.0 = as fast as the bare loop)"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
