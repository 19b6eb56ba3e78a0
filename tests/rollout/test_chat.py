"""Chat-template arithmetic on the real (SmolLM2) tokenizer."""

import pytest

from grl.rollout.chat import ChatTokens, truncate_prompt


@pytest.fixture(scope="module")
def chat(tokenizer):
    return ChatTokens(tokenizer)


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Go."}]


def test_first_prompt_is_the_rendered_template(chat):
    ids = chat.first_prompt(MESSAGES)
    text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nGo.<|im_end|>\n<|im_start|>assistant\n"
    assert chat.tokenizer.decode(ids) == text
    assert chat.system_prefix_length(MESSAGES, ids) == len(
        chat.encode("<|im_start|>system\nBe brief.<|im_end|>\n")
    )
    assert chat.system_prefix_length(MESSAGES[1:], chat.first_prompt(MESSAGES[1:])) == 0


def test_turn_delta_closes_the_turn_only_when_the_engine_did_not(chat):
    after = MESSAGES + [
        {"role": "assistant", "content": "a reply that is never re-encoded"},
        {"role": "user", "content": "State 2"},
    ]
    im_end = chat.tokenizer.convert_tokens_to_ids("<|im_end|>")
    tail = "\n<|im_start|>user\nState 2<|im_end|>\n<|im_start|>assistant\n"
    stopped = chat.turn_delta(after, last_sampled_id=im_end)
    assert chat.tokenizer.decode(stopped) == tail
    cut_off = chat.turn_delta(after, last_sampled_id=42)
    assert cut_off == [im_end] + stopped
    # The full conversation is exactly prompt + reply + delta when the reply tokenises cleanly.
    reply_ids = chat.encode("a reply that is never re-encoded") + [im_end]
    rebuilt = chat.first_prompt(MESSAGES) + reply_ids + stopped
    assert rebuilt == chat.first_prompt(after)


def test_truncate_keeps_the_system_prefix():
    ids = list(range(20))
    assert truncate_prompt(ids, 25, 4) == ids
    assert truncate_prompt(ids, 10, 4) == [0, 1, 2, 3] + list(range(14, 20))
    assert truncate_prompt(ids, 3, 4) == [17, 18, 19]  # the prefix alone does not fit
    assert truncate_prompt(ids, 10, 4, "right") == list(range(10))
    with pytest.raises(ValueError, match="max_prompt_length"):
        truncate_prompt(ids, 10, 4, "error")
