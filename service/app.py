"""The FastAPI application: routes over typed models. No tensors and no grammar logic here.

Wires the engine and the grammar compiler in a lifespan (engine start/shutdown, named schemas precompiled at
start-up), the OpenAI error shape, bearer auth, the body limit, CORS where asked and /metrics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from urllib.parse import unquote, urlsplit

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import Response

import constrain
import engine as engine_pkg
from engine.model_loader import LoadedModel
from service.auth import BearerAuth
from service.chat_template import ChatTemplate
from service.config import ServerConfig
from service.errors import APIError, UnexpectedErrors, install_error_handlers, new_request_id
from service.generation import Generation
from service.limits import BodySizeLimit
from service.metrics import CONTENT_TYPE, Metrics
from service.routes import router

log = logging.getLogger(__name__)

# The headers of an answer a browser page's script may read (`--allowed-origins`): the SDKs read the request id
EXPOSED_HEADERS = ["x-request-id", "x-structgen-constraint-backend", "x-structgen-ignored-fields",
                   "x-structgen-unenforced"]

_ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/models": "models"}


def _endpoint(path: str) -> str | None:
    """The endpoint label of an API path (`/v1/models/{id}` counts as `models`); None for other paths."""
    return _ENDPOINTS.get(path) or ("models" if path.startswith("/v1/models/") else None)


class _CountRequests:
    """Counts every API response by endpoint and status (errors included: the outermost middleware, so the 413s
    and 401s the body limit and auth send count too) for /metrics."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        endpoint = _endpoint(scope.get("path", "")) if scope["type"] == "http" else None
        if endpoint is None:
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(endpoint=endpoint, status=str(message["status"])).inc()
            await send(message)

        return await self.app(scope, receive, counting_send)


class _RequestIds:
    """Every response names its request in `x-request-id`, as OpenAI's do: the SDKs show it (`_request_id`, an
    error's `request_id`) for clients' logs. The outermost middleware, so a 401 or 413 has one too."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        header = (b"x-request-id", new_request_id().encode())

        async def naming_send(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        return await self.app(scope, receive, naming_send)


class _OriginForm:
    """A request whose target is a whole URL (`GET http://host/v1/models`: the absolute form, which RFC 9112 says a
    server must take, and which clients behind some proxies send) is routed by its path: uvicorn's h11 parser
    hands the whole URL over as the path, and every such request was a 404. The outermost middleware, so
    everything after it sees the path."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("path", "")[:8].lower().startswith(("http://", "https://")):
            raw = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
            try:  # (split as sent, then decoded: `%3F` in the path is no query; QA review10 F5)
                path = urlsplit(raw).path or "/"
            except ValueError:  # (`http://[::1/x`: left as it is, a 404, never a 500: F4)
                return await self.app(scope, receive, send)
            scope = {**scope, "path": unquote(path), "raw_path": path.encode("latin-1")}
        return await self.app(scope, receive, send)


def _build_engine_and_compiler(config: ServerConfig, loaded: LoadedModel, template: ChatTemplate):
    vocab = constrain.Vocabulary.from_tokenizer(loaded.tokenizer, loaded.logits_width, loaded.eos_token_ids,
                                                writable_special=template.written_special_tags)
    compiler = constrain.GrammarCompiler(
        vocab, loaded.tokenizer, backend=config.constraint_backend, cache_dir=config.grammar_cache_dir,
        schemas_dir=config.schemas_dir, whitespace_pattern=config.json_whitespace,
        disk_max_bytes=config.cache_max_mb << 20, lru_max_bytes=config.grammar_cache_mb << 20)
    engine = engine_pkg.Engine(loaded, max_batch_size=config.max_batch_size,
                               max_prefill_tokens=config.max_prefill_tokens, mask_threads=config.mask_threads)
    return engine, compiler


async def _stop_with_the_engine(app: FastAPI, engine) -> None:
    """Once a failure has stopped the engine thread (its requests end with 503s), stop the server as a SIGTERM
    would (`app.state.stop_server`, set by service/server.py), so that whatever supervises the process restarts
    it: a server that can only answer 503s helps nobody, and a plain `docker run --restart` reacts to an exit,
    not to a failing /health."""
    while engine.alive:
        await asyncio.sleep(0.5)
    stop = getattr(app.state, "stop_server", None)
    if engine.failure is not None and stop is not None:
        log.critical("the engine stopped after a failure (%s): the server stops", engine.failure)
        stop()


def create_app(config: ServerConfig, loaded: LoadedModel) -> FastAPI:
    template = ChatTemplate(loaded.tokenizer, tool_format=config.tool_call_format, reasoning=config.reasoning)
    log.info("%s", template.summary())
    engine, compiler = _build_engine_and_compiler(config, loaded, template)
    metrics = Metrics(engine_stats=engine.stats, compiler_stats=lambda: compiler.stats)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        started = time.monotonic()
        engine.start()
        named = await asyncio.to_thread(compiler.precompile_named)  # may compile: keep the loop free
        log.info("engine started; the compiler's tables built and %d named schemas compiled in %.1f s", len(named),
                 time.monotonic() - started)
        watcher = asyncio.create_task(_stop_with_the_engine(app, engine))
        try:
            yield
        finally:
            watcher.cancel()
            engine.shutdown()
            app.state.generation.close()
            compiler.close()

    # (no redirect from `/v1/completions/` to `/v1/completions`: an empty 307, its Location built from the Host
    # header, which a client behind a proxy may not reach; an unknown route is a 404 in the error shape)
    app = FastAPI(title="structgen", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan,
                  redirect_slashes=False)
    app.state.generation = Generation(engine=engine, compiler=compiler, loaded=loaded, config=config,
                                      template=template, metrics=metrics)
    app.state.metrics = metrics
    created = int(time.time())
    install_error_handlers(app)
    app.include_router(router)

    # (HEAD wherever GET is served, as HTTP asks: load balancers and uptime probes send it)
    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> dict:
        """200 while requests can be served; 503 once the engine thread has stopped after a failure (while the
        server stops with it: `_stop_with_the_engine`)."""
        if not engine.alive:
            raise APIError(503, f"the engine is not running ({engine.failure or 'stopped'}); restart the server",
                           code="engine_unavailable")
        return {"status": "ok"}

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.api_route("/v1/models", methods=["GET", "HEAD"])
    async def list_models() -> dict:
        return {"object": "list", "data": [_model_card(config, loaded, created)]}

    @app.api_route("/v1/models/{model_id:path}", methods=["GET", "HEAD"])
    async def get_model(model_id: str) -> dict:
        if model_id != config.model_name:
            raise APIError(404, f"the model '{model_id}' does not exist", param="model", code="model_not_found")
        return _model_card(config, loaded, created)

    # the last added is the outermost: request ids, counting, then auth, then the body limits (a client without the
    # key is refused before its body is read: forty such held 7 MB each for up to a minute), then the 500s
    app.add_middleware(UnexpectedErrors)
    app.add_middleware(BodySizeLimit, max_body_bytes=config.max_body_bytes,
                       max_body_seconds=config.max_body_seconds)
    app.add_middleware(BearerAuth, api_key=config.api_key)
    if config.allowed_origins:
        # (outside auth: a browser's preflight carries no key; inside the ids and counts. A 401 or an error names
        # its origin too, so the page's script can read why)
        app.add_middleware(CORSMiddleware, allow_origins=config.allowed_origins.split(","),
                           allow_methods=["GET", "HEAD", "POST"], allow_headers=["*"],
                           expose_headers=EXPOSED_HEADERS, max_age=600)
    app.add_middleware(_CountRequests, metrics=metrics)
    app.add_middleware(_RequestIds)
    app.add_middleware(_OriginForm)
    return app


def _model_card(config: ServerConfig, loaded: LoadedModel, created: int) -> dict:
    return {"id": config.model_name, "object": "model", "created": created, "owned_by": "structgen",
            "context_length": loaded.context_length, "max_model_len": loaded.context_length}
