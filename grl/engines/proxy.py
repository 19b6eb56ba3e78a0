"""Run an engine in a child process and talk to it over a pipe.

vLLM on CPU takes over the threading of the process it runs in (torch's
thread count, OpenMP binding), which would starve or slow the trainer's
torch ops, so on CPU the vLLM engine gets its own process.
The child is started with the "spawn" method (a fresh interpreter: no
copied torch thread pools or locks) and serves one call at a time.

Messages are plain pickles sent with `send_bytes`, so tensors travel by
value: `Connection.send` would use torch's shared-memory reductions, which
move the sender's tensors (the trainer's live parameters) into shared memory.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pickle
import traceback
import weakref

from grl.engines.base import Engine, GenerationOutput, NamedTensors, SamplingParams


class EngineProcessError(RuntimeError):
    """The engine process died, or failed in a way that cannot be re-raised as is."""


def _send(conn, message) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _error_reply(seq: int, err: BaseException):
    """The exception itself when it survives pickling, else a stand-in."""
    remote = traceback.format_exc()
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:  # noqa: BLE001 - whatever pickling raises, send a stand-in
        err = EngineProcessError(f"{type(err).__name__}: {err}")
    return (seq, "error", err, remote)


def _serve(conn, target: str, kwargs: dict, env: dict) -> None:
    """The child's main loop: build the engine, then answer calls until told
    to stop or until the parent's end of the pipe closes."""
    os.environ.update(env)
    module_name, class_name = target.split(":")
    try:
        engine = getattr(importlib.import_module(module_name), class_name)(**kwargs)
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which raises it
        _send(conn, _error_reply(0, err))
        return
    _send(conn, (0, "ok", None, None))
    try:
        while True:
            try:
                seq, method, args = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                return  # the parent is gone
            if method == "shutdown":
                return
            try:
                result = getattr(engine, method)(*args)
            except BaseException as err:  # noqa: BLE001
                _send(conn, _error_reply(seq, err))
                continue
            _send(conn, (seq, "ok", result, None))
    finally:
        engine.shutdown()


def _stop_process(process, conn, timeout: float) -> None:
    """Ask the child to stop; terminate, then kill it if it does not."""
    if process.is_alive():
        try:
            _send(conn, (-1, "shutdown", ()))
        except OSError:
            pass
        process.join(timeout)
    for stop in (process.terminate, process.kill):
        if not process.is_alive():
            break
        stop()
        process.join(5)
    conn.close()


class SubprocessEngine(Engine):
    """An Engine whose calls run in a spawned child that builds
    `target` ("module:Class") with `kwargs`."""

    def __init__(
        self,
        target: str,
        kwargs: dict,
        *,
        env: dict | None = None,
        startup_timeout: float = 900.0,
        shutdown_timeout: float = 30.0,
    ):
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=_serve,
            args=(child_conn, target, kwargs, dict(env or {})),
            name=f"grl-engine-{target.split(':')[-1]}",
        )
        self._process.start()
        child_conn.close()  # the child's copy keeps the pipe open; ours would hide its death
        self._stopper = weakref.finalize(self, _stop_process, self._process, self._conn, shutdown_timeout)
        self.target = target
        self._seq = 0
        try:
            self._reply(0, startup_timeout)
        except BaseException:
            self._stopper()
            raise

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def _reply(self, seq: int, timeout: float | None = None):
        """Wait for the answer to request `seq`; answers to earlier requests
        (a call interrupted in the parent, e.g. by Ctrl-C) are dropped."""
        waited = 0.0
        while True:
            while not self._conn.poll(1.0):
                waited += 1.0
                if not self._process.is_alive():
                    raise EngineProcessError(
                        f"engine process for {self.target} exited with code {self._process.exitcode}"
                    )
                if timeout is not None and waited >= timeout:
                    raise EngineProcessError(
                        f"engine process for {self.target} did not answer in {timeout:.0f} s"
                    )
            try:
                got, status, value, remote = pickle.loads(self._conn.recv_bytes())
            except (EOFError, OSError) as err:
                self._process.join(5)
                raise EngineProcessError(
                    f"engine process for {self.target} exited with code {self._process.exitcode}"
                ) from err
            if got == seq:
                break
        if status == "error":
            value.add_note(f"in the engine process:\n{remote}")
            raise value
        return value

    def _call(self, method: str, *args):
        if not self._stopper.alive:
            raise EngineProcessError(f"engine {self.target} was shut down")
        self._seq += 1
        try:
            _send(self._conn, (self._seq, method, args))
        except OSError as err:
            raise EngineProcessError(f"engine process for {self.target} is gone") from err
        return self._reply(self._seq)

    def generate(
        self, prompt_token_ids: list[list[int]], sampling: SamplingParams, constraints: list | None = None
    ) -> list[GenerationOutput]:
        return self._call("generate", [list(p) for p in prompt_token_ids], sampling, constraints)

    def prompt_log_probs(self, prompt_token_ids: list[list[int]]) -> list[list[float]]:
        return self._call("prompt_log_probs", [list(p) for p in prompt_token_ids])

    def context_length(self) -> int | None:
        return self._call("context_length")

    def rows_within(self, row_tokens: int) -> int | None:
        return self._call("rows_within", row_tokens)

    def update_weights(self, named_tensors: NamedTensors) -> None:
        items = named_tensors.items() if hasattr(named_tensors, "items") else named_tensors
        # Detached CPU copies: gradients and devices do not cross processes.
        self._call(
            "update_weights",
            [
                (name, tensor.detach().cpu()) if hasattr(tensor, "detach") else (name, tensor)
                for name, tensor in items
            ],
        )

    def weights_digest(self) -> dict:
        return self._call("weights_digest")

    def sleep(self, discard_weights: bool = False) -> None:
        # The flag travels only when set: a target without it keeps a plain sleep().
        self._call("sleep", *([True] if discard_weights else []))

    def wake(self) -> None:
        self._call("wake")

    def shutdown(self) -> None:
        self._stopper()
