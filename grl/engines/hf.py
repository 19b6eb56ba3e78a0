"""Hugging Face engine: a batched decoding loop over a transformers model.

The loop is written out instead of calling `model.generate` because the
trainer needs three things `generate` does not give together: one random
generator per request (reproducible groups), the raw model log-prob of each
sampled token (temperature 1, no top-k/top-p), and stop strings that cut the
response right after the token that completes them.

Prompts are left-padded so that every row's next token sits in the last
column; the KV cache makes each step one token per row.
"""

from __future__ import annotations

from grl.engines.base import Engine, GenerationOutput, NamedTensors, SamplingParams
from grl.engines.weights import check_named_tensors, weight_spec


def filter_logits(logits, temperature: float, top_k: int, top_p: float):
    """Scale by temperature and mask (-inf) what top-k and top-p exclude.
    logits: float [B, V]. Top-p keeps the smallest set of most likely tokens
    whose probability reaches top_p (always at least one)."""
    import torch

    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # probability of the tokens ranked above
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def _check_prompts(prompt_token_ids) -> None:
    for i, prompt in enumerate(prompt_token_ids):
        if len(prompt) == 0:
            raise ValueError(f"generate: prompt {i} is empty")


class HFEngine(Engine):
    """Batched generation with a transformers causal LM on CPU or GPU."""

    def __init__(self, model_path: str, *, dtype: str = "auto", device: str | None = None, seed: int = 0,
                 max_batch_size: int = 64):
        import torch

        from grl.models import load_causal_lm, load_tokenizer

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.model = load_causal_lm(model_path, dtype, self.device).to(self.device).eval()
        self.tokenizer = load_tokenizer(model_path)
        self.pad_token_id = self.tokenizer.pad_token_id
        self.eos_token_ids = self._eos_ids()
        self.max_batch_size = max_batch_size
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.spec = weight_spec(self.model)
        self.asleep = False

    def _eos_ids(self) -> set[int]:
        configured = self.model.generation_config.eos_token_id
        ids = set(configured if isinstance(configured, (list, tuple)) else [configured])
        ids.add(self.tokenizer.eos_token_id)
        return {int(i) for i in ids if i is not None}

    # ------------------------------------------------------------------ generate

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[GenerationOutput]:
        import torch

        _check_prompts(prompt_token_ids)
        if self.asleep:
            self.wake()
        if sampling.max_new_tokens <= 0:
            return [GenerationOutput([], [] if sampling.logprobs else None, "length") for _ in prompt_token_ids]
        generators = None
        if sampling.seed is not None and not sampling.is_greedy:
            generators = [torch.Generator(device=self.device).manual_seed(sampling.seed + i)
                          for i in range(len(prompt_token_ids))]
        # Similar lengths share a chunk so that little compute goes to padding.
        order = sorted(range(len(prompt_token_ids)), key=lambda i: len(prompt_token_ids[i]))
        outputs: list[GenerationOutput | None] = [None] * len(prompt_token_ids)
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start:start + self.max_batch_size]
            chunk_generators = [generators[i] for i in chunk] if generators else None
            results = self._generate_chunk([prompt_token_ids[i] for i in chunk], sampling, chunk_generators)
            for i, result in zip(chunk, results):
                outputs[i] = result
        return outputs

    def _generate_chunk(self, prompts, sampling: SamplingParams, generators) -> list[GenerationOutput]:
        import torch
        from transformers import DynamicCache

        batch, width = len(prompts), max(len(p) for p in prompts)
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((batch, width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            attention_mask[row, width - len(prompt):] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)

        stop_ids = set(sampling.stop_token_ids) | (set() if sampling.ignore_eos else self.eos_token_ids)
        tokens: list[list[int]] = [[] for _ in range(batch)]
        log_probs: list[list[float]] = [[] for _ in range(batch)]
        finish: list[str | None] = [None] * batch
        cache = DynamicCache(config=self.model.config)
        step_ids = input_ids
        with torch.inference_mode():
            for step in range(sampling.max_new_tokens):
                out = self.model(input_ids=step_ids, attention_mask=attention_mask, position_ids=position_ids,
                                 past_key_values=cache, use_cache=True, logits_to_keep=1)
                logits = out.logits[:, -1, :].float()
                chosen = self._choose(logits, sampling, generators)
                chosen_log_probs = logits.log_softmax(-1).gather(-1, chosen[:, None])[:, 0]
                for row, (token, log_prob) in enumerate(zip(chosen.tolist(), chosen_log_probs.tolist())):
                    if finish[row] is not None:
                        continue
                    tokens[row].append(token)
                    log_probs[row].append(log_prob)
                    if token in stop_ids or self._hit_stop_string(tokens[row], sampling.stop):
                        finish[row] = "stop"
                if all(f is not None for f in finish):
                    break
                # Finished rows keep decoding padding; their extra tokens are never read.
                step_ids = torch.where(torch.tensor([f is None for f in finish], device=self.device),
                                       chosen, self.pad_token_id)[:, None]
                attention_mask = torch.cat([attention_mask, attention_mask.new_ones((batch, 1))], dim=-1)
                position_ids = position_ids[:, -1:] + 1
        return [GenerationOutput(tokens[row], log_probs[row] if sampling.logprobs else None,
                                 finish[row] or "length") for row in range(batch)]

    def _choose(self, logits, sampling: SamplingParams, generators):
        import torch

        if sampling.is_greedy:
            return logits.argmax(-1)
        probs = filter_logits(logits, sampling.temperature, sampling.top_k, sampling.top_p).softmax(-1)
        if generators is None:
            return torch.multinomial(probs, 1, generator=self.generator)[:, 0]
        return torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators)])

    def _hit_stop_string(self, tokens: list[int], stops: list[str]) -> bool:
        if not stops:
            return False
        # A stop string the newest token completed lies in the last few
        # tokens (each decodes to at least one character), so decode only
        # those: a full decode every step would be quadratic in the length.
        window = tokens[-(2 * max(len(s) for s in stops) + 8):]
        text = self.tokenizer.decode(window, skip_special_tokens=True)
        return any(s in text for s in stops)

    # ------------------------------------------------------------------ weights and memory

    def update_weights(self, named_tensors: NamedTensors) -> None:
        import torch

        checked = check_named_tensors(named_tensors, self.spec)
        if self.asleep:
            self.wake()
        params = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, tensor in checked:
                params[name].data.copy_(tensor)

    def sleep(self) -> None:
        """On GPU, park the weights in host memory and release the CUDA cache;
        on CPU there is no accelerator memory to give back."""
        import torch

        if self.asleep or not self.device.startswith("cuda"):
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
