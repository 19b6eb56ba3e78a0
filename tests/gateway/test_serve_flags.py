"""`grl serve --tool-parser` and `--chat-template`: a bad value stops it with one line before the model loads,
and a template file is the one the served prompts are rendered with, its calls parsed in the named family."""

import pytest

from grl.cli import _serve_args, main, serve_gateway
from tests.gateway.served import client, serve
from tests.gateway.templates import LLAMA31

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}]


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--tool-parser", "xml"], "grl serve: --tool-parser: 'xml' is not one of hermes, llama3_json, mistral, qwen3_coder"),
        (["--chat-template", "/nonexistent/t.jinja"], "grl serve: --chat-template: cannot read /nonexistent/t.jinja"),
        (["--chat-template", "BROKEN"], "grl serve: --chat-template: BROKEN does not render a user message"),
    ],
)
def test_a_bad_flag_stops_grl_serve_in_one_line(flags, says, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "BROKEN").write_text("{% for message in messages %}{{ message.content }")
    assert main(["serve", "tiny", "--engine", "hf", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(says) and err.count("\n") == 1, err


def test_a_template_file_and_a_tool_parser_are_served(tiny, tmp_path):
    tokenizer, engine = tiny
    path = tmp_path / "llama31.jinja"
    path.write_text(LLAMA31)
    args = _serve_args(["tiny", "--chat-template", str(path), "--tool-parser", "mistral", "--max-tokens", "40"])
    gateway = serve_gateway(args, engine=engine.engine)
    named = {"type": "function", "function": {"name": "weather"}}
    with serve(gateway) as base:
        reply = client(base).chat.completions.create(model="tiny", messages=QUESTION, tools=TOOLS, tool_choice=named)
    expected = tokenizer.apply_chat_template(
        QUESTION, tools=TOOLS, chat_template=LLAMA31, add_generation_prompt=True, tokenize=False
    )
    assert reply.model_extra["grl"]["prompt_token_ids"] == tokenizer(expected, add_special_tokens=False)["input_ids"]
    ids = reply.model_extra["grl"]["completion_token_ids"][0]
    assert tokenizer.decode(ids).startswith('[TOOL_CALLS][{"name": "weather"')  # the named family, not the template's
    assert reply.choices[0].message.tool_calls[0].function.name == "weather"
