"""Start-up: load the model (failing fast, before any port is bound), build the app, run uvicorn."""

from __future__ import annotations

import logging

import uvicorn
from uvicorn.main import STARTUP_FAILURE

from engine.model_loader import load_model
from service.app import create_app
from service.config import ServerConfig
from service.errors import OpenAIErrorH11Protocol

log = logging.getLogger(__name__)


class EngineStopped(Exception):
    """The engine thread stopped after a failure, and the server with it (`service.app`'s lifespan)."""


def run_server(config: ServerConfig) -> None:
    log.info("loading model %s", config.model)
    loaded = load_model(config.model, device=config.device, dtype=config.dtype,
                        max_model_len=config.max_model_len)
    log.info("model loaded on %s (%s), context length %d", loaded.device, loaded.dtype, loaded.context_length)
    app = create_app(config, loaded)
    # (without a deadline, one client that stopped reading held a SIGTERMed server for as long as it stayed)
    protocol = type("OpenAIErrorH11Protocol", (OpenAIErrorH11Protocol,), {"head_seconds": config.max_body_seconds})
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                                           http=protocol,
                                           timeout_graceful_shutdown=config.shutdown_timeout))
    app.state.stop_server = lambda: setattr(server, "should_exit", True)  # (as a SIGTERM does)
    try:
        server.run()
    except KeyboardInterrupt:  # (as uvicorn.run does)
        pass
    if not server.started:  # the port could not be bound, or the app did not start (uvicorn logged why)
        raise SystemExit(STARTUP_FAILURE)
    failure = app.state.generation.engine.failure
    if failure is not None:
        raise EngineStopped(f"the engine stopped after a failure ({failure})")
