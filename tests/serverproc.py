"""Start the real server (`structgen serve`, a uvicorn process on 127.0.0.1) for end-to-end tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`structgen serve ARGS` on a free port; waits for /health; stops it on exit (context manager). `launcher`:
    what Python runs for `structgen ARGS` (a test's `-c SCRIPT` that changes something first, then calls
    `service.cli.main(sys.argv[1:])`)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, startup_timeout: float = 180.0,
                 log_path: Path | None = None, launcher: tuple[str, ...] = ("-m", "service.cli")):
        self.launcher = launcher
        self.port = free_port()
        self.args = ["--host", "127.0.0.1", "--port", str(self.port), *args]
        # Its own cache directory: a grammar cache left by an earlier run never leaks into a test; removed on exit.
        self.cache_home = tempfile.mkdtemp(prefix="structgen-test-cache-")
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "XDG_CACHE_HOME": self.cache_home, **(env or {})}
        self.startup_timeout = startup_timeout
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ServerProcess":
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, *self.launcher, "serve", *self.args],
                                     env=self.env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} before answering /health")
            try:
                if httpx.get(self.base_url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        self.__exit__(None, None, None)
        raise RuntimeError("server did not answer /health in time")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.cache_home, ignore_errors=True)
