"""The V2 grammar logits processor's `apply()` per decode step: the code before issue 41 (two
`.tolist()` reads of device tensors, six blocking uploads, a tensor per row, a `[rows, vocab]`
mask) against the current one (one read, one upload from a reused buffer, indices from numpy).

Both are built by vLLM's own loader (`build_custom_logits_processors`) over one `RequestState` of
128 slots, the V2 runner's per-slot buffers, and see the same batch every step: 128 requests under
the grammars of real env states (think text, forced closings, answer tries), each refilled with a
new request when its reply ends, the batch order shuffled every step as the runner's is. Each step
masks the same logits `[128, 151936]` (Qwen2.5-0.5B's width) for both; they must come out equal.
On CPU this times the host work and the masking kernels, not a GPU's sync stalls.

    python bench/bench_grammar.py [--steps 40] [--batch 128] [--threads 1] [--answers-only]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor import (  # noqa: E402
    LogitsContext,
    LogitsProcessor,
    build_custom_logits_processors,
)

from grl.engines.constraint import AllowedSet, GrammarWalker, ReplyGrammar, _Free, constrain_logits  # noqa: E402
from grl.engines.vllm_grammar import V2_PROCESSOR, request_grammar  # noqa: E402

VOCAB = 151936  # Qwen2.5-0.5B's logits width
PROMPT = 256


# ---------------------------------------------------------------------------- baseline: the code before issue
# 41


def baseline_allowed_sets_tensors(sets):
    width = max((len(ids) for _, ids in sets), default=0)
    sizes = torch.tensor([size for size, _ in sets], dtype=torch.long)
    ids = torch.zeros((len(sets), max(width, 1)), dtype=torch.long)
    for row, (_, members) in enumerate(sets):
        if members:
            ids[row, : len(members)] = torch.tensor(members, dtype=torch.long)
    return sizes, ids


def baseline_mask_rows(logits: torch.Tensor, rows: list[int], sets: list[AllowedSet]) -> None:
    sizes, ids = baseline_allowed_sets_tensors(sets)
    index = torch.tensor(rows, device=logits.device)
    logits[index] = constrain_logits(logits[index], sizes.to(logits.device), ids.to(logits.device))


class BaselineWalk:
    def __init__(self, grammar: ReplyGrammar):
        self.walker: GrammarWalker = grammar.walker()
        self.seen = 0

    def advance(self, new_tokens: list[int]) -> AllowedSet:
        for token in new_tokens:
            self.walker.advance(token)
        self.seen += len(new_tokens)
        return self.walker.allowed()


class BaselineGrammarLogitsProcessorV2(LogitsProcessor):
    """grl/engines/vllm_grammar.py's GrammarLogitsProcessorV2 as of commit abbf4a7."""

    def __init__(self, vllm_config, req_states):
        self.req_states = req_states
        self.walks: dict[int, BaselineWalk] = {}

    def add_request(self, req_idx: int, sampling_params) -> bool:
        grammar = request_grammar(sampling_params)
        if grammar is None:
            self.walks.pop(req_idx, None)
            return False
        self.walks[req_idx] = BaselineWalk(grammar)
        return True

    def apply(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        slot_of_row = ctx.idx_mapping_np.tolist()
        rows = [row for row, slot in enumerate(slot_of_row) if slot in self.walks]
        if not rows:
            return logits
        slots = [slot_of_row[row] for row in rows]
        new_tokens = self._unseen_outputs(slots)
        sets = [self.walks[slot].advance(tokens) for slot, tokens in zip(slots, new_tokens)]
        keep = [i for i, allowed in enumerate(sets) if allowed[0] != 0]
        if keep:
            baseline_mask_rows(logits, [rows[i] for i in keep], [sets[i] for i in keep])
        return logits

    def _unseen_outputs(self, slots: list[int]) -> list[list[int]]:
        state = self.req_states
        ends = state.total_len.gpu[torch.tensor(slots, device=state.device)].tolist()
        starts = [int(state.prompt_len.np[slot]) + self.walks[slot].seen for slot in slots]
        spans = [(slot, start, end) for slot, start, end in zip(slots, starts, ends) if end > start]
        if not spans:
            return [[] for _ in slots]
        row_index = torch.tensor(
            [slot for slot, start, end in spans for _ in range(start, end)], device=state.device
        )
        col_index = torch.tensor(
            [col for _, start, end in spans for col in range(start, end)], device=state.device
        )
        flat = state.all_token_ids.gpu[row_index, col_index].tolist()
        found, at = {}, 0
        for slot, start, end in spans:
            found[slot], at = flat[at : at + end - start], at + end - start
        return [found.get(slot, []) for slot in slots]


# ---------------------------------------------------------------------------- the batch


def env_grammars(tokenizer) -> list[ReplyGrammar]:
    """Grammars of real env states, compiled as the rollout compiles them: the agents' presets
    think within 100 tokens; the no-think ones answer within 16-24."""
    import grl.envs
    from grl.engines.constraint import compile_reply_grammar
    from grl.rollout.chat import ChatTokens

    encode = ChatTokens(tokenizer).encode
    end = [tokenizer.eos_token_id] + sorted(set(tokenizer.all_special_ids) - {tokenizer.eos_token_id})
    sokoban = {"dim_room": [6, 6], "num_boxes": 1, "max_steps": 100, "search_depth": 100}
    grammars = []
    for name, config, seed, think, budget in [
        ("sokoban", sokoban, 1, True, 100),
        ("tetris", {"dim_x": 4, "dim_y": 4, "box_type": 1, "max_steps": 100}, 2, True, 100),
        ("blocksworld", {}, 3, False, 24),
        ("sokoban", sokoban, 4, False, 16),
    ]:
        env = grl.envs.make(name, **config)
        env.reset(seed)
        grammars.append(compile_reply_grammar(encode, end, env.valid_actions(), think, budget))
        env.close()
    return grammars


class Batch:
    """Requests in the runner's slots, written the way RequestState.add_request and the
    post-sampling update leave its buffers (their Triton writers do not run on CPU)."""

    def __init__(self, state, processors, grammars, batch: int, text_vocab: int, seed: int):
        from vllm import SamplingParams

        from grl.engines.vllm_grammar import GRAMMAR_ARG

        self.state, self.processors, self.grammars = state, processors, grammars
        self.params = [SamplingParams(max_tokens=128, extra_args={GRAMMAR_ARG: g}) for g in grammars]
        self.rng = random.Random(seed)
        self.text_vocab = text_vocab
        self.walkers: dict[int, GrammarWalker] = {}
        self.kinds = {"allowed": 0, "denied": 0, "unconstrained": 0, "requests": 0}
        for slot in range(batch):
            self.admit(slot)

    def admit(self, slot: int) -> None:
        kind = self.rng.randrange(len(self.grammars))
        prompt = [self.rng.randrange(self.text_vocab) for _ in range(PROMPT)]
        self.state.prompt_len.np[slot] = PROMPT
        self.state.prefill_len.np[slot] = PROMPT
        self.state.all_token_ids.gpu[slot, :PROMPT] = torch.tensor(prompt, dtype=torch.int32)
        self.state.total_len.gpu[slot] = PROMPT
        for processor in self.processors:
            processor.add_request(slot, self.params[kind])
        self.walkers[slot] = self.grammars[kind].walker()
        self.kinds["requests"] += 1

    def context(self) -> LogitsContext:
        order = list(self.walkers)
        self.rng.shuffle(order)
        slots = torch.tensor(order, dtype=torch.int64)
        lengths = self.state.total_len.gpu[slots]
        return LogitsContext(
            expanded_idx_mapping=slots,
            idx_mapping=slots,
            idx_mapping_np=np.array(order),
            expanded_local_pos=torch.zeros(len(order), dtype=torch.int32),
            input_ids=self.state.all_token_ids.gpu[slots, lengths - 1],
            pos=lengths - 1,
            seq_lens_upper_bound_np=lengths.numpy(),
        )

    def sample_and_commit(self) -> None:
        """A token from each request's allowed set, committed; a finished request's slot refilled."""
        for slot, walker in list(self.walkers.items()):
            size, ids = walker.allowed()
            self.kinds["allowed" if size > 0 else "denied" if size < 0 else "unconstrained"] += 1
            if size > 0:
                token = self.rng.choice(ids)
            else:
                token = self.rng.randrange(self.text_vocab)
                while token in ids:
                    token = self.rng.randrange(self.text_vocab)
            end = int(self.state.total_len.gpu[slot])
            self.state.all_token_ids.gpu[slot, end] = token
            self.state.total_len.gpu[slot] = end + 1
            walker.advance(token)
            if walker.done:
                self.admit(slot)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--answers-only",
        action="store_true",
        help="only the grammars without think text: every masked row is an allowed set, which "
        "fills its whole row (the current code's costliest case)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.worker.gpu import buffer_utils
    from vllm.v1.worker.gpu.states import RequestState

    from grl.models import load_tokenizer, resolve_model_path

    path = resolve_model_path("tiny")
    tokenizer = load_tokenizer(path)
    with mock.patch.dict(os.environ):  # vLLM's CPU platform sets process-wide variables
        config = EngineArgs(
            model=path, tokenizer=path, dtype="float32", seed=0, enforce_eager=True, max_num_seqs=args.batch
        ).create_engine_config()
    # CPU has no pinned memory for UVA: vLLM's own fallback (device copies) holds the buffers.
    with mock.patch.object(buffer_utils, "is_uva_available", lambda: False):
        state = RequestState(
            args.batch, 1024, 1024, 0, VOCAB, torch.device("cpu"), use_dense_all_token_ids=True
        )
    new, old = build_custom_logits_processors(
        config, state, False, [V2_PROCESSOR, BaselineGrammarLogitsProcessorV2]
    )
    grammars = env_grammars(tokenizer)
    if args.answers_only:
        grammars = [g for g in grammars if not any(isinstance(node, _Free) for node in g.nodes)]
    batch = Batch(state, [new, old], grammars, args.batch, len(tokenizer), args.seed)
    logits = torch.randn(args.batch, VOCAB, generator=torch.Generator().manual_seed(args.seed))

    times = {"baseline": [], "current": []}
    for step in range(args.steps):
        ctx = batch.context()
        outputs = {}
        for name in ("baseline", "current") if step % 2 else ("current", "baseline"):
            processor = old if name == "baseline" else new
            work = logits.clone()
            start = time.perf_counter()
            outputs[name] = processor.apply(work, ctx)
            times[name].append(time.perf_counter() - start)
        if not torch.equal(outputs["baseline"], outputs["current"]):
            raise SystemExit(f"step {step}: the two processors masked the batch differently")
        batch.sample_and_commit()

    rows = sum(v for k, v in batch.kinds.items() if k != "requests")
    print(
        f"torch {torch.__version__}, CPU {torch.backends.cpu.get_cpu_capability()}, {args.threads} "
        "thread(s); "
        f"batch {args.batch}, vocab {VOCAB}, {args.steps} steps, {batch.kinds['requests']} requests; rows: "
        + ", ".join(f"{k} {v / rows:.0%}" for k, v in batch.kinds.items() if k != "requests")
    )
    skip = min(3, args.steps // 4)  # first steps: allocator and caches warming
    medians = {name: statistics.median(t[skip:]) * 1e3 for name, t in times.items()}
    for name, median in medians.items():
        print(
            f"{name:9s} apply(): median {median:7.2f} ms/step, mean "
            f"{statistics.mean(times[name][skip:]) * 1e3:7.2f}"
        )
    print(
        f"ratio baseline/current: {medians['baseline'] / medians['current']:.1f}x (outputs equal at every "
        "step)"
    )


if __name__ == "__main__":
    main()
