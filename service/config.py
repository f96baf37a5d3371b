"""Server settings: one dataclass, filled from command-line options or STRUCTGEN_* environment variables."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from constrain.whitespace import DEFAULT_WHITESPACE
from engine.model_loader import BUILTIN_MODEL


@dataclass(frozen=True)
class ServerConfig:
    model: str = BUILTIN_MODEL
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    allowed_origins: str | None = None  # CORS: comma-separated origins (or "*") whose pages may call the API
    device: str = "auto"
    dtype: str = "auto"
    max_batch_size: int = 16
    max_prefill_tokens: int = 4096  # prompt positions prefilled per engine step (longer prompts: in chunks)
    mask_threads: int | None = None  # threads filling constraint masks; None: engine.default_mask_threads
    max_model_len: int | None = None
    served_model_name: str | None = None
    constraint_backend: str = "auto"  # auto | outlines | llguidance
    schemas_dir: Path | None = None  # named schemas precompiled at start-up (none by default)
    cache_dir: Path | None = None  # on-disk grammar cache; None: grammar_cache_dir's default
    cache_max_mb: int = 4096  # the on-disk grammar cache's bound (least recently used automata go first)
    grammar_cache_mb: int = 512  # the in-memory grammar cache's bound (least recently used grammars go first)
    json_whitespace: str = DEFAULT_WHITESPACE  # whitespace JSON constraints allow between tokens (bounded regex)
    tool_call_format: str = "auto"  # auto (from the chat template) | constrain.tools.TOOL_FORMATS
    reasoning: str = "auto"  # auto: split <think> / [THINK] blocks into reasoning_content when written | none
    max_body_bytes: int = 8 * 1024 * 1024
    max_body_seconds: int = 60  # for a request's body to arrive, from its start; else a 408
    log_level: str = "info"
    shutdown_timeout: int = 25  # seconds for the requests in flight after SIGTERM; those left then are cut

    @property
    def grammar_cache_dir(self) -> Path:
        """--cache-dir, else $XDG_CACHE_HOME/structgen (~/.cache/structgen): compiled automata survive restarts."""
        if self.cache_dir is not None:
            return Path(self.cache_dir)
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "structgen"

    @property
    def model_name(self) -> str:
        """The name clients use in `model` and see in /v1/models."""
        return self.served_model_name or self.model
