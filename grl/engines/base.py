"""The generation-engine interface shared by the hf and vllm backends.

Prompts go in and come out as token ids, never text: the trainer trains on
exactly the tokens the engine sampled.
"""

from __future__ import annotations

import os

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: no top-k filter (as in vLLM)
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    greedy: bool = False
    seed: int | None = None  # request i of a batch uses seed + i, so equal prompts still differ
    request_seeds: list[int] | None = (
        None  # one seed per request instead (a batch gathered from whoever is ready)
    )
    logprobs: bool = True  # return the sampled tokens' log-probs where cheap
    ignore_eos: bool = False  # keep going past eos (benchmarks that need a fixed length)

    def seed_of(self, request: int) -> int | None:
        """The seed of request `request` of a batch (None: the engine's own generator)."""
        if self.request_seeds is not None:
            return self.request_seeds[request]
        return None if self.seed is None else self.seed + request

    @property
    def is_greedy(self) -> bool:
        return self.greedy or self.temperature == 0


@dataclass
class GenerationOutput:
    token_ids: list[int]
    log_probs: list[float] | None = None  # one per token in token_ids, or None
    finish_reason: str = "stop"  # "stop" (eos / stop string / stop token) or "length"
    # One per token when top-k/top-p filtered the sampling: the set it was drawn from
    # (grl/engines/kept_sets.py)
    kept_sets: list[tuple[int, tuple[int, ...]]] | None = None


@dataclass(frozen=True)
class EngineOptions:
    """How an engine is built, the same for every engine: each reads the fields it has a use for (the hf
    engine: dtype, device and seed). Built once per engine (grl.workers.rollout_worker.engine_options in
    a run, `make_engine`'s keywords elsewhere)."""

    dtype: str = "auto"
    device: str | None = None  # None: cuda where torch sees one, else cpu
    seed: int = 0
    # Some request will carry a reply grammar (a task decodes constrained) or a top-k/top-p filter: vllm then
    # gets its logits processor, and without it refuses both. The hf engine always takes them.
    grammar: bool = False
    max_model_len: int | None = None
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    tensor_model_parallel_size: int = 1
    free_cache_engine: bool = True
    # The hf engine's budget for the keys and values it keeps (grl/engines/prefix_store.py); None: unbounded.
    kv_cache_gb: float | None = None

    def resolved_device(self) -> str:
        import torch

        return self.device or ("cuda" if torch.cuda.is_available() else "cpu")


def check_prompts(prompt_token_ids, caller: str = "generate") -> None:
    for i, prompt in enumerate(prompt_token_ids):
        if len(prompt) == 0:
            raise ValueError(f"{caller}: prompt {i} is empty")


def check_request(prompt_token_ids, constraints) -> list:
    """What every engine checks of a generate call: no prompt is empty, one grammar (or None: free decoding)
    per prompt. -> the grammars, one per prompt."""
    check_prompts(prompt_token_ids)
    if constraints is None:
        return [None] * len(prompt_token_ids)
    if len(constraints) != len(prompt_token_ids):
        raise ValueError(f"generate: {len(constraints)} constraints for {len(prompt_token_ids)} prompts")
    return list(constraints)


def unsampled(prompt_token_ids, sampling: SamplingParams) -> list[GenerationOutput] | None:
    """The replies of a request with no token to sample (max_new_tokens <= 0): empty, cut by length, with no
    model call (vLLM refuses max_tokens < 1). None when there are tokens to sample."""
    if sampling.max_new_tokens > 0:
        return None
    return [GenerationOutput([], [] if sampling.logprobs else None, "length") for _ in prompt_token_ids]


NamedTensors = Iterable[tuple[str, "torch.Tensor"]] | Mapping[str, "torch.Tensor"]  # noqa: F821


class Engine:
    """A generation backend: `generate`, `update_weights`, `sleep`/`wake`. A registered engine
    (grl/engines/__init__.py) is built by `build`."""

    @classmethod
    def build(cls, model_path: str, options: EngineOptions) -> Engine:
        """`make_engine`'s builder (`model_path`: a local folder): this class, in the calling process."""
        return cls(model_path, options)

    def generate(
        self, prompt_token_ids: list[list[int]], sampling: SamplingParams, constraints: list | None = None
    ) -> list[GenerationOutput]:
        """`constraints`: one `grl.engines.constraint.ReplyGrammar` (or None: free decoding) per
        prompt. Log-probs are those of the distribution each token was drawn from: temperature,
        top-k/top-p and the grammar's mask applied; with top-k/top-p each token's kept set comes too."""
        raise NotImplementedError

    def prompt_log_probs(self, prompt_token_ids: list[list[int]]) -> list[list[float]]:
        """Each prompt scored by the model as it stands: for prompt p, log p(p[t] | p[:t]) for t = 1 ..
        len(p) - 1 (one float fewer than the prompt's tokens), under the plain softmax of the logits in fp32:
        temperature 1, no top-k/top-p, no grammar. A served teacher's scores of a student's episode
        (OpenAI completions with `echo` and `max_tokens: 0`, grl/gateway/scoring.py)."""
        raise NotImplementedError(f"{type(self).__name__} does not score prompts (prompt_log_probs)")

    def rows_within(self, row_tokens: int) -> int | None:
        """How many rows of up to `row_tokens` tokens the engine's cache holds at once, so that a rollout
        runs no more (the rest wait); None: the engine schedules its own (vLLM) or has no bound."""
        return None

    def context_length(self) -> int | None:
        """The most tokens one sequence (prompt and reply) may hold here: the model's context, or the
        `max_model_len` the engine was built with. None where the engine cannot tell (the trainer's
        handles on engines in other processes: their run's lengths bound them)."""
        return None

    def update_weights(self, named_tensors: NamedTensors) -> None:
        """Load new weights in place (no disk). A name or shape mismatch raises
        and leaves the old weights."""
        raise NotImplementedError

    def weights_digest(self) -> dict:
        """The weights it samples with, as `grl.engines.weights.check_sync` reads them: each of its tensors
        -> (the trainer's names it holds, its `tensor_digest`), computed where the weights are."""
        raise NotImplementedError

    def sleep(self, discard_weights: bool = False) -> None:
        """Free accelerator memory (weights and KV cache) until `wake`. `discard_weights`: the
        caller's next call is `update_weights` with every weight, so they need not be kept."""

    def wake(self) -> None:
        """Take back the memory `sleep` freed."""

    def shutdown(self) -> None:
        """Release the engine's processes and memory."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the OS reports one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def engine_cpu_threads(cores: int | None = None) -> int:
    """Threads of a CPU engine that runs beside the update: half of `cores` (this process's, by default),
    at least one; the update's ranks keep the rest."""
    return max(1, (usable_cores() if cores is None else cores) // 2)
