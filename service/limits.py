"""Request body size limit as ASGI middleware: a body over `max_body_bytes` is a 413 before any parsing."""

from __future__ import annotations

import json


class BodySizeLimit:
    def __init__(self, app, max_body_bytes: int):
        self.app = app
        self.limit = max_body_bytes

    async def _too_large(self, send) -> None:
        body = json.dumps({"error": {
            "message": f"request body too large: the limit is {self.limit} bytes",
            "type": "invalid_request_error", "param": None, "code": "request_too_large"}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) > self.limit:
                return await self._too_large(send)
            return await self.app(scope, receive, send)
        # No content-length (chunked): read the body up to the limit, then replay it.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:
                return await self._too_large(send)
            if not message.get("more_body"):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)
