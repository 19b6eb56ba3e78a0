"""The gateway's HTTP servers: inside the trainer, uvicorn on a thread of this process, started and stopped
with the
`ProgramRunner` that owns it (`LocalServer`); `grl serve` (`serve_main`), which checks its flags, its port and
its model name, each in a second and one line, before it loads the model."""

from __future__ import annotations

import argparse
import errno
import socket
import sys
import threading
import time

START_TIMEOUT_S = 60


class LocalServer:
    """An ASGI app served by uvicorn on a thread of this process, on 127.0.0.1 and a free port."""

    def __init__(self, app, host: str = "127.0.0.1"):
        import uvicorn

        self._socket = listening_socket(host, 0)
        self.url = f"http://{host}:{self._socket.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="grl-gateway", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the gateway's HTTP server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` and listening (0: a free port), for uvicorn to serve on; ValueError
    with
    one line when the port is no port or cannot be had (taken, privileged, an unknown host)."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port: {port} is not a port; give one in 1-65535 (0: any free port)")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family)
    sock.setsockopt(
        socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
    )  # as uvicorn does: a restart right after a stop binds
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as err:
        sock.close()
        why = (
            "it is taken (another server listens there); pick another --port"
            if err.errno == errno.EADDRINUSE
            else err.strerror or err
        )
        raise ValueError(f"--host/--port: cannot listen on {host}:{port}: {why}") from None
    return sock


def serve_args(argv: list[str]) -> argparse.Namespace:
    from grl.toolcalls import FAMILIES

    parser = argparse.ArgumentParser(
        prog="grl serve", description="An OpenAI-compatible chat endpoint for a model."
    )
    parser.add_argument(
        "model", help="hub id, local folder (a checkpoint's hf_actor export), `embedded` or `tiny`"
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default: this machine only)"
    )
    parser.add_argument(
        "--port", type=int, default=8000, help="the port to listen on (0: any free one, printed)"
    )
    parser.add_argument("--engine", default="auto", help="auto, hf or vllm")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-tokens", type=int, default=1024, help="reply tokens when a request names none")
    parser.add_argument(
        "--tool-parser",
        help=f"the tool-call format: {', '.join(FAMILIES)} (default: read from the chat template)",
    )
    parser.add_argument(
        "--chat-template", help="a file holding the Jinja chat template to use instead of the tokenizer's"
    )
    return parser.parse_args(argv)


def serve_gateway(args: argparse.Namespace, engine=None):
    """The gateway `grl serve` answers with for `args` (on `engine` if given, else the model's), its context
    the
    engine's; a bad flag or model name raises ValueError with one line before the model is loaded."""
    from pathlib import Path

    from grl.engines import engine_names
    from grl.gateway import Gateway, SerialEngine
    from grl.models import ModelLoadError, check_model_name, load_tokenizer
    from grl.toolcalls import FAMILIES

    if args.engine not in engine_names():
        raise ValueError(f"--engine: {args.engine!r} is not one of {', '.join(engine_names())}")
    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens: {args.max_tokens} is not a positive count of tokens")
    if args.tool_parser is not None and args.tool_parser not in FAMILIES:
        raise ValueError(f"--tool-parser: {args.tool_parser!r} is not one of {', '.join(FAMILIES)}")
    template = None
    if args.chat_template is not None:
        try:
            template = Path(args.chat_template).read_text()
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"--chat-template: cannot read {args.chat_template}: {err}") from None
    try:
        check_model_name(args.model)
    except ModelLoadError as err:
        raise ValueError(f"model: {err}") from None
    tokenizer = load_tokenizer(args.model)
    if template is not None:
        try:
            hello = [{"role": "user", "content": "hello"}]
            tokenizer.apply_chat_template(
                hello, chat_template=template, tokenize=False, add_generation_prompt=True
            )
        except Exception as err:  # noqa: BLE001 - Jinja fails in many ways; the first line says which
            first = (str(err).splitlines() or [type(err).__name__])[0]
            raise ValueError(
                f"--chat-template: {args.chat_template} does not render a user message: {first}"
            ) from None
    if engine is None:
        from grl.engines import make_engine

        engine = make_engine(args.engine, args.model, dtype=args.dtype, grammar=True)
    gateway = Gateway(
        SerialEngine(engine),
        tokenizer,
        args.model,
        max_tokens=args.max_tokens,
        chat_template=template,
        tool_parser=args.tool_parser,
    )
    if args.max_tokens >= gateway.context:
        raise ValueError(
            f"--max-tokens: {args.max_tokens} leaves no room for a prompt in the model's "
            f"{gateway.context}-token context"
        )
    return gateway


def serve_main(argv: list[str]) -> int:
    """`grl serve`: the port is bound first and the model name checked, so that a mistake in either ends it at
    once, not after the model has loaded."""
    args = serve_args(argv)
    from grl.gateway import build_app
    from grl.models import ModelLoadError

    try:
        sock = listening_socket(args.host, args.port)
    except ValueError as err:
        print(f"grl serve: {err}", file=sys.stderr)
        return 2
    try:
        gateway = serve_gateway(args)
    except (ModelLoadError, ValueError) as err:
        sock.close()
        print(f"grl serve: {err}", file=sys.stderr)
        return 2
    import uvicorn

    host, port = sock.getsockname()[:2]
    print(
        f"grl serve: {args.model} at http://{host}:{port}/v1 (context {gateway.context} tokens)", flush=True
    )
    uvicorn.Server(uvicorn.Config(build_app(gateway), log_level="warning")).run(sockets=[sock])
    return 0
