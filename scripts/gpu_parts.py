"""GRL's own torch code on one CUDA GPU where only torch and transformers are installed (no vLLM, no Ray,
no package index): what a lent machine that cannot run scripts/gpu_smoke.sh can still check.

The hf engine samples a batch in bf16 (half of it under the valid-action grammar), an FSDP2-sharded policy
built as the actor's workers build it (fp32 master weights, bf16 compute; grl/workers/worker.py `_build`)
scores exactly those tokens, one optimizer step runs on a PPO-style loss, and the engine loads the updated
weights and samples again. Prints one line of figures per check and exits non-zero on a failed one.

    python scripts/gpu_parts.py <model folder> [cuda|cpu]   # e.g. the tiny model's folder
    (grl.models.tiny_model_path())

`cpu` runs the same checks here (bf16 sampling needs a CPU with bf16 instructions; no mixed precision).
"""

from __future__ import annotations

import math
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# grl/workers/__init__.py imports the Ray worker groups; the parts below need none of Ray.
sys.modules["grl.workers"] = types.ModuleType("grl.workers")
sys.modules["grl.workers"].__path__ = [str(ROOT / "grl" / "workers")]

import torch  # noqa: E402

from grl.engines import SamplingParams, make_engine  # noqa: E402
from grl.engines.constraint import compile_reply_grammar  # noqa: E402
from grl.models import load_causal_lm  # noqa: E402
from grl.rollout.allowed_sets import compact_sets  # noqa: E402
from grl.rollout.batch import episode_tokens  # noqa: E402
from grl.rollout.chat import ChatTokens  # noqa: E402
from grl.rollout.types import Episode, Turn  # noqa: E402
from grl.schema.workers import FSDPConfig  # noqa: E402
from grl.workers import fsdp  # noqa: E402
from grl.workers.heads import POLICY  # noqa: E402
from grl.workers.scoring import TokenScorer  # noqa: E402
from grl.workers.worker import hf_names  # noqa: E402

MOVES = ["Left", "Right", "Down"]
failed: list[str] = []


def check(name: str, ok: bool, figures: str) -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {figures}", flush=True)
    if not ok:
        failed.append(name)


def batch_of(outputs, prompts, grammars):
    """The trainer's flattening of one-turn episodes, padded into [B, T] tensors on the GPU."""
    rows = [
        episode_tokens(
            Episode(
                "check",
                i,
                0,
                [
                    Turn(
                        p,
                        list(o.token_ids),
                        list(o.log_probs),
                        0.0,
                        response_allowed=None if g is None else g.trace(o.token_ids),
                    )
                ],
                score=0.0,
            ),
            use_turn_scores=False,
        )
        for i, (p, o, g) in enumerate(zip(prompts, outputs, grammars))
    ]
    T = max(len(r.input_ids) for r in rows)
    sizes, ids = compact_sets([r.allowed for r in rows], T)

    def pad(values, fill=0):
        return values + [fill] * (T - len(values))

    t = {
        "input_ids": torch.tensor([pad(r.input_ids) for r in rows]),
        "attention_mask": torch.tensor([pad([1] * len(r.input_ids)) for r in rows]),
        "position_ids": torch.tensor([pad(r.position_ids) for r in rows]),
        "loss_mask": torch.tensor([pad(r.loss_mask, 0.0) for r in rows]),
        "rollout_log_probs": torch.tensor([pad(r.rollout_log_probs, 0.0) for r in rows]),
        "constraint_size": sizes,
        "constraint_ids": ids,
    }
    return {k: v.to(DEVICE) for k, v in t.items()}


def main(model: str) -> int:
    gpu = DEVICE == "cuda"
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0) if gpu else 'CPU'}", flush=True)
    engine = make_engine("hf", model, dtype="bfloat16", device=DEVICE, grammar=True)
    chat = ChatTokens(engine.tokenizer)
    grammar = compile_reply_grammar(chat.encode, chat.end_ids(), MOVES, False, 16)
    prompts = [
        chat.first_prompt([{"role": "user", "content": f"Board {i}: move the piece over the gap."}])
        for i in range(32)
    ]
    grammars = [grammar] * 16 + [None] * 16
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=0)
    start = time.perf_counter()
    outputs = engine.generate(prompts, sampling, grammars)
    gen_s = time.perf_counter() - start
    replies = [engine.tokenizer.decode(o.token_ids, skip_special_tokens=True) for o in outputs[:16]]
    again = engine.generate(prompts, sampling, grammars)
    check(
        "engine: bf16 sampling, half under the reply grammar",
        all(r in {f"<answer>{m}</answer>" for m in MOVES} for r in replies)
        and [o.token_ids for o in again] == [o.token_ids for o in outputs],
        f"{sum(len(o.token_ids) for o in outputs)} tokens in {gen_s:.2f} s; constrained replies "
        f"{sorted(set(replies))}; "
        "a second call with the same seeds gives the same tokens",
    )

    listening = fsdp.listen_for_peers(fsdp.LOOPBACK)  # rank 0's rendezvous, as the worker opens it
    address, port = listening.getsockname()[:2]
    fsdp.init_process_group(0, 1, address, port, DEVICE, timeout_s=120, listening=listening)
    mixed = fsdp.mixed_precision(FSDPConfig(), "bfloat16", DEVICE)  # the actor's defaults
    source = load_causal_lm(model, dtype="float32", device=DEVICE)
    module = fsdp.empty_model(POLICY, model, torch.float32)
    scorer = TokenScorer(module, POLICY)
    scorer.compute_dtype = fsdp.shard(
        scorer, fsdp.decoder_layers(module), DEVICE, mixed_precision=mixed, offload=False, role="actor"
    )
    fsdp.load_from_rank0(scorer, TokenScorer(source, POLICY), DEVICE, False)
    batch = batch_of(outputs, prompts, grammars)
    args = dict(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        temperature=1.0,
        constraint_size=batch["constraint_size"],
        constraint_ids=batch["constraint_ids"],
        loss_mask=batch["loss_mask"],
    )
    with torch.no_grad():
        log_probs, _ = scorer(**args)
    mask = batch["loss_mask"] > 0
    diff = (log_probs - batch["rollout_log_probs"]).abs()[mask]
    check(
        f"scorer: FSDP2{', fp32 master weights, bf16 compute' if mixed else ''}, the engine's sampled tokens",
        (mixed or not gpu) and bool(torch.isfinite(diff).all()) and diff.max().item() < 1.0,
        f"|Δlog p| mean {diff.mean().item():.4f} max {diff.max().item():.4f} nat over {int(mask.sum())} "
        "tokens "
        "(bf16 pairs sit near 0.1; the smoke test's bar is 1 nat)",
    )

    optimizer = fsdp.make_optimizer(
        [p for p in scorer.parameters() if p.requires_grad],
        types.SimpleNamespace(lr=1e-3, betas=[0.9, 0.999], weight_decay=0.0),
    )
    before = {k: v.clone() for k, v in fsdp.full_state_dict(scorer).items()}
    advantages = torch.randn(mask.shape[0], 1, device=DEVICE).expand_as(log_probs)
    start = time.perf_counter()
    log_probs, entropy = scorer(**args)
    ratio = torch.exp(log_probs - batch["rollout_log_probs"])
    loss = (
        -(torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.28) * advantages)[mask]).mean()
        - 0.01 * entropy[mask].mean()
    )
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(scorer.parameters(), 1.0)
    optimizer.step()
    if gpu:
        torch.cuda.synchronize()
    update_s = time.perf_counter() - start
    after = fsdp.full_state_dict(scorer)
    moved = max((after[k].float() - before[k].float()).abs().max().item() for k in after)
    check(
        "update: one optimizer step",
        math.isfinite(loss.item()) and math.isfinite(float(grad_norm)) and moved > 0,
        f"loss {loss.item():.4f}, grad norm {float(grad_norm):.4f}, largest weight change {moved:.2e}, "
        f"{update_s:.2f} s",
    )

    engine.update_weights(hf_names(after))
    with torch.no_grad():
        outputs = engine.generate(prompts, sampling, grammars)
        batch = batch_of(outputs, prompts, grammars)
        args.update(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
            constraint_size=batch["constraint_size"],
            constraint_ids=batch["constraint_ids"],
            loss_mask=batch["loss_mask"],
        )
        log_probs, _ = scorer(**args)
    mask = batch["loss_mask"] > 0
    diff = (log_probs - batch["rollout_log_probs"]).abs()[mask]
    peak = f"; peak GPU memory {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB" if gpu else ""
    check(
        "weight sync: the engine samples with the updated weights",
        diff.max().item() < 1.0,
        f"|Δlog p| after the sync: mean {diff.mean().item():.4f} max {diff.max().item():.4f}{peak}",
    )
    torch.distributed.destroy_process_group()
    print("all checks passed" if not failed else f"failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


DEVICE = sys.argv[2] if len(sys.argv) > 2 else "cuda"

if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
