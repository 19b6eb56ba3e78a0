"""The gateway's HTTP server inside the trainer: uvicorn on a thread of this process, started and stopped
with the `ProgramRunner` that owns it."""

from __future__ import annotations

import socket
import threading
import time

START_TIMEOUT_S = 60


class LocalServer:
    """An ASGI app served by uvicorn on a thread of this process, on 127.0.0.1 and a free port."""

    def __init__(self, app, host: str = "127.0.0.1"):
        import uvicorn

        self._socket = socket.socket()
        self._socket.bind((host, 0))
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
