"""Hugging Face engine: a batched decoding loop over a transformers model.

The loop is written out instead of calling `model.generate` because the
trainer needs four things `generate` does not give together: one random
generator per request (reproducible groups), the log-prob of each sampled
token under the distribution it was drawn from (temperature, top-k/top-p and
the valid-action grammar applied), stop strings that cut the response right
after the token that completes them, and a per-request grammar
(grl/engines/constraint.py).

Prompts are left-padded so that every row's next token sits in the last
column; the KV cache makes each step one token per row.

Prefix reuse: a multi-turn episode's prompt at turn k+1 starts with its prompt
and reply of turn k, so the engine keeps the KV cache of every sequence of the
last call and, for a prompt that extends one of them, computes only the new
tokens (the template and environment tokens of the turn). A row is laid out as
[padding | cached prefix | padding | new tokens]; the attention mask and the
position ids make the holes invisible. New weights drop the cache, and so does sleep. Within a call,
a prompt that several rows share (a GRPO group's) is run once and reused the same way. The kept sequences
and a call's working cache stay within the engine's `kv_cache_gb` (grl/engines/prefix_store.py).
"""

from __future__ import annotations

from collections import Counter

import torch

from grl.engines import cpu_attention
from grl.engines.base import Engine, EngineOptions, GenerationOutput, NamedTensors, SamplingParams
from grl.engines.base import check_prompts, check_request, unsampled
from grl.engines.constraint import ReplyGrammar
from grl.engines.hf_decoding import choose, constrain, replies, take_forced
from grl.engines.hf_scoring import prompt_log_probs
from grl.engines.host_memory import TRIM_SLACK_BYTES, release_freed_host_memory
from grl.engines.kept_sets import filters
from grl.engines.kv_slab import prefix_slab
from grl.engines.prefix_store import CHUNK_ROWS, GIB, STORE_SHARE, PrefixStore, kv_token_bytes, rows_within
from grl.engines.weights import check_named_tensors, module_digests, weight_spec

# Cache columns set aside for a call's reply tokens; a longer reply grows the cache (grl/engines/kv_slab.py),
# so a free reply of max_new_tokens=4096 does not reserve 4096 columns a row it may never use.
REPLY_RESERVE = 64


class HFEngine(Engine):
    """Batched generation with a transformers causal LM on CPU or GPU. Of the options it reads dtype, device,
    seed and kv_cache_gb: vLLM's memory and parallelism mean nothing here, and it always takes a grammar."""

    def __init__(
        self,
        model_path: str,
        options: EngineOptions = EngineOptions(),
        *,
        max_batch_size: int = CHUNK_ROWS,
        reuse_prefixes: bool = True,
    ):
        from grl.models import load_causal_lm, load_tokenizer

        self.device = options.resolved_device()
        self.model = load_causal_lm(model_path, options.dtype, self.device).to(self.device).eval()
        cpu_attention.use_on(self.model)
        self.tokenizer = load_tokenizer(model_path)
        self.pad_token_id = self.tokenizer.pad_token_id
        self.eos_token_ids = self._eos_ids()
        self.max_batch_size = max_batch_size
        self.generator = torch.Generator(device=self.device).manual_seed(options.seed)
        self.spec = weight_spec(self.model)
        self.asleep = False
        text = self.model.config.get_text_config()
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
        element = next(self.model.parameters()).element_size()
        kv_width = text.num_key_value_heads * head_dim
        self.token_bytes = kv_token_bytes(text.num_hidden_layers, kv_width, element)
        self.kv_cache_gb = options.kv_cache_gb
        budget = None if options.kv_cache_gb is None else int(options.kv_cache_gb * GIB)
        # The sequences of the last calls, token ids -> per-layer (keys, values) `[heads, len(ids), dim]`
        self.prefixes = PrefixStore(budget)
        # Off: every prompt is prefilled whole (the benchmark's baseline).
        self.reuse_prefixes = reuse_prefixes

    def context_length(self) -> int | None:
        from grl.models import config_context

        return config_context(self.model.config)

    def rows_within(self, row_tokens: int) -> int | None:
        return rows_within(self.kv_cache_gb, row_tokens, self.token_bytes)

    def _eos_ids(self) -> set[int]:
        configured = self.model.generation_config.eos_token_id
        ids = set(configured if isinstance(configured, (list, tuple)) else [configured])
        ids.add(self.tokenizer.eos_token_id)
        return {int(i) for i in ids if i is not None}

    # ------------------------------------------------------------------ generate

    def generate(
        self,
        prompt_token_ids: list[list[int]],
        sampling: SamplingParams,
        constraints: list[ReplyGrammar | None] | None = None,
    ) -> list[GenerationOutput]:
        constraints = check_request(prompt_token_ids, constraints)
        if self.asleep:
            self.wake()
        if (empty := unsampled(prompt_token_ids, sampling)) is not None:
            return empty
        generators = None
        if sampling.seed_of(0) is not None and not sampling.is_greedy:
            generators = [
                torch.Generator(device=self.device).manual_seed(sampling.seed_of(i))
                for i in range(len(prompt_token_ids))
            ]
        outputs: list[GenerationOutput | None] = [None] * len(prompt_token_ids)
        hits = self.prefixes.begin(prompt_token_ids if self.reuse_prefixes else [])
        hits = hits or [()] * len(prompt_token_ids)
        for chunk in self._chunks(prompt_token_ids, hits, min(sampling.max_new_tokens, REPLY_RESERVE)):
            chunk_generators = [generators[i] for i in chunk] if generators else None
            results = self._generate_chunk(
                [prompt_token_ids[i] for i in chunk],
                sampling,
                chunk_generators,
                [constraints[i] for i in chunk],
                [hits[i] for i in chunk],
            )
            for i, result in zip(chunk, results):
                outputs[i] = result
            if self.device == "cpu":  # a chunk's cache is freed: the next chunk's sizes differ
                release_freed_host_memory(TRIM_SLACK_BYTES)
        self.prefixes.end()
        return outputs

    def prompt_log_probs(self, prompt_token_ids: list[list[int]]) -> list[list[float]]:
        """A forward pass of its own (grl/engines/hf_scoring.py): generate's prefix cache is left as it is."""
        check_prompts(prompt_token_ids, "prompt_log_probs")
        if self.asleep:
            self.wake()
        return prompt_log_probs(self, prompt_token_ids)

    def _chunks(self, prompts: list[list[int]], hits: list[tuple[int, ...]], room: int) -> list[list[int]]:
        """Row indices in chunks of at most `max_batch_size` whose working cache (their cached prefixes,
        new tokens and `room` reply columns a row) fits the budget's share for it, similar lengths together
        so that little compute goes to padding. A row with no cached prefix (its first turn, or a prompt cut
        to max_prompt_length) runs its whole prompt, and every row of its chunk would pad its new tokens to
        that width: such rows get chunks of their own."""
        working = None if self.kv_cache_gb is None else self.kv_cache_gb * GIB * (1 - STORE_SHARE)
        chunks = []
        for cached in (True, False):
            rows = [i for i in range(len(hits)) if bool(hits[i]) == cached]
            order = sorted(rows, key=lambda i: len(prompts[i]))
            chunk, past, width = [], 0, 0
            for i in order:
                grown = max(past, len(hits[i])), max(width, len(prompts[i]) - len(hits[i]))
                columns = grown[0] + grown[1] + room
                full = len(chunk) == self.max_batch_size or (
                    working is not None and (len(chunk) + 1) * columns * self.token_bytes > working
                )
                if chunk and full:
                    chunks.append(chunk)
                    chunk, grown = [], (len(hits[i]), len(prompts[i]) - len(hits[i]))
                chunk.append(i)
                past, width = grown
            chunks += [chunk] if chunk else []
        return chunks

    def _generate_chunk(
        self, prompts, sampling: SamplingParams, generators, constraints, hits
    ) -> list[GenerationOutput]:
        batch = len(prompts)
        tokens: list[list[int]] = [[] for _ in range(batch)]
        log_probs: list[list[float]] = [[] for _ in range(batch)]
        kept = [{} for _ in range(batch)] if filters(sampling) else None  # reply position -> its kept set
        finish: list[str | None] = [None] * batch
        walkers = [c.walker() if c is not None else None for c in constraints]
        # Jump-forward: tokens a grammar forces (probability 1) need no sampling step. Those before the
        # first choice go into the prefill; a forced run that ends the reply ends it at once.
        for row, walker in enumerate(walkers):
            if walker is not None:
                take_forced(walker, tokens[row], log_probs[row], finish, row, sampling.max_new_tokens)
        # Every reply was forced whole (one valid action): no model call.
        if all(f is not None for f in finish):
            self.prefixes.done_with(hits)
            return replies(tokens, log_probs, kept, finish, sampling)
        prompts = [list(p) + t for p, t in zip(prompts, tokens)]
        if self.reuse_prefixes:
            self._prefill_shared(prompts)
        cached = [self.prefixes.longest(p) if self.reuse_prefixes else () for p in prompts]
        self.prefixes.extended.update(cached)
        input_ids, attention_mask, position_ids, past, width = self._layout(prompts, cached)

        stop_ids = set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else self.eos_token_ids)
        cache = self._prefill_cache(cached, past, width + min(sampling.max_new_tokens, REPLY_RESERVE))
        self.prefixes.done_with(hits)  # now in `cache`
        fed: list[list[int]] = [[] for _ in range(batch)]  # reply tokens run through the model, per row
        step_ids = input_ids
        with torch.inference_mode():
            for step in range(sampling.max_new_tokens):
                if all(f is not None for f in finish):
                    break
                logits = self._forward(step_ids, attention_mask, position_ids, cache)
                logits = constrain(logits, walkers, finish)
                chosen, chosen_log_probs, step_kept = choose(logits, sampling, generators, self.generator)
                for row, (token, log_prob) in enumerate(zip(chosen.tolist(), chosen_log_probs.tolist())):
                    if finish[row] is not None:
                        continue
                    tokens[row].append(token)
                    log_probs[row].append(log_prob)
                    if kept is not None:
                        kept[row][len(tokens[row]) - 1] = step_kept[row]
                    if walkers[row] is not None:
                        walkers[row].advance(token)
                    if token in stop_ids or self._hit_stop_string(tokens[row], sampling.stop):
                        finish[row] = "stop"
                    elif walkers[row] is not None:
                        take_forced(
                            walkers[row],
                            tokens[row],
                            log_probs[row],
                            finish,
                            row,
                            sampling.max_new_tokens,
                            only_to_the_end=True,
                        )
                    if finish[row] is None and len(tokens[row]) >= sampling.max_new_tokens:
                        finish[row] = "length"
                    if finish[row] is None:
                        fed[row].append(token)
                # Finished rows keep decoding padding; their extra tokens are never read.
                step_ids = torch.where(
                    torch.tensor([f is None for f in finish], device=self.device), chosen, self.pad_token_id
                )[:, None]
                attention_mask = torch.cat([attention_mask, attention_mask.new_ones((batch, 1))], dim=-1)
                position_ids = position_ids[:, -1:] + 1
        if self.reuse_prefixes:
            self._keep_prefixes(cache, prompts, cached, fed, past, width)
        return replies(tokens, log_probs, kept, finish, sampling)

    def _forward(self, input_ids, mask, positions, cache) -> torch.Tensor:
        """The model over `input_ids` after what `cache` holds (which takes their keys and values): the fp32
        logits of each row's next token."""
        cached = dict(past_key_values=cache, use_cache=True, logits_to_keep=1)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, **cached)
        return out.logits[:, -1, :].float()

    def _layout(self, prompts: list[list[int]], cached: list[tuple[int, ...]]):
        """-> (input_ids, attention_mask, position_ids, past, width): the rows' new tokens
        left-padded to `width` columns, after `past` columns of cached prefixes."""
        batch = len(prompts)
        past = max(len(c) for c in cached)  # width of the cached-prefix area
        width = max(len(p) - len(c) for p, c in zip(prompts, cached))  # width of the new-token area
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((batch, past + width), dtype=torch.long)
        position_ids = torch.zeros((batch, width), dtype=torch.long)
        for row, (prompt, prefix) in enumerate(zip(prompts, cached)):
            new = prompt[len(prefix) :]
            input_ids[row, width - len(new) :] = torch.tensor(new, dtype=torch.long)
            attention_mask[row, past - len(prefix) : past] = 1
            attention_mask[row, past + width - len(new) :] = 1
            position_ids[row, width - len(new) :] = torch.arange(len(prefix), len(prompt))
        return (
            input_ids.to(self.device),
            attention_mask.to(self.device),
            position_ids.to(self.device),
            past,
            width,
        )

    def _prefill_shared(self, prompts: list[list[int]]) -> None:
        """Run once what several rows begin with (a GRPO group asks G replies to one prompt): the
        prompts but their last token, into the reusable cache, so each row then computes one token."""
        counts = Counter(tuple(p[:-1]) for p in prompts)
        # (A cached sequence may equal the shared part itself: then there is nothing left to run.)
        found = [(list(ids), self.prefixes.longest(list(ids) + [-1])) for ids, n in counts.items() if n > 1]
        found = [(ids, prefix) for ids, prefix in found if len(ids) - len(prefix) > 1]
        if not found:
            return
        shared, cached = [ids for ids, _ in found], [prefix for _, prefix in found]
        self.prefixes.extended.update(cached)
        input_ids, attention_mask, position_ids, past, width = self._layout(shared, cached)
        cache = self._prefill_cache(cached, past, width)
        with torch.inference_mode():
            self._forward(input_ids, attention_mask, position_ids, cache)
        self._keep_prefixes(cache, shared, cached, [[] for _ in shared], past, width, now=True)

    def _prefill_cache(self, cached: list[tuple[int, ...]], past: int, room: int):
        """A cache holding each row's cached prefix, right-aligned in `past` columns, with `room` columns
        more for this call's tokens."""
        prefixes = [self.prefixes.last[ids] if ids else None for ids in cached]
        return prefix_slab(prefixes, past, room, self.model.config.get_text_config().num_hidden_layers)

    def _keep_prefixes(self, cache, prompts, cached, fed, past: int, width: int, now: bool = False) -> None:
        """Store every row's KV (its prompt and the reply tokens the model ran) for the next call
        (`now`: for this one)."""
        for row, (prompt, prefix) in enumerate(zip(prompts, cached)):
            new = len(prompt) - len(prefix)
            columns = torch.cat(
                [
                    torch.arange(past - len(prefix), past),
                    torch.arange(past + width - new, past + width + len(fed[row])),
                ]
            ).to(self.device)
            kv = [
                (layer.keys[row].index_select(1, columns), layer.values[row].index_select(1, columns))
                for layer in cache.layers
            ]
            self.prefixes.put(tuple(prompt + fed[row]), kv, now)

    def _hit_stop_string(self, tokens: list[int], stops: list[str]) -> bool:
        if not stops:
            return False
        # A stop string the newest token completed lies in the last few
        # tokens (each decodes to at least one character), so decode only
        # those: a full decode every step would be quadratic in the length.
        window = tokens[-(2 * max(len(s) for s in stops) + 8) :]
        text = self.tokenizer.decode(window, skip_special_tokens=True)
        return any(s in text for s in stops)

    # ------------------------------------------------------------------ weights and memory

    def update_weights(self, named_tensors: NamedTensors) -> None:
        checked = check_named_tensors(named_tensors, self.spec)
        self.prefixes.clear()  # computed with the old weights
        if self.asleep:
            self.wake()
        params = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, tensor in checked:
                params[name].data.copy_(tensor)

    def weights_digest(self) -> dict:
        return module_digests(self.model, self.spec)

    def sleep(self, discard_weights: bool = False) -> None:
        """Let the kept sequences go (the rollout is over; the update needs the memory); on GPU, also park
        the weights in host memory and release the CUDA cache. The weights are kept either way (a host copy is
        what update_weights writes into)."""
        self.prefixes.clear()
        if self.asleep or not self.device.startswith("cuda"):
            release_freed_host_memory()
            return
        self.model.to("cpu")
        torch.cuda.empty_cache()
        self.asleep = True

    def wake(self) -> None:
        if not self.asleep:
            return
        self.model.to(self.device)
        self.asleep = False

    def shutdown(self) -> None:
        self.sleep()
        self.model = None
