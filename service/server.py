"""Start-up: load the model (failing fast, before any port is bound), build the app, run uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from engine.model_loader import load_model
from service.app import create_app
from service.config import ServerConfig
from service.errors import OpenAIErrorH11Protocol

log = logging.getLogger(__name__)


def run_server(config: ServerConfig) -> None:
    log.info("loading model %s", config.model)
    loaded = load_model(config.model, device=config.device, dtype=config.dtype,
                        max_model_len=config.max_model_len)
    log.info("model loaded on %s (%s), context length %d", loaded.device, loaded.dtype, loaded.context_length)
    app = create_app(config, loaded)
    uvicorn.run(app, host=config.host, port=config.port, log_level=config.log_level, http=OpenAIErrorH11Protocol)
