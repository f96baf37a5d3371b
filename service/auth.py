"""Bearer-key authentication for every route except /health, as ASGI middleware.

Compares keys in constant time and never logs or echoes them.
"""

from __future__ import annotations

import hmac
import json

OPEN_PATHS = frozenset({"/health"})


def _unauthorized(message: str) -> tuple[dict, bytes]:
    body = json.dumps({"error": {"message": message, "type": "authentication_error", "param": None,
                                 "code": "invalid_api_key"}}).encode()
    return {"type": "http.response.start", "status": 401,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                        (b"www-authenticate", b"Bearer"),
                        (b"connection", b"close")]}, body  # (its body unread: see service/limits.py)


class BearerAuth:
    """Requires `Authorization: Bearer <api_key>`; `api_key` None leaves the server open."""

    def __init__(self, app, api_key: str | None):
        self.app = app
        self._key = api_key.encode() if api_key else None

    def _authorized(self, scope) -> bool:
        header = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value
                break
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(token.strip(), self._key)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self._key is None or scope.get("path") in OPEN_PATHS:
            return await self.app(scope, receive, send)
        if not self._authorized(scope):
            start, body = _unauthorized("invalid or missing API key: send 'Authorization: Bearer <key>'")
            await send(start)
            await send({"type": "http.response.body", "body": body})
            return
        return await self.app(scope, receive, send)
