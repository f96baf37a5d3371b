"""TokenDFA's per-state successor summaries (slack, dead) and what the outlines backend reads from them."""

from __future__ import annotations

import numpy as np
import torch

from constrain.outlines_backend import OutlinesGrammar
from constrain.token_dfa import INF, TokenDFA
from tests.constrain.conftest import allowed_ids

# 0 -5-> 1 -5-> 4 (accepting); 0 -7-> 2 (no way on); 0 -9-> 3 -6-> 3 (loops, never accepts)
OFFSETS = np.array([0, 3, 4, 4, 5, 5], dtype=np.int64)
TOKENS = np.array([5, 7, 9, 5, 6], dtype=np.int32)
NEXTS = np.array([1, 2, 3, 4, 3], dtype=np.int32)
FINAL = np.array([False, False, False, False, True])


def _reference(dfa: TokenDFA, state: int) -> tuple[int, bool]:
    succ = dfa.dist[dfa.nexts[dfa.offsets[state]:dfa.offsets[state + 1]]]
    return max(int(np.where(succ < INF, succ, -1).max(initial=-1)), 0), bool((succ >= INF).any())


def test_slack_and_dead_match_each_states_successor_distances():
    dfa = TokenDFA(OFFSETS, TOKENS, NEXTS, FINAL)
    assert dfa.dist.tolist() == [2, 1, INF, INF, 0]
    assert [(int(dfa.slack[s]), bool(dfa.dead[s])) for s in range(5)] == [_reference(dfa, s) for s in range(5)]
    assert dfa.dead.tolist() == [True, False, False, True, False] and dfa.slack.tolist() == [1, 0, 0, 0, 0]


def test_summaries_survive_the_disk_cache_and_older_files_get_them_computed(tmp_path):
    dfa = TokenDFA(OFFSETS, TOKENS, NEXTS, FINAL)
    dfa.save(tmp_path / "new.npz")
    with np.load(tmp_path / "new.npz") as z:
        assert {"slack", "dead"} <= set(z.files)
    np.savez(tmp_path / "old.npz", offsets=OFFSETS, tokens=TOKENS, nexts=NEXTS, final=FINAL, dist=dfa.dist)
    for name in ("new.npz", "old.npz"):
        loaded = TokenDFA.load(tmp_path / name, 100)
        assert loaded.slack.tolist() == dfa.slack.tolist() and loaded.dead.tolist() == dfa.dead.tolist()


def test_arrays_that_make_no_automaton_are_refused_on_loading(tmp_path):
    """A file that reads but whose arrays make no automaton (another program's, in the cache folder) was served:
    every request for its schema failed (QA round 27; negative distances and unsorted tokens: review)."""
    import pytest

    dfa = TokenDFA(OFFSETS, TOKENS, NEXTS, FINAL)
    dfa.save(tmp_path / "good.npz")
    assert TokenDFA.load(tmp_path / "good.npz", 10).nexts.tolist() == NEXTS.tolist()
    arrays = dict(offsets=OFFSETS, tokens=TOKENS, nexts=NEXTS, final=FINAL)
    for name, changed, limit in [("state", dict(nexts=NEXTS + 5), 10), ("token", {}, 9),
                                 ("offsets", dict(offsets=OFFSETS[::-1]), 10), ("missing", dict(final=None), 10),
                                 ("2-d", dict(tokens=TOKENS.reshape(1, -1)), 10),
                                 ("dist", dict(dist=np.full(5, -1, dtype=np.int32)), 10),
                                 ("final", dict(dist=np.array([2, 1, INF, INF, 3], dtype=np.int32)), 10),
                                 ("order", dict(tokens=np.array([7, 5, 9, 5, 6], dtype=np.int32)), 10)]:
        np.savez(tmp_path / f"{name}.npz", **{k: v for k, v in {**arrays, **changed}.items() if v is not None})
        with pytest.raises(ValueError):
            TokenDFA.load(tmp_path / f"{name}.npz", limit)


def test_mask_rows_leave_out_tokens_into_states_that_never_accept(vocabs):
    vocab = vocabs["gpt2"]
    grammar = OutlinesGrammar(TokenDFA(OFFSETS, TOKENS, NEXTS, FINAL), vocab)
    bitmask = torch.zeros((1, vocab.words), dtype=torch.int32)
    matcher = grammar.matcher()
    matcher.fill_bitmask(bitmask, 0)
    assert allowed_ids(bitmask).tolist() == [5]  # (7 and 9 lead nowhere)
    assert matcher.accept(5)
    matcher.fill_bitmask(bitmask, 0)
    assert allowed_ids(bitmask).tolist() == [5]
    assert matcher.accept(5) and matcher.can_end()
    matcher.fill_bitmask(bitmask, 0)
    assert sorted(allowed_ids(bitmask).tolist()) == sorted(vocab.eos_token_ids)
