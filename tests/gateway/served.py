"""`serve`: a gateway served for real (uvicorn on 127.0.0.1, a free port) for the length of a `with`, and an
`openai` client of it."""

import contextlib
import socket
import threading
import time

import openai

from grl.gateway import build_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(gateway):
    """The gateway's base URL while it is served."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(build_app(gateway), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def client(base: str, path: str = "/v1"):
    return openai.OpenAI(base_url=base + path, api_key="unused", max_retries=0)
