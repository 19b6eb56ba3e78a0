"""What agent programs send, through the real `openai` client to the served gateway and the tiny model:
streamed
calls, log-probs, stop strings, retries, a changed tool list, interleaved sub-agents, an episode longer than
the context, a reply cut at max_tokens continued under Qwen3's template, an episode read back; and the fields
the gateway cannot honour refused in one line."""

import httpx
import pytest

from grl.gateway import Gateway
from grl.rollout.batch import episode_tokens
from grl.rollout.chat import ChatTokens
from grl.rollout.types import Episode
from tests.gateway.served import client, serve
from tests.gateway.templates import QWEN3, QWEN25

QUESTION = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "What is 2 + 3?"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "python",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
        },
    }
]


def grl_ids(response) -> dict:
    return response.model_extra["grl"]


def test_a_streamed_reply_is_the_unstreamed_one_and_records_the_same_ids(served):
    gateway, base = served
    plain = client(base).chat.completions.create(model="tiny", messages=QUESTION, max_tokens=8, temperature=0)
    stream = client(base, "/episodes/streamed/v1").chat.completions.create(
        model="tiny",
        messages=QUESTION,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    events = list(stream)
    pieces = [e.choices[0].delta.content for e in events if e.choices and e.choices[0].delta.content]
    assert "".join(pieces) == plain.choices[0].message.content
    ids = grl_ids(plain)["completion_token_ids"][0]
    assert len(pieces) > 1 and "".join(pieces) == gateway.tokenizer.decode(ids, skip_special_tokens=True)
    assert pieces[0] == gateway.tokenizer.decode(
        ids[:1], skip_special_tokens=True
    )  # the first sampled token's text
    assert [e.choices[0].finish_reason for e in events if e.choices][-1] == plain.choices[0].finish_reason
    last = events[-1]
    assert last.usage.completion_tokens == plain.usage.completion_tokens
    recorded = gateway.episodes["streamed"].calls[0]
    assert (
        grl_ids(last)["completion_token_ids"]
        == [recorded.completion_ids]
        == grl_ids(plain)["completion_token_ids"]
    )


def test_logprobs_are_the_sampled_tokens_own(served):
    _, base = served
    response = client(base).chat.completions.create(
        model="tiny", messages=QUESTION, max_tokens=6, temperature=1.0, seed=1, logprobs=True
    )
    entries = response.choices[0].logprobs.content
    assert [e.logprob for e in entries] == pytest.approx(grl_ids(response)["log_probs"][0])
    assert len(entries) == len(grl_ids(response)["completion_token_ids"][0])
    assert (
        client(base)
        .chat.completions.create(model="tiny", messages=QUESTION, max_tokens=2)
        .choices[0]
        .logprobs
        is None
    )


def test_a_stop_string_ends_the_reply_and_is_not_returned(served):
    gateway, base = served
    talk = client(base)
    ask = {
        "model": "tiny",
        "messages": QUESTION,
        "max_tokens": 16,
        "temperature": 1.0,
        "seed": 7,
    }  # seeded: the same tokens
    whole = talk.chat.completions.create(**ask).choices[0].message.content
    stop = whole[len(whole) // 2 : len(whole) // 2 + 3]
    assert len(stop) == 3 and stop.strip()
    cut = talk.chat.completions.create(**ask, stop=[stop])
    assert (
        cut.choices[0].message.content == whole[: whole.index(stop)]
        and cut.choices[0].finish_reason == "stop"
    )
    assert stop in gateway.tokenizer.decode(
        grl_ids(cut)["completion_token_ids"][0]
    )  # the record keeps what was sampled


def test_a_retried_request_gets_the_recorded_reply_and_records_nothing(served):
    gateway, base = served
    talk = client(base, "/episodes/retried/v1")
    first = talk.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=8, temperature=1.0)
    again = talk.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=8, temperature=1.0)
    log = gateway.episodes["retried"]
    assert again.choices[0].message.content == first.choices[0].message.content
    assert grl_ids(again)["completion_token_ids"] == grl_ids(first)["completion_token_ids"]
    assert len(log.calls) == 1 and log.retries == 1 and log.prefix_breaks == 0
    talk.chat.completions.create(
        model="tiny", messages=QUESTION, max_tokens=8, temperature=1.0, seed=2
    )  # another sample
    assert len(log.calls) == 2 and log.retries == 1 and log.prefix_breaks == 1


def test_a_changed_tool_list_is_rendered_whole_and_counted(served):
    gateway, base = served
    talk = client(base, "/episodes/tools-changed/v1")
    first = talk.chat.completions.create(
        model="tiny", messages=QUESTION, tools=TOOLS, max_tokens=6, temperature=0
    )
    history = [
        *QUESTION,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "More?"},
    ]
    second = talk.chat.completions.create(
        model="tiny", messages=history, max_tokens=6, temperature=0
    )  # tools dropped
    log = gateway.episodes["tools-changed"]
    assert log.prefix_breaks == 1
    assert grl_ids(second)["prompt_token_ids"] == ChatTokens(
        gateway.tokenizer, {"chat_template": QWEN25}
    ).first_prompt(history)
    history = [
        *history,
        {"role": "assistant", "content": second.choices[0].message.content},
        {"role": "user", "content": "Go on."},
    ]
    talk.chat.completions.create(
        model="tiny", messages=history, tools=TOOLS, tool_choice="none", max_tokens=6
    )
    assert (
        log.calls[-1].parent == 1 and log.prefix_breaks == 1
    )  # tools not shown, as in the second call: it continues
    history = [
        *history,
        {"role": "assistant", "content": log.calls[-1].returned["content"]},
        {"role": "user", "content": "Use it."},
    ]
    talk.chat.completions.create(
        model="tiny", messages=history, tools=TOOLS, tool_choice="auto", max_tokens=6
    )
    assert log.calls[-1].parent is None and log.prefix_breaks == 2  # the tools are back in the system turn


def test_interleaved_sub_agents_each_continue_their_own_lineage(served):
    gateway, base = served
    talk = client(base, "/episodes/sub-agents/v1")
    planner = [{"role": "system", "content": "You plan."}, {"role": "user", "content": "Plan a sum."}]
    solver = [{"role": "system", "content": "You solve."}, {"role": "user", "content": "Solve 2 + 3."}]
    histories, responses = {"planner": planner, "solver": solver}, []
    for turn in range(3):
        for name in ("planner", "solver"):
            response = talk.chat.completions.create(
                model="tiny", messages=histories[name], max_tokens=5, temperature=1.0, seed=turn
            )
            responses.append(response)
            reply = {"role": "assistant", "content": response.choices[0].message.content}
            histories[name] = [*histories[name], reply, {"role": "user", "content": f"Go on ({turn})."}]
    log = gateway.episodes["sub-agents"]
    assert [c.parent for c in log.calls] == [None, None, 0, 1, 2, 3]
    assert (
        log.prefix_breaks == 1 and log.branches == 4
    )  # the solver's first call starts a sequence; each later call branches
    for call, before in zip(log.calls[2:], log.calls):  # each continues its own lineage's ids, untouched
        assert (
            call.prompt_ids[: len(before.prompt_ids) + len(before.completion_ids)]
            == before.prompt_ids + before.completion_ids
        )
    row = episode_tokens(Episode("program", 0, 0, log.turns(), score=0.0), use_turn_scores=False)
    trained = [t for t, m in zip(row.input_ids, row.loss_mask) if m]
    assert trained == [
        t for call in log.calls for t in call.completion_ids
    ]  # each sampled token trained once


def test_a_conversation_longer_than_the_context_is_cut_from_the_left(tiny):
    tokenizer, engine = tiny
    gateway = Gateway(engine, tokenizer, "tiny", max_tokens=8, context=96)
    long = [QUESTION[0], {"role": "user", "content": "word " * 200}]
    with serve(gateway) as base:
        response = client(base, "/episodes/long/v1").chat.completions.create(
            model="tiny", messages=long, max_tokens=8, temperature=0
        )
        refused = httpx.post(
            f"{base}/v1/chat/completions",
            json={"messages": long, "max_tokens": 96, "model": "tiny"},
            timeout=60,
        )
    prompt = grl_ids(response)["prompt_token_ids"]
    whole = ChatTokens(tokenizer).first_prompt(long)
    system = ChatTokens(tokenizer).system_prefix_length(long, whole)
    assert len(prompt) == 96 - 8 and prompt == whole[:system] + whole[len(whole) - (88 - system) :]
    assert gateway.episodes["long"].truncations == 1
    assert (
        refused.status_code == 400 and "exceed the context of 96" in refused.json()["error"]["message"]
    )  # no room for the reply
    strict = Gateway(engine, tokenizer, "tiny", max_tokens=8, context=96, truncation="error")
    with serve(strict) as base:
        response = httpx.post(
            f"{base}/v1/chat/completions",
            json={"messages": long, "max_tokens": 8, "model": "tiny"},
            timeout=60,
        )
    assert response.status_code == 400


def test_a_reply_cut_at_max_tokens_is_closed_before_the_next_turn_under_qwen3(tiny):
    tokenizer, engine = tiny
    gateway = Gateway(engine, tokenizer, "tiny", max_tokens=16, context=2048, chat_template=QWEN3)
    gateway.template_kwargs["enable_thinking"] = False
    with serve(gateway) as base:
        talk = client(base, "/episodes/cut/v1")
        first = talk.chat.completions.create(
            model="tiny", messages=QUESTION, max_tokens=3, temperature=1.0, seed=5
        )
        history = [
            *QUESTION,
            {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And?"},
        ]
        second = talk.chat.completions.create(
            model="tiny", messages=history, max_tokens=3, temperature=1.0, seed=6
        )
    assert first.choices[0].finish_reason == "length"
    one, two = grl_ids(first), grl_ids(second)
    assert tokenizer.decode(one["prompt_token_ids"]).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    seen = one["prompt_token_ids"] + one["completion_token_ids"][0]
    assert two["prompt_token_ids"][: len(seen)] == seen
    between = "<|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert tokenizer.decode(two["prompt_token_ids"][len(seen) :]) == between


@pytest.mark.parametrize(
    "change, status, says",
    [
        (
            {"tools": TOOLS, "tool_choice": "required"},
            400,
            "tool_choice: no tool call fits in 2 reply tokens",
        ),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "python"}}},
            400,
            "tool_choice: no tool",
        ),
        ({"tool_choice": "required"}, 400, "tool_choice: 'required' needs a non-empty tools list"),
        (
            {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "bash"}}},
            400,
            "tool_choice: function 'bash'",
        ),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, 400, "response_format: only"),
        ({"response_format": {"type": "text"}}, 200, None),
        ({"parallel_tool_calls": False, "tools": TOOLS}, 200, None),
    ],
)
def test_tool_choice_and_response_format_are_honoured_or_refused(served, change, status, says):
    _, base = served
    response = httpx.post(
        f"{base}/v1/chat/completions",
        json={"model": "tiny", "messages": QUESTION, "max_tokens": 2, **change},
        timeout=60,
    )
    assert response.status_code == status, response.text
    if says is not None:
        assert response.json()["error"]["message"].startswith(says)


def test_grl_serve_reads_an_episode_back_frees_it_and_keeps_a_bounded_record(tiny):
    tokenizer, engine = tiny
    gateway = Gateway(engine, tokenizer, "tiny", max_tokens=4, context=2048, max_open_episodes=2)
    with serve(gateway) as base:
        reply = client(base, "/episodes/kept/v1").chat.completions.create(
            model="tiny", messages=QUESTION, max_tokens=4
        )
        record = httpx.get(f"{base}/episodes/kept", timeout=60).json()
        assert len(record["calls"]) == 1 and record["calls"][0]["messages"] == QUESTION
        assert record["calls"][0]["completion_token_ids"] == grl_ids(reply)["completion_token_ids"][0]
        assert record["calls"][0]["prompt_token_ids"] == grl_ids(reply)["prompt_token_ids"]
        assert (
            httpx.delete(f"{base}/episodes/kept", timeout=60).json() == record
            and "kept" not in gateway.episodes
        )
        for name in ("one", "two", "three"):
            client(base, f"/episodes/{name}/v1").chat.completions.create(
                model="tiny", messages=QUESTION, max_tokens=2
            )
        assert list(gateway.episodes) == ["two", "three"] and gateway.evicted_episodes == 1
        gone = httpx.get(f"{base}/episodes/one", timeout=60)
    assert gone.status_code == 400 and gone.json()["error"]["message"].startswith(
        "episode 'one': not recorded"
    )
