"""Errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}`.

Every error a client can cause is an `APIError` value turned into JSON here: 400 for an invalid request (never
FastAPI's 422), 401, 404, 413. Never logs request bodies or keys.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import uuid

import h11
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from constrain.limits import JSONTooDeep

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",  # (OpenAI's)
          405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
          500: "server_error",
          503: "server_error"}


class APIError(Exception):
    """An error to return to the client as it is."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def invalid(message: str, param: str | None = None, code: str | None = "invalid_request") -> APIError:
    return APIError(400, message, param=param, code=code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}


class OpenAIErrorH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol (h11), but a request it cannot parse (a malformed request line or header, such as
    `Content-Length: abc`), which never reaches the app, gets its 400 in the OpenAI error shape as every other error
    does, where uvicorn answers in plain text; and a connection whose request line and headers have not all come
    `head_seconds` after it opened (or after its last answer) is closed: a client that sent part of them, or a byte
    now and then, held its connection for ever (uvicorn's keep-alive timer restarts at every byte)."""

    head_seconds: float = 60.0
    _head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_deadline = self.loop.call_later(self.head_seconds, self._head_late)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_deadline is not None and self.conn.their_state is not h11.IDLE:  # (the head is in)
            self._head_deadline.cancel()
            self._head_deadline = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        self._head_deadline = self.loop.call_later(self.head_seconds, self._head_late)

    def connection_lost(self, exc) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None
        super().connection_lost(exc)

    def _head_late(self) -> None:
        self._head_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():  # (no request under way)
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        body = json.dumps(error_body(400, "the HTTP request is malformed: its request line or headers could not be "
                                          "read", None, "invalid_request")).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                   (b"connection", b"close"), (b"x-request-id", new_request_id().encode())]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                      h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()


def new_request_id() -> str:
    """The `x-request-id` of a response, in OpenAI's form (`req_` and 32 hex digits)."""
    return f"req_{uuid.uuid4().hex}"


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(error_body(exc.status, exc.message, exc.param, exc.code), status_code=exc.status,
                        headers=exc.headers)


_NOT_AN_OBJECT = "the request body must be a JSON object"
_OBJECT_TYPES = ("model_type", "model_attributes_type", "dict_type")  # (pydantic's errors for "not an object")


def param_path(parts: list[str | int]) -> str:
    """A place in the request body as OpenAI's errors name it: a list's index in brackets, an object's key after a
    dot (`messages[0].content`, `logit_bias.9707`)."""
    path = ""
    for part in parts:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def _union_branch(part: str | int) -> bool:
    """A location part that names a branch of a union pydantic tried ("str", "list[int]", "function-after[...]")."""
    return isinstance(part, str) and (any(ch in part for ch in "[]") or part in ("str", "int", "float", "bool", "dict"))


def _telling_error(errors: list[dict]) -> dict:
    """The error to report. pydantic reports a union's branches in turn, the first branch's first: where the value
    failed that branch by its shape and a later branch took its shape and failed deeper in (a list of parts with a
    part of a wrong type), the deeper error says what is wrong (review8 F7: a list of parts was told "Input should be
    a valid string")."""
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    if not loc or not _union_branch(loc[-1]):
        return first
    union = loc[:-1]
    return next((e for e in errors[1:] if tuple(e.get("loc", ()))[:len(union)] == union
                 and len(e.get("loc", ())) > len(loc)), first)


def _validation_message(errors: list[dict]) -> tuple[str, str | None]:
    """The telling validation error as one sentence naming the parameter (e.g. `temperature`)."""
    if not errors:
        return "invalid request body", None
    first = _telling_error(errors)
    loc = [p for p in first.get("loc", ()) if not _union_branch(p)]  # (without pydantic's union-branch names)
    named = getattr((first.get("ctx") or {}).get("error"), "param", None)  # a check across fields names its own
    param = param_path(loc + ([named] if named else [])) or None
    msg = str(first.get("msg", "invalid value"))
    msg = msg.removeprefix("Value error, ")
    if first.get("type") in _OBJECT_TYPES:  # (pydantic's words name our classes: "... or instance of ChatMessage")
        msg = "Input should be a JSON object"
    if not param and first.get("type") in ("model_attributes_type", "dict_type", "model_type", "missing"):
        return _NOT_AN_OBJECT, None  # ("missing": no body at all)
    if first.get("type") == "missing" and param:
        return f"missing required parameter: '{param}'", param
    if named:
        return msg, param
    if param:
        return f"invalid value for '{param}': {msg}", param
    return msg, None


def invalid_body(errors: list[dict], content_type: str | None) -> APIError:
    """The 400 for a body that is not a valid request: pydantic's first error (locations within the body), as one
    sentence naming its parameter."""
    message, param = _validation_message(errors)
    if message == _NOT_AN_OBJECT and content_type and "json" not in content_type.lower():
        # (curl -d without -H sends application/x-www-form-urlencoded: the body is not read as JSON at all)
        message += f", sent with Content-Type: application/json (this request's is {content_type!r})"
    # (a check across fields may say what kind of error it is: `unsupported_parameter`)
    code = getattr((_telling_error(errors).get("ctx") or {}).get("error"), "code", None) if errors else None
    return invalid(message, param, code=code if isinstance(code, str) else "invalid_request")


def unreadable_body(cause: BaseException | None) -> APIError:
    """The 400 for a body that could not be read as JSON. Valid JSON can still fail: Python reads no integer of more
    than 4300 digits (its guard against quadratic-time conversion), the server reads no arrays and objects nested
    past MAX_JSON_NESTING, and a client that sent such should hear that, not that its JSON is invalid."""
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):
        return invalid(f"the request body holds an integer of more than {sys.get_int_max_str_digits()} digits, "
                       "which this server does not read")
    if isinstance(cause, JSONTooDeep):
        return invalid(f"the request body {cause}, which this server does not read")
    return invalid("the request body is not valid JSON")  # (also bytes that are not UTF-8)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # (no route has FastAPI read its body, service/routes.py does; a query or path parameter it checks fails
        # here, in the same shape)
        errors = [{**e, "loc": tuple(e.get("loc", ()))[1:]} for e in exc.errors()]  # (without "body"/"query")
        return error_response(invalid_body(errors, request.headers.get("content-type")))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 404:
            message = f"unknown route: {request.method} {request.url.path}"
        else:
            message = str(exc.detail)
        return JSONResponse(error_body(exc.status_code, message, None, None), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)  # (the last resort: an error in a middleware outside UnexpectedErrors)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return _internal_error()


def _internal_error() -> JSONResponse:
    return JSONResponse(error_body(500, "internal server error", None, "internal_error"), status_code=500)


class UnexpectedErrors:
    """An unexpected exception becomes OpenAI's 500 here, inside the middlewares that name and count every response
    (service/app.py): Starlette runs the app's catch-all handler outside all of them, so that 500, the error an
    operator most needs to trace, had no `x-request-id` and was not counted in /metrics. One raised after the
    response began goes on up (the connection is closed)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watching_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watching_send)
        except Exception:
            if started:
                raise
            log.exception("unexpected error on %s %s", scope.get("method"), scope.get("path"))
            await _internal_error()(scope, receive, send)
