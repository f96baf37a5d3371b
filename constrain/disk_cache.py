"""The on-disk cache of outlines automata: `<root>/<vocabulary fingerprint>/<code fingerprint>/<key>.outlines.npz`.

Several servers may share one root (each reads only its own vocabulary's and code's folder). The cache is kept
within a bound in bytes, the automata least recently used going first, and only files of that layout are ever
counted or removed: the root is a folder the user names (`--cache-dir`), and may hold anything else.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

log = logging.getLogger(__name__)

SUFFIX = ".outlines.npz"
_AUTOMATA = f"*/*/*{SUFFIX}"
_UNFINISHED = f"*/*/*{SUFFIX}.*"  # (a build's file before it is moved into place; a worker killed mid-write)
_UNFINISHED_KEPT_S = 3600.0  # (an unfinished file this old belongs to no build under way)
_LOW_WATER = 0.9  # past the bound, prune down to this share of it, so that a prune is not needed at every build
_TOUCHES_KEPT = 65536


class DiskCache:
    """One server's view of the shared cache: where its automata go, and the bound kept on the whole root.

    Keeping the bound costs no request anything: a running total of the root's size (a scan at the first build,
    and again after `rescan_every_s`, to see what other servers added) says when to prune, and the scan and the
    prune run on a thread of their own. An automaton served from memory is touched on disk (at most once per
    `touch_every_s`), so its file's time says it is used."""

    touch_every_s = 600.0
    rescan_every_s = 300.0

    def __init__(self, root: Path, folder: Path, max_bytes: int):
        self.root = root
        self.folder = folder
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._total: int | None = None  # bytes under root, as last scanned plus what this server added since
        self._scanned_at = 0.0
        self._maintaining = False
        self._touched: OrderedDict[str, float] = OrderedDict()  # key -> when its file was last touched
        self._maintenance = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-disk-cache")

    @classmethod
    def open(cls, root: Path, vocab_fingerprint: str, code_fingerprint: str, max_bytes: int) -> "DiskCache | None":
        """The cache, or None (with a warning) where its folder cannot be made or written: a read-only volume,
        a folder owned by another user, a file in its place. The cache only saves compile time."""
        folder = root / vocab_fingerprint / code_fingerprint
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-probe-"):
                pass
        except OSError as exc:
            log.warning("no on-disk grammar cache: %s cannot be made or written (%s); compiled grammars are kept "
                        "in memory only", folder, exc)
            return None
        return cls(root, folder, max_bytes)

    def path(self, key: str) -> Path:
        return self.folder / f"{key}{SUFFIX}"

    def unfinished_path(self, key: str) -> Path | None:
        """Where a build writes its automaton: moved into place (`finished`) once read, so that no prune of
        another server sharing the root removes it in between. The folder is made again where it was deleted
        (a cache wiper, a user: older folders may be deleted); None where it cannot be."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("the grammar cache folder %s cannot be made (%s): this automaton is kept in memory only",
                        self.folder, exc)
            return None
        return self.folder / f"{key}{SUFFIX}.{uuid.uuid4().hex[:12]}"

    def finished(self, unfinished: Path, key: str) -> None:
        path = self.path(key)
        try:
            os.replace(unfinished, path)
            size = path.stat().st_size
        except OSError as exc:
            log.warning("the automaton for %s could not be kept on disk: %s", key, exc)
            unfinished.unlink(missing_ok=True)
            return
        self._note_touched(key)
        with self._lock:
            if self._total is not None:
                self._total += size
            due = (self._total is None or self._total > self.max_bytes
                   or time.monotonic() - self._scanned_at > self.rescan_every_s)
            if not due or self._maintaining:
                return
            self._maintaining = True
        with contextlib.suppress(RuntimeError):  # (closed: the server is stopping)
            self._maintenance.submit(self._keep_the_bound)

    def used(self, key: str) -> None:
        """An automaton of this key was served (from memory): its file's time is brought up to date, once per
        `touch_every_s`, so that the prune drops what is least recently used, not what was written first."""
        with self._lock:
            if time.monotonic() - self._touched.get(key, float("-inf")) < self.touch_every_s:
                return
        self._note_touched(key)
        with contextlib.suppress(OSError):
            os.utime(self.path(key))

    def _note_touched(self, key: str) -> None:
        with self._lock:
            self._touched[key] = time.monotonic()
            self._touched.move_to_end(key)
            while len(self._touched) > _TOUCHES_KEPT:
                self._touched.popitem(last=False)

    def _keep_the_bound(self) -> None:
        """Scans the root; past the bound, removes the least recently used automata down to the low-water mark
        (and unfinished files no build is writing any more)."""
        try:
            files, total = [], 0
            for path in self.root.glob(_AUTOMATA):
                with contextlib.suppress(OSError):  # (another server may prune the same root)
                    stat = path.stat()
                    files.append((stat.st_mtime, stat.st_size, path))
                    total += stat.st_size
            now = time.time()
            for path in self.root.glob(_UNFINISHED):
                with contextlib.suppress(OSError):
                    if now - path.stat().st_mtime > _UNFINISHED_KEPT_S:
                        path.unlink()
            if total > self.max_bytes:
                for _, size, path in sorted(files):
                    if total <= self.max_bytes * _LOW_WATER:
                        break
                    with contextlib.suppress(OSError):
                        path.unlink()
                        total -= size
            with self._lock:
                self._total, self._scanned_at = total, time.monotonic()
        finally:
            with self._lock:
                self._maintaining = False

    def close(self) -> None:
        """Waits for a prune under way (a server stopping leaves the cache within its bound)."""
        self._maintenance.shutdown(wait=True)
