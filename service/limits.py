"""Request body limits as ASGI middleware: a body over `max_body_bytes` is a 413 before any parsing, and one that
has not arrived `max_body_seconds` after its request began is a 408."""

from __future__ import annotations

import asyncio
import json


class BodySizeLimit:
    """Reads the body (to the size limit, within the time limit), then hands the app the whole of it. A client
    that declared a body and sent part of it held its connection for ever (3,000 such were all open after a
    minute: a few thousand more and the server's sockets are spent)."""

    def __init__(self, app, max_body_bytes: int, max_body_seconds: float = 60.0):
        self.app = app
        self.limit = max_body_bytes
        self.seconds = max_body_seconds

    async def _refuse(self, send, status: int, message: str, code: str) -> None:
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                     "code": code}}).encode()
        # (closed: the body left unread would be read as the next request, and a client trickling it would hold the
        # connection on after a 408)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    async def _too_large(self, send) -> None:
        await self._refuse(send, 413, f"request body too large: the limit is {self.limit} bytes", "request_too_large")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", ())).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self._too_large(send)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.seconds
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                return await self._refuse(send, 408, f"the request body did not arrive within {self.seconds:g} s",
                                          "request_timeout")
            if message["type"] != "http.request":
                return  # (the client left before its body was whole: nobody to answer)
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limit:  # (no content-length, chunked, or more bytes than it said)
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
