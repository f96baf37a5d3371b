"""The FastAPI application: routes over typed models. No tensors and no grammar logic here."""

from __future__ import annotations

import time

from fastapi import FastAPI

from engine.model_loader import LoadedModel
from service.config import ServerConfig


def create_app(config: ServerConfig, loaded: LoadedModel) -> FastAPI:
    app = FastAPI(title="structgen", docs_url=None, redoc_url=None)
    created = int(time.time())

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def list_models() -> dict:
        return {
            "object": "list",
            "data": [{
                "id": config.model_name,
                "object": "model",
                "created": created,
                "owned_by": "structgen",
                "context_length": loaded.context_length,
                "max_model_len": loaded.context_length,
            }],
        }

    return app
