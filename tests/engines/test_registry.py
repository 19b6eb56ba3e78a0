"""The engine registry: a new engine is one class (here, in this file) and one `register` line; the
name is then a choice of `make_engine` and `pick_engine_name`, and what it builds really generates."""

import pytest
import torch

from grl.engines import (
    ENGINES,
    Engine,
    EngineOptions,
    GenerationOutput,
    SamplingParams,
    engine_names,
    make_engine,
    register,
)


class GreedyLoopEngine(Engine):
    """The plainest engine there is: the whole sequence through the model for every new token,
    greedy only, no cache and no batching."""

    def __init__(self, model_path: str, options: EngineOptions):
        from grl.models import load_causal_lm, load_tokenizer

        self.model = load_causal_lm(model_path, options.dtype, "cpu").eval()
        self.eos = load_tokenizer(model_path).eos_token_id

    def generate(self, prompt_token_ids, sampling, constraints=None):
        assert sampling.is_greedy and constraints is None
        outputs = []
        for prompt in prompt_token_ids:
            ids, log_probs, reason = list(prompt), [], "length"
            with torch.no_grad():
                for _ in range(sampling.max_new_tokens):
                    logits = self.model(torch.tensor([ids])).logits[0, -1].float().log_softmax(-1)
                    token = int(logits.argmax())
                    ids.append(token)
                    log_probs.append(float(logits[token]))
                    if token == self.eos:
                        reason = "stop"
                        break
            outputs.append(GenerationOutput(ids[len(prompt) :], log_probs, reason))
        return outputs

    def update_weights(self, named_tensors):
        self.model.load_state_dict(dict(named_tensors), strict=False)


@pytest.fixture
def greedy_loop():
    register("greedy_loop", GreedyLoopEngine)
    yield
    del ENGINES["greedy_loop"]


def test_a_registered_engine_is_a_choice_and_generates_as_the_hf_engine_does(greedy_loop, hf_tiny, prompts):
    assert "greedy_loop" in engine_names()
    engine = make_engine("greedy_loop", "tiny", dtype="float32")
    greedy = SamplingParams(temperature=0.0, greedy=True, max_new_tokens=6)
    got, want = engine.generate(prompts[:3], greedy), hf_tiny.generate(prompts[:3], greedy)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for mine, theirs in zip(got, want):
        assert max(abs(a - b) for a, b in zip(mine.log_probs, theirs.log_probs)) < 1e-4


def test_the_config_takes_an_engine_once_it_is_registered(greedy_loop):
    from grl.config import load_config

    assert (
        load_config(["actor_rollout_ref.rollout.name=greedy_loop"]).actor_rollout_ref.rollout.name
        == "greedy_loop"
    )


def test_an_unregistered_engine_name_is_refused_by_the_config_naming_the_choices():
    from grl.config import ConfigError, load_config

    assert "greedy_loop" not in engine_names()
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.rollout.name: .*greedy_loop.*auto, hf, vllm"):
        load_config(["actor_rollout_ref.rollout.name=greedy_loop"])


def test_an_option_no_engine_has_is_refused_before_an_engine_is_built():
    with pytest.raises(TypeError, match="max_batch"):
        make_engine("hf", "tiny", max_batch=8)
