"""Start-up: load the model (failing fast, before any port is bound), build the app, run uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from typing import Callable, Iterator

import uvicorn
from uvicorn.main import STARTUP_FAILURE

from engine.model_loader import load_model
from service.app import create_app
from service.config import ServerConfig
from service.errors import OpenAIErrorH11Protocol

log = logging.getLogger(__name__)


class EngineStopped(Exception):
    """The engine thread stopped after a failure, and the server with it (`service.app`'s lifespan)."""


class AddressUnusable(Exception):
    """`--host`/`--port` cannot be listened on (in use, not this machine's); the message says why in one line."""


def _check_address(host: str, port: int) -> None:
    """Binds a socket to the server's address and lets it go, before the model loads (minutes on a GPU host, then
    the named schemas' builds): an address in use was found only after all that, its error followed by uvicorn's
    shutdown lines. Bound as uvicorn binds (address reuse, IPv6 for a host with a colon). uvicorn then binds its
    own: handed this one, it reset a kept-alive connection whose too large body was still arriving before its 413
    was read (tests/service/test_disconnect_and_metrics.py)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise AddressUnusable(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


_ENDING_MARGIN = 1.0  # seconds before the graceful-shutdown deadline at which what still runs is ended
_FORCED_ENDING = 1.0  # seconds a forced exit (a second Ctrl-C) gives the requests it ended to write their errors


class _Server(uvicorn.Server):
    """uvicorn's server, which ends the requests still generating a moment before its graceful-shutdown deadline
    cancels them: the engine stops, so each ends as an error its client reads (a stream's `error` event and
    `[DONE]`, a 503 `server_shutting_down`), where the deadline left a stream broken mid-body, which the OpenAI SDK
    reports as a connection error."""

    def __init__(self, config: uvicorn.Config, stop_engine: Callable[[], None]):
        super().__init__(config)
        self.stop_engine = stop_engine

    async def shutdown(self, sockets=None) -> None:
        timeout = self.config.timeout_graceful_shutdown
        ending = None
        if timeout is not None:
            delay = max(0.0, timeout - min(_ENDING_MARGIN, timeout / 2))
            ending = asyncio.get_running_loop().call_later(delay, self.stop_engine)
        try:
            await super().shutdown(sockets)
            if self.force_exit:  # (uvicorn then skips the app's shutdown; ours is quick: the engine is stopping)
                await self._let_ended_requests_answer()
                await self.lifespan.shutdown()
        finally:
            if ending is not None:
                ending.cancel()

    def handle_exit(self, sig, frame) -> None:
        """As uvicorn's; a second Ctrl-C (a forced exit, which does not wait for the requests still generating) also
        stops the engine at once, so that each of them ends as an error its client reads, where uvicorn's closing
        of the event loop cancelled them: a text/plain 500 and streams broken mid-body (QA ops F4)."""
        super().handle_exit(sig, frame)
        if self.force_exit:
            self.stop_engine()

    async def _let_ended_requests_answer(self) -> None:
        """Waits a moment (at most `_FORCED_ENDING`) for the requests a forced exit ended to write their errors."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _FORCED_ENDING
        while self.server_state.tasks and loop.time() < deadline:
            await asyncio.sleep(0.05)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """As uvicorn's, but a SIGTERM whose shutdown has finished is not raised again once uvicorn's handlers are
        gone: the default handler then killed the process (exit status 143, where Ctrl-C exits 0), before the
        checks after `run` (an engine that stopped after a failure: status 1) could run (QA cli F4)."""
        with super().capture_signals():
            try:
                yield
            finally:
                captured = getattr(self, "_captured_signals", None)
                if isinstance(captured, list):
                    captured[:] = [s for s in captured if s != signal.SIGTERM]


def run_server(config: ServerConfig) -> None:
    _check_address(config.host, config.port)
    log.info("loading model %s", config.model)
    loaded = load_model(config.model, device=config.device, dtype=config.dtype,
                        max_model_len=config.max_model_len)
    log.info("model loaded on %s (%s), context length %d", loaded.device, loaded.dtype, loaded.context_length)
    app = create_app(config, loaded)
    # (without a deadline, one client that stopped reading held a SIGTERMed server for as long as it stayed)
    protocol = type("OpenAIErrorH11Protocol", (OpenAIErrorH11Protocol,), {"head_seconds": config.max_body_seconds})
    server = _Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                                    http=protocol, timeout_graceful_shutdown=config.shutdown_timeout),
                     stop_engine=app.state.generation.engine.stop)
    app.state.stop_server = lambda: setattr(server, "should_exit", True)  # (as a SIGTERM does)
    try:
        server.run()
    except KeyboardInterrupt:  # (as uvicorn.run does)
        pass
    if not server.started:  # the port could not be bound after all, or the app did not start (uvicorn logged why)
        raise SystemExit(STARTUP_FAILURE)
    failure = app.state.generation.engine.failure
    if failure is not None:
        raise EngineStopped(f"the engine stopped after a failure ({failure})")
