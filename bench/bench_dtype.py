"""fp32 against bf16 on this CPU: the model's forward and forward + backward, and what `dtype: auto` picks.

    .venv/bin/python bench/bench_dtype.py [--model embedded] [--tokens 512] [--repeats 3] [--threads N]

Both arms run in this process on the same token batch, alternately, and each figure is the fastest of
`--repeats`; the ratio is bf16 seconds / fp32 seconds (above 1: bf16 is slower, as it is wherever the CPU
has no bf16 instructions and oneDNN emulates them). bf16 here is what the actor computes in under mixed
precision: bf16 weights and activations, the loss in fp32. Cap the ISA to see an AVX2 machine's speed on a
newer one: `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 .venv/bin/python bench/bench_dtype.py`.
"""

from __future__ import annotations

import argparse
import time


def seconds(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--tokens", type=int, default=512, help="tokens in the batch (rows of 256)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
    args = parser.parse_args()

    import torch

    from grl.compute import cpu_compute

    from grl.models import load_causal_lm, resolve_model_path

    if args.threads:
        torch.set_num_threads(args.threads)
    path = resolve_model_path(args.model)
    chosen = cpu_compute()
    print(f"cpu: {chosen.describe()}; {torch.get_num_threads()} threads, torch {torch.__version__}")

    width = min(256, args.tokens)
    ids = torch.randint(0, 32000, (max(args.tokens // width, 1), width))
    models = {name: load_causal_lm(path, name, "cpu").train() for name in ("float32", "bfloat16")}

    def forward(model) -> None:
        with torch.no_grad():
            model(input_ids=ids).logits[:, -1].float().sum()

    def forward_backward(model) -> None:
        # the loss on a few positions, as a multi-turn batch trains on its sampled tokens only
        hidden = model.model(input_ids=ids).last_hidden_state[:, -16:]
        model.lm_head(hidden).float().logsumexp(-1).mean().backward()
        model.zero_grad(set_to_none=True)

    for model in models.values():  # warm-up: oneDNN builds its kernels on first use
        forward(model)
        forward_backward(model)
    rows = []
    for label, fn in (("forward", forward), ("forward + backward", forward_backward)):
        took = {name: seconds(lambda m=model: fn(m), args.repeats) for name, model in models.items()}
        rows.append((label, took["float32"], took["bfloat16"]))
    tokens = ids.numel()
    print(f"{args.model}, {tokens} tokens ({ids.shape[0]} x {width}), best of {args.repeats}:")
    print(f"  {'':<20}{'fp32 s':>9}{'bf16 s':>9}{'bf16/fp32':>11}")
    for label, fp32, bf16 in rows:
        print(f"  {label:<20}{fp32:9.3f}{bf16:9.3f}{bf16 / fp32:10.2f}x")


if __name__ == "__main__":
    main()
