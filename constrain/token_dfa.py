"""TokenDFA: an outlines-core `Index` flattened into numpy arrays (transitions, finals, distances to accept).

Imports only numpy and outlines-core (never torch), so the compile worker process (constrain/compile_worker.py)
can build one cheaply; the npz it writes is the disk cache format. No masks and no Grammar here.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np
import outlines_core

INF = np.iinfo(np.int32).max


def outlines_vocabulary_from_bytes(token_bytes: list[bytes | None], eos_ids) -> outlines_core.Vocabulary:
    """~0.25 s on a 152k vocabulary: build once per process."""
    by_bytes: dict[bytes, list[int]] = {}
    for tid, data in enumerate(token_bytes):
        if data is not None:
            by_bytes.setdefault(data, []).append(tid)
    return outlines_core.Vocabulary(min(eos_ids), by_bytes)


class TokenDFA:
    """States 0..n-1 (0 = start); per state sorted token ids and their next states; finals; distances; and per
    state, the largest finite distance among its successors (`slack`) and whether any successor can never accept
    (`dead`), so that a state's first mask row needs no pass over its successors' distances."""

    def __init__(self, offsets: np.ndarray, tokens: np.ndarray, nexts: np.ndarray, final: np.ndarray,
                 dist: np.ndarray | None = None, slack: np.ndarray | None = None, dead: np.ndarray | None = None):
        self.offsets, self.tokens, self.nexts, self.final = offsets, tokens, nexts, final
        self.dist = self._distances() if dist is None else dist
        if slack is None or dead is None:
            slack, dead = self._successor_summary()
        self.slack, self.dead = slack, dead
        self.nbytes = sum(a.nbytes for a in (offsets, tokens, nexts, final, self.dist, slack, dead))

    def _successor_summary(self) -> tuple[np.ndarray, np.ndarray]:
        """(slack, dead) per state in one vectorised pass over the transitions (~20 ms for 5.6M)."""
        n = len(self.final)
        succ = self.dist[self.nexts]
        finite = succ < INF
        slack = np.zeros(n, dtype=np.int32)
        dead = np.zeros(n, dtype=bool)
        starts = self.offsets[:-1]
        nonempty = np.flatnonzero(starts < self.offsets[1:])
        if len(nonempty):
            at = starts[nonempty]
            slack[nonempty] = np.maximum(np.maximum.reduceat(np.where(finite, succ, -1), at), 0)
            dead[nonempty] = np.logical_or.reduceat(~finite, at)
        return slack, dead

    @classmethod
    def build(cls, regex: str, ov: outlines_core.Vocabulary, eos_ids) -> "TokenDFA":
        """Seconds on a 152k vocabulary; raises ValueError/RuntimeError when outlines-core refuses the regex."""
        return cls.from_index(outlines_core.Index(regex, ov), frozenset(eos_ids))

    @classmethod
    def from_index(cls, index: outlines_core.Index, eos_ids: frozenset[int]) -> "TokenDFA":
        trans = index.get_transitions()
        start = index.get_initial_state()
        order = [start] + sorted(s for s in trans if s != start)
        finals = set(index.get_final_states())
        targets = set(finals)
        for d in trans.values():
            targets.update(d.values())
        order += sorted(t for t in targets if t not in trans and t != start)
        ids = {s: i for i, s in enumerate(order)}
        offsets = np.zeros(len(order) + 1, dtype=np.int64)
        eos = np.fromiter(eos_ids, dtype=np.int32)
        tok_parts, next_parts = [], []
        for i, s in enumerate(order):
            d = trans.get(s, {})
            toks = np.fromiter(d.keys(), dtype=np.int32, count=len(d))
            nxt = np.fromiter((ids[n] for n in d.values()), dtype=np.int32, count=len(d))
            keep = ~np.isin(toks, eos)
            toks, nxt = toks[keep], nxt[keep]
            srt = np.argsort(toks, kind="stable")
            tok_parts.append(toks[srt])
            next_parts.append(nxt[srt])
            offsets[i + 1] = offsets[i] + len(toks)
        final = np.array([s in finals for s in order], dtype=bool)
        cat = (lambda parts: np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32))
        return cls(offsets, cat(tok_parts), cat(next_parts), final)

    def _distances(self) -> np.ndarray:
        """Fewest tokens from each state to an accepting state (reverse BFS); INF = can never accept."""
        n = len(self.final)
        preds: list[set[int]] = [set() for _ in range(n)]
        for s in range(n):
            for t in np.unique(self.nexts[self.offsets[s]:self.offsets[s + 1]]):
                preds[int(t)].add(s)
        dist = np.full(n, INF, dtype=np.int32)
        queue = deque(int(s) for s in np.flatnonzero(self.final))
        dist[list(queue)] = 0
        while queue:
            s = queue.popleft()
            for p in preds[s]:
                if dist[p] == INF:
                    dist[p] = dist[s] + 1
                    queue.append(p)
        return dist

    def save(self, path: Path, label: str = "") -> None:
        """`label`: what the automaton was built for (the cache key), which `load` can ask back."""
        with open(path, "wb") as f:
            np.savez(f, offsets=self.offsets, tokens=self.tokens, nexts=self.nexts, final=self.final, dist=self.dist,
                     slack=self.slack, dead=self.dead, label=np.frombuffer(label.encode(), dtype=np.uint8))

    @classmethod
    def load(cls, path: Path, token_limit: int, label: str | None = None) -> "TokenDFA":
        """Distances and successor summaries are stored too (work the loading process should not repeat); a file
        written before them gets them computed. ValueError for arrays that do not make an automaton over tokens
        below `token_limit` (`_check_arrays`), and with `label`, for a file saved with another: an automaton copied
        over another's file (a sync between hosts, a restore) was served for that key's constraint."""
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in ("offsets", "tokens", "nexts", "final", "dist", "slack", "dead") if k in z.files}
            saved = z["label"].tobytes() if "label" in z.files else None
        if label is not None and saved != label.encode():
            raise ValueError("the automaton of another constraint")
        _check_arrays(arrays, token_limit)
        return cls(**arrays)


def _check_arrays(arrays: dict[str, np.ndarray], token_limit: int) -> None:
    """Raise ValueError unless `arrays` make an automaton: a file that reads but holds other arrays (written by
    another program into the cache folder) made every request for its schema a 500 IndexError, and stayed
    (QA round 27)."""
    missing = {"offsets", "tokens", "nexts", "final"} - set(arrays)
    if missing:
        raise ValueError(f"arrays missing: {', '.join(sorted(missing))}")
    if any(a.ndim != 1 for a in arrays.values()):
        raise ValueError("arrays of more than one dimension")
    offsets, tokens, nexts, final = (arrays[k] for k in ("offsets", "tokens", "nexts", "final"))
    n = len(final)
    if not all(np.issubdtype(arrays[k].dtype, np.integer) for k in arrays if k not in ("final", "dead")) \
            or final.dtype != bool or arrays.get("dead", final).dtype != bool:
        raise ValueError("arrays of the wrong types")
    if n == 0 or len(offsets) != n + 1 or offsets[0] != 0 or np.any(np.diff(offsets) < 0) \
            or offsets[-1] != len(tokens) or len(nexts) != len(tokens):
        raise ValueError("transitions that do not add up")
    if len(tokens) and (tokens.min() < 0 or tokens.max() >= token_limit or nexts.min() < 0 or nexts.max() >= n):
        raise ValueError("a token or state out of range")
    if any(len(arrays[k]) != n for k in ("dist", "slack", "dead") if k in arrays):
        raise ValueError("per-state arrays of another length")
    if any(k in arrays and (arrays[k].min() < 0 or arrays[k].max() > INF) for k in ("dist", "slack")) \
            or ("dist" in arrays and np.any(arrays["dist"][final] != 0)):
        raise ValueError("distances out of range")
    rising = np.diff(tokens) > 0  # (each state's tokens are sorted: `_next` searches them)
    starts = np.zeros(len(tokens), dtype=bool)
    starts[offsets[:-1][offsets[:-1] < len(tokens)]] = True
    if not np.all(rising | starts[1:]):
        raise ValueError("a state's tokens out of order")
