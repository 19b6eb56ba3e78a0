"""`grl serve`'s flags: a bad port, model name, `--tool-parser` or `--chat-template` stops it with one line
before
the model loads; its context is the engine's; a template file is the one the served prompts are rendered with,
its calls parsed in the named family."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grl.cli import main
from grl.gateway.serving import serve_args, serve_gateway
from tests.gateway.served import client, serve
from tests.gateway.templates import LLAMA31

ROOT = Path(__file__).resolve().parents[2]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
TOOLS = [
    {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}
]


@pytest.mark.parametrize(
    "flags, says",
    [
        (
            ["--tool-parser", "xml"],
            "grl serve: --tool-parser: 'xml' is not one of hermes, llama3_json, mistral, qwen3_coder",
        ),
        (
            ["--chat-template", "/nonexistent/t.jinja"],
            "grl serve: --chat-template: cannot read /nonexistent/t.jinja",
        ),
        (["--chat-template", "BROKEN"], "grl serve: --chat-template: BROKEN does not render a user message"),
    ],
)
def test_a_bad_flag_stops_grl_serve_in_one_line(flags, says, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "BROKEN").write_text("{% for message in messages %}{{ message.content }")
    assert main(["serve", "tiny", "--engine", "hf", "--port", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(says) and err.count("\n") == 1, err


def test_a_template_file_and_a_tool_parser_are_served(tiny, tmp_path):
    tokenizer, engine = tiny
    path = tmp_path / "llama31.jinja"
    path.write_text(LLAMA31)
    args = serve_args(
        ["tiny", "--chat-template", str(path), "--tool-parser", "mistral", "--max-tokens", "40"]
    )
    gateway = serve_gateway(args, engine=engine.engine)
    named = {"type": "function", "function": {"name": "weather"}}
    with serve(gateway) as base:
        reply = client(base).chat.completions.create(
            model="tiny", messages=QUESTION, tools=TOOLS, tool_choice=named
        )
    expected = tokenizer.apply_chat_template(
        QUESTION, tools=TOOLS, chat_template=LLAMA31, add_generation_prompt=True, tokenize=False
    )
    assert (
        reply.model_extra["grl"]["prompt_token_ids"]
        == tokenizer(expected, add_special_tokens=False)["input_ids"]
    )
    ids = reply.model_extra["grl"]["completion_token_ids"][0]
    assert tokenizer.decode(ids).startswith(
        '[TOOL_CALLS][{"name": "weather"'
    )  # the named family, not the template's
    assert reply.choices[0].message.tool_calls[0].function.name == "weather"


# Run `grl serve` in a child and report whether anything heavier than the flag and name checks was imported.
SERVE_AND_REPORT = """
import sys
from grl.cli import main
rc = main(sys.argv[1:])
print("loaded:", sorted(m for m in ("torch", "transformers", "vllm") if m in sys.modules))
sys.exit(rc)
"""


@pytest.fixture(scope="module")
def taken_port():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.mark.parametrize(
    "argv, says",
    [
        (["tiny", "--port", "99999"], "grl serve: --port: 99999 is not a port; give one in 1-65535"),
        (
            ["tiny", "--port", "TAKEN"],
            "grl serve: --host/--port: cannot listen on 127.0.0.1:TAKEN: it is taken",
        ),
        (
            ["/nonexistent", "--port", "0"],
            "grl serve: model: model path '/nonexistent' does not exist; give a local folder",
        ),
        (
            ["Qwen/Qwen2.5-0.5B-Instrct", "--port", "0"],
            "grl serve: model: 'Qwen/Qwen2.5-0.5B-Instrct' is not in the Hugging",
        ),
        (
            ["tiny", "--port", "0", "--engine", "vlm"],
            "grl serve: --engine: 'vlm' is not one of auto, hf, vllm",
        ),
    ],
    ids=["port-range", "port-taken", "no-folder", "hub-id-offline", "engine"],
)
def test_a_bad_port_or_model_stops_grl_serve_in_one_line_before_anything_loads(argv, says, taken_port):
    """Each ends in a second or so, loading neither torch nor transformers: the model would take many."""
    argv = [arg.replace("TAKEN", str(taken_port)) for arg in argv]
    child = subprocess.run(
        [sys.executable, "-c", SERVE_AND_REPORT, "serve", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    says = says.replace("TAKEN", str(taken_port))
    assert child.returncode == 2 and child.stderr.startswith(says) and child.stderr.count("\n") == 1, (
        child.stderr
    )
    assert child.stdout == "loaded: []\n", child.stdout


def test_grl_serve_takes_the_context_of_the_engine_that_serves(tiny):
    _, engine = tiny
    gateway = serve_gateway(serve_args(["tiny"]), engine=engine.engine)
    assert (
        gateway.context == engine.context_length() == 4096
    )  # the model's, not 32768 for its tokenizer's "no limit"
    with pytest.raises(
        ValueError, match="--max-tokens: 4096 leaves no room for a prompt in the model's 4096-token context"
    ):
        serve_gateway(serve_args(["tiny", "--max-tokens", "4096"]), engine=engine.engine)
