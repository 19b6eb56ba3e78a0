"""Reply parsing: the documented rules, and totality on any string (hypothesis)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grl.agents.parse import parse_reply, split_actions


@pytest.mark.parametrize(
    "reply, think, answer",
    [
        ("<think>plan</think><answer>Up || Left</answer>", "plan", "Up || Left"),
        ("  <THINK> plan </Think>\n<Answer>  Up </ANSWER> trailing", "plan", "Up"),
        ("< think >a</ think >< answer >b</ answer >", "a", "b"),
        ("plan</think><answer>Up</answer>", "plan", "Up"),  # pre-filled <think>
        ("<think>plan<answer>Up</answer>", "plan", "Up"),  # unclosed think, closed by <answer>
        ("<think>plan</think><answer>Up || Down", "plan", "Up || Down"),  # unclosed answer runs to the end
        ("<think>plan</think><answer>Up || Down</ans", "plan", "Up || Down"),  # cut-off closing tag
        ("<think>try <answer>Up</answer>?</think><answer>Down</answer>", "try <answer>Up</answer>?", "Down"),
        ("<think>x</think><answer>A</answer><answer>B</answer>", "x", "A"),  # the first answer counts
    ],
)
def test_think_mode_rules(reply, think, answer):
    parsed = parse_reply(reply, enable_think=True)
    assert (parsed.think, parsed.answer, parsed.format_ok, parsed.error) == (think, answer, True, "")


@pytest.mark.parametrize(
    "reply",
    [
        "<answer>Up</answer>",  # think required
        "Up",  # no tags
        "<think>plan</think>",  # no answer
        "<think>plan</think><answer>   </answer>",  # empty answer
        "<think><answer>Up</answer></think>",  # the answer hides inside the think
        "",
    ],
)
def test_think_mode_format_errors(reply):
    parsed = parse_reply(reply, enable_think=True)
    assert not parsed.format_ok and parsed.answer is None and parsed.error


@pytest.mark.parametrize(
    "reply, answer",
    [
        ("<answer>42</answer>", "42"),
        ("Step 1: 6 * 7 = 42.\n<answer> 42 </answer>", "42"),
        ("<think>6*7</think><answer>42</answer>", "42"),
        ("<answer>42", "42"),
    ],
)
def test_answer_only_mode(reply, answer):
    parsed = parse_reply(reply, enable_think=False)
    assert parsed.format_ok and parsed.answer == answer


def test_answer_only_mode_still_needs_an_answer():
    assert not parse_reply("the answer is 42", enable_think=False).format_ok


def test_split_actions():
    assert split_actions("Up || Left||Down ||", "||") == ["Up", "Left", "Down"]
    assert split_actions(" Up ||  || Down", "||") == ["Up", "Down"]
    assert split_actions("SELECT a || b FROM t", None) == ["SELECT a || b FROM t"]
    assert split_actions("   ", "||") == [] and split_actions(None, "||") == []


# Tag-heavy strings: pieces of tags glued together find the edge cases faster than plain text.
pieces = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<answer>",
        "</answer>",
        "< /Answer",
        "<",
        ">",
        "/",
        "||",
        " ",
        "\n",
        "Up",
        "think",
        "answer",
        "x",
        "\u0130",
        "\x00",
    ]
)
tag_soup = st.lists(pieces, max_size=30).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(), tag_soup), st.booleans(), st.sampled_from(["||", ",", None, ""]))
def test_parsing_never_raises(reply, enable_think, separator):
    parsed = parse_reply(reply, enable_think)
    assert parsed.format_ok == (parsed.answer is not None)
    assert parsed.answer is None or parsed.answer == parsed.answer.strip() != ""
    for action in split_actions(parsed.answer, separator):
        assert action and action == action.strip()


tagless = st.text().filter(lambda s: "<" not in s and s.strip())


@settings(max_examples=200, deadline=None)
@given(tagless, tagless)
def test_well_formed_replies_round_trip(think, answer):
    parsed = parse_reply(f"<think>{think}</think><answer>{answer}</answer>", enable_think=True)
    assert (parsed.think, parsed.answer, parsed.format_ok) == (think.strip(), answer.strip(), True)
