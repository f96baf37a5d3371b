"""Caches: a repeated constraint never recompiles; outlines automata survive a restart on disk."""

from __future__ import annotations

import asyncio
import json

import pytest

from constrain import ConstraintError, GrammarCompiler, spec_from_request

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


def _spec(backend=None):
    return spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}},
                             backend=backend)


def test_repeated_schema_does_not_recompile(tokenizers, vocabs):
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="llguidance")
    g1 = c.compile(_spec())
    g2 = c.compile(_spec())
    assert g1 is g2 and c.stats.compiles == 1 and c.stats.cache_hits == 1
    c.close()


def test_requests_for_a_schema_being_compiled_wait_for_that_compile(tokenizers, vocabs):
    """Eight requests at once with one new schema: one llguidance compile, the others wait for it (each compiled
    it on its own request thread, with 32 of those)."""
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="llguidance")
    schema = {"type": "object", "properties": {f"field_{i}": {"type": "string", "maxLength": 20} for i in range(300)},
              "required": [f"field_{i}" for i in range(300)], "additionalProperties": False}
    spec = spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "big", "schema": schema}})

    async def eight():
        return await asyncio.gather(*(c.compile_async(spec) for _ in range(8)))

    try:
        grammars = asyncio.run(eight())
        assert len({id(g) for g in grammars}) == 1
        assert c.stats.compiles == 1 and c.stats.cache_hits == 7
    finally:
        c.close()


def test_a_repeated_non_strict_schema_plans_its_late_checks_once(tokenizers, vocabs, monkeypatch):
    """Without `strict`, a schema compiled with keywords left out is planned for the late checks: once, whether
    they enforce more (`not` of a multipleOf) or nothing more (`format: regex`), not again on every repeat."""
    from constrain import compiler as compiler_module

    calls = []
    plan = compiler_module.plan_late_keywords
    monkeypatch.setattr(compiler_module, "plan_late_keywords", lambda *a, **k: calls.append(1) or plan(*a, **k))
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="llguidance")
    for keyword, unenforced in [({"not": {"multipleOf": 3}}, ()), ({"format": "regex"}, ("/properties/x/format",))]:
        schema = {"type": "object", "properties": {"x": {"type": "integer" if "not" in keyword else "string",
                                                         **keyword}}}
        spec = spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
        calls.clear()
        assert [c.compile(spec).unenforced for _ in range(3)] == [unenforced] * 3
        assert len(calls) == 1
    c.close()


def test_disk_cache_survives_a_restart(tmp_path, tokenizers, vocabs):
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path)
    g = c.compile(_spec())
    assert g.backend == "outlines" and c.stats.compiles == 1
    c.close()
    restarted = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path)
    g2 = restarted.compile(_spec())
    assert restarted.stats.compiles == 0 and restarted.stats.disk_hits == 1
    m = g2.matcher()
    assert all(m.accept(t) for t in tokenizers["gpt2"].encode('{"ok": true}')) and m.can_end()
    restarted.close()


def test_a_cache_directory_that_cannot_be_made_leaves_the_cache_in_memory(tmp_path, tokenizers, vocabs, caplog):
    """A read-only home (the Docker image's cache volume, owned by root) or a file in its place: the server's
    start-up ended in a traceback, though the disk cache only saves compile time."""
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("")
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=in_the_way / "cache")
    try:
        assert c.disk is None and "no on-disk grammar cache" in caplog.text
        assert c.compile(_spec()).backend == "outlines" and c.compile(_spec()) is not None
        assert c.stats.compiles == 1
    finally:
        c.close()


def test_the_disk_cache_stays_within_its_bound_dropping_the_automata_least_recently_used(tmp_path, tokenizers,
                                                                                        vocabs):
    """Each schema sent twice left its automaton on disk for ever (~6 MB on a 152k vocabulary): QA watched the
    folder grow 6 MB a schema. Past the bound the least recently written or read go first."""
    import time

    def compiler(bound: int) -> GrammarCompiler:
        return GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path,
                               disk_max_bytes=bound)

    specs = [spec_from_request(regex=pattern) for pattern in ("a[0-9]{3}", "b[0-9]{3}", "c[0-9]{3}")]  # (one size)
    first = compiler(1 << 40)
    first.compile(specs[0])
    [written] = list(tmp_path.rglob("*.npz"))
    bound = 2 * written.stat().st_size + written.stat().st_size // 2  # (two automata fit, not three)
    time.sleep(0.05)
    first.compile(specs[1])
    first.close()
    time.sleep(0.05)
    again = compiler(bound)
    again.compile(specs[0])  # read from disk: now the most recently used
    assert again.stats.disk_hits == 1
    time.sleep(0.05)
    again.compile(specs[2])
    again.close()
    files = list(tmp_path.rglob("*.npz"))
    assert len(files) == 2 and sum(f.stat().st_size for f in files) <= bound
    last = compiler(bound)
    for spec in (specs[0], specs[2]):
        last.compile(spec)
    assert last.stats.disk_hits == 2 and last.stats.compiles == 0  # the one dropped: specs[1], used least recently
    last.close()


def test_a_cache_directory_that_cannot_be_written_leaves_the_cache_in_memory(tmp_path, tokenizers, vocabs, caplog,
                                                                             monkeypatch):
    """A folder that exists but refuses writes (a read-only volume, a cache baked into an image): only `mkdir` was
    checked, so every outlines build failed writing its file, and the failure was remembered for the schema."""
    from constrain import disk_cache

    def refuse(*args, **kwargs):
        raise PermissionError(30, "Read-only file system")

    monkeypatch.setattr(disk_cache.tempfile, "NamedTemporaryFile", refuse)
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path)
    try:
        assert c.disk is None and "cannot be made or written" in caplog.text
        assert c.compile(_spec()).backend == "outlines" and c.stats.compiles == 1
    finally:
        c.close()


def test_the_disk_cache_prunes_only_its_own_automata(tmp_path, tokenizers, vocabs):
    """`--cache-dir` is a folder the user names (`~/.cache`, `/data`): the prune took every `*.npz` below it, a
    user's NumPy data set first (QA: a 1.6 MB `my_dataset/train_shard0.npz` was deleted after one build)."""
    data = tmp_path / "my_dataset" / "train_shard0.npz"
    data.parent.mkdir()
    data.write_bytes(b"\0" * 100_000)
    deeper = tmp_path / "a" / "b" / "c.outlines.npz.bak"
    deeper.parent.mkdir(parents=True)
    deeper.write_bytes(b"\0" * 100_000)
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path,
                        disk_max_bytes=1)  # (no automaton fits: each is pruned once written)
    c.compile(_spec())
    c.close()
    assert data.stat().st_size == 100_000 and deeper.stat().st_size == 100_000


def test_an_automaton_served_from_memory_is_used_as_the_disk_cache_counts_use(tmp_path, tokenizers, vocabs,
                                                                               monkeypatch):
    """Only a read from disk touched a file, and a schema in use is served from memory: the hottest schema was
    the first the prune dropped (and rebuilt after a restart)."""
    import time

    from constrain.disk_cache import DiskCache

    monkeypatch.setattr(DiskCache, "touch_every_s", 0.0)
    hot, once, new = (spec_from_request(regex=pattern) for pattern in ("a[0-9]{3}", "b[0-9]{3}", "c[0-9]{3}"))
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path)
    c.compile(hot)
    [written] = list(tmp_path.rglob("*.outlines.npz"))
    c.disk.max_bytes = 2 * written.stat().st_size + written.stat().st_size // 2  # (two automata fit, not three)
    time.sleep(0.05)
    c.compile(once)
    time.sleep(0.05)
    assert c.compile(hot) is not None and c.stats.cache_hits == 1  # from memory
    time.sleep(0.05)
    c.compile(new)
    c.close()
    restarted = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path)
    restarted.compile(hot)
    assert restarted.stats.disk_hits == 1 and restarted.stats.compiles == 0
    restarted.close()


def test_keeping_the_disk_bound_scans_the_cache_once_not_at_every_build(tmp_path, tokenizers, vocabs,
                                                                        monkeypatch):
    """Every build listed and read the whole cache on the thread the request waits on (~2 s at 20,000 files):
    a running total says when a prune is due."""
    from constrain.disk_cache import DiskCache

    scans = []
    keep = DiskCache._keep_the_bound
    monkeypatch.setattr(DiskCache, "_keep_the_bound", lambda self: scans.append(1) or keep(self))
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path)
    for pattern in ("a[0-9]{3}", "b[0-9]{3}", "c[0-9]{3}"):
        c.compile(spec_from_request(regex=pattern))
    c.close()
    assert len(scans) == 1 and len(list(tmp_path.rglob("*.outlines.npz"))) == 3


def test_a_prune_by_another_server_between_a_build_and_its_read_loses_nothing(tmp_path, tokenizers, vocabs,
                                                                               monkeypatch):
    """Servers sharing a cache root prune each other's files: one pruned right after a worker wrote it was a
    FileNotFoundError for the request. A build's file is moved into place only once it has been read."""
    from constrain.disk_cache import DiskCache

    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path)
    other = DiskCache.open(tmp_path, "another-vocabulary", "another-code", max_bytes=0)
    build = c.workers.build

    def build_then_prune(*args, **kwargs):
        seconds = build(*args, **kwargs)
        other._keep_the_bound()  # (the other server's bound is 0: it removes every automaton it counts)
        return seconds

    monkeypatch.setattr(c.workers, "build", build_then_prune)
    assert c.compile(_spec()).backend == "outlines"
    c.close()
    other.close()
    assert len(list(tmp_path.glob("*/*/*.outlines.npz"))) == 1


def test_unfinished_files_are_removed_once_no_build_can_be_writing_them(tmp_path):
    """A worker killed mid-write (a time-out, the memory limit) left its file, which nothing counted or removed."""
    import os
    import time

    from constrain.disk_cache import DiskCache

    disk = DiskCache.open(tmp_path, "vocab", "code", max_bytes=1 << 30)
    stale, fresh = disk.unfinished_path("k1"), disk.unfinished_path("k2")
    for path in (stale, fresh):
        path.write_bytes(b"partial")
    hours_ago = time.time() - 2 * 3600
    os.utime(stale, (hours_ago, hours_ago))
    disk._keep_the_bound()
    disk.close()
    assert not stale.exists() and fresh.exists()


def test_foreground_outlines_builds_are_counted_with_their_time(tokenizers, vocabs):
    """/metrics read 0 builds but seconds of build time: the count was of background builds only."""
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines")
    c.compile(_spec())
    assert c.stats.outlines_builds == 1 and c.stats.build_seconds_total > 0
    c.close()


def test_disk_cache_is_not_served_to_other_code(tmp_path, tokenizers, vocabs, monkeypatch):
    """An automaton on disk was built by the code of its day: after an upgrade (another code fingerprint) the
    schema is compiled again, so a fix to how schemas become regexes reaches the repeats of cached schemas too."""
    from constrain import compiler as compiler_module

    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path)
    c.compile(_spec())
    c.close()
    monkeypatch.setattr(compiler_module, "code_fingerprint", lambda: "another-version")
    upgraded = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path)
    upgraded.compile(_spec())
    assert upgraded.stats.disk_hits == 0 and upgraded.stats.compiles == 1
    upgraded.close()


def test_auto_serves_new_schemas_with_llguidance_and_builds_outlines_from_the_second_request(tokenizers, vocabs):
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="auto")
    assert c.compile(_spec()).backend == "llguidance"
    assert not c._pending and c.stats.outlines_builds == 0  # a one-off schema costs no outlines build
    assert c.compile(_spec()).backend == "llguidance"  # a repeat: the build starts
    assert len(c._pending) == 1
    for fut in list(c._pending.values()):
        fut.result(timeout=120)
    assert c.compile(_spec()).backend == "outlines"
    # the build's time is counted (/metrics' outlines build seconds: it read 0 though builds ran for seconds)
    assert c.stats.outlines_builds == 1 and c.stats.build_seconds_total > 0
    c.close()


def test_compile_async_and_named_schemas_precompile(tmp_path, tokenizers, vocabs):
    (tmp_path / "flag.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "no name.json").write_text(json.dumps(SCHEMA))  # (a request could not name it: skipped)
    # (nested past what the server reads: skipped; 1,000 levels stopped the server's start with a RecursionError)
    (tmp_path / "deep.json").write_text('{"items": ' * 1000 + "{}" + "}" * 1000)
    from constrain import checked

    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="auto", schemas_dir=tmp_path)
    assert list(c.named_schemas) == ["flag"]
    checked._PER_VOCABULARY.clear()
    assert c.precompile_named() == {"flag": "outlines"}
    # start-up also built the tables of the checks applied while decoding, so no first request waits for them
    built = {cls.__name__ for cls, fp in checked._PER_VOCABULARY if fp == vocabs["gpt2"].fingerprint}
    assert built == {"TokenIndex", "_TokenSets", "KeyEscapeTokens", "_CommaKeys", "_ExponentDigits"}
    spec = spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "flag"}},
                             named_schemas=c.named_schemas)
    g = asyncio.run(c.compile_async(spec))
    assert g.backend == "outlines" and c.stats.compile_seconds_total > 0
    c.close()


def test_lru_is_bounded_in_bytes(tokenizers, vocabs):
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="llguidance", lru_max_bytes=1)
    for word in ("a", "b", "c"):
        c.compile(spec_from_request(choice=[word]))
    assert len(c._lru) == 1
    c.compile(spec_from_request(choice=["a"]))
    assert c.stats.compiles == 4
    c.close()


def test_the_lru_counts_the_lanes_an_llguidance_grammar_parses_while_cached(tokenizers, vocabs):
    """An llguidance grammar keeps a parse per mask-thread lane, made as rows use the lanes (Grammar.matcher): its
    size grows while it is cached. The cache counts it as it is when used, and evicts by that size (it counted the
    size of one parse for up to eight)."""
    from tests.constrain.test_hostile import _parsed_lanes

    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="llguidance")
    first = c.compile(spec_from_request(choice=["a"]))
    one_parse = c._lru.bytes
    assert one_parse == first.nbytes > 0
    first.matcher(1), first.matcher(2)
    _parsed_lanes(first, [1, 2])
    assert first.nbytes == 3 * one_parse
    assert c.compile(spec_from_request(choice=["a"])) is first  # (the cache hit reads its size again)
    assert c._lru.bytes == 3 * one_parse

    c._lru.max_bytes = 4 * one_parse + 1  # room for its three parses and one parse of another
    second = c.compile(spec_from_request(choice=["b"]))
    assert c._lru.bytes == 3 * one_parse + second.nbytes and len(c._lru) == 2
    second.matcher(1)
    _parsed_lanes(second, [1])
    c.compile(spec_from_request(choice=["b"]))  # now two parses of "b": "a", the least recently used, goes
    assert len(c._lru) == 1 and c._lru.bytes == second.nbytes
    assert c.compile(spec_from_request(choice=["a"])) is not first
    c.close()


def test_the_lru_counts_the_mask_rows_an_outlines_grammar_writes_while_cached(tokenizers, vocabs):
    """An outlines grammar writes a mask row for each state decoding visits and keeps it: an enum of 1,990 words
    held 85 MB of rows while the cache counted an allowance of 64 rows (QA round 27). Every grammar is counted as
    it is each time the cache is used, rows included (rows written after a schema's last lookup were not:
    review), and evicted by that size."""
    import torch

    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", background_outlines=False)
    try:
        words = [f"w{i:03d}x" for i in range(300)]
        first = c.compile(spec_from_request(choice=words))
        empty = first.nbytes
        assert c._lru.bytes == empty
        bitmask = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
        for word in words[:100]:  # (each word's own states: a row each)
            m = first.matcher()
            for token in tokenizers["gpt2"].encode(word):
                m.fill_bitmask(bitmask, 0)
                assert m.accept(token)
        row = 4 * vocabs["gpt2"].words
        assert first.nbytes >= empty + 100 * row
        other = c.compile(spec_from_request(regex="[a-z]+"))  # (another schema's lookup reads every size again:
        assert c._lru.bytes == first.nbytes + other.nbytes    # rows written after a schema's last lookup count)
        assert c.compile(spec_from_request(choice=words)) is first
        c._lru.max_bytes = first.nbytes + empty // 2  # no room for it beside another grammar of its size
        c.compile(spec_from_request(choice=[w.upper() for w in words]))
        assert len(c._lru) == 1 and c.compile(spec_from_request(choice=words)) is not first
    finally:
        c.close()


def test_the_memory_cache_holds_its_bounds_in_bytes_and_in_entries(tokenizers, vocabs):
    """QA watched RSS climb ~200 KB per distinct schema with no plateau: the cache counted an llguidance grammar
    at ~66 KB (a third of what it holds) against a 1 GiB bound no option could lower. A grammar's size is counted
    nearer the truth (~160 KB and more), and the number of grammars is bounded too."""
    from constrain.compiler import _LRU

    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="llguidance", lru_max_bytes=1 << 20)
    try:
        for i in range(12):
            c.compile(spec_from_request(regex=f"x{i}[a-z]{{3}}"))
        assert 0 < c._lru.bytes <= 1 << 20 and len(c._lru) <= 6  # (~160 KB or more each)
    finally:
        c.close()
    lru = _LRU(max_bytes=1 << 40, max_entries=3)
    grammars = [type("G", (), {"nbytes": 1})() for _ in range(5)]
    for i, g in enumerate(grammars):
        lru.put(str(i), g)
    assert len(lru) == 3 and lru.get("0") is None and lru.get("4") is grammars[4]


def test_a_cache_folder_deleted_while_the_server_runs_is_made_again(tmp_path, tokenizers, vocabs):
    """Older folders may be deleted, and cache wipers delete them: every outlines build after that failed
    (FileNotFoundError writing the automaton), a 400 blaming the request, remembered for the schema."""
    import shutil

    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path)
    try:
        c.compile(spec_from_request(regex="a[0-9]{3}"))
        shutil.rmtree(c.disk.folder)
        assert c.compile(spec_from_request(regex="b[0-9]{3}")).backend == "outlines"
        assert len(list(c.disk.folder.glob("*.outlines.npz"))) == 1
    finally:
        c.close()


def test_an_automaton_a_request_had_built_by_outlines_serves_auto_only_where_auto_would_build_it(tmp_path, tokenizers,
                                                                                                  vocabs):
    """auto keeps regexes and choices on llguidance (outlines-core 0.2.14 drops transitions there:
    `[0-9]+(\\.[0-9]+)?` never wrote its decimal point), but it took any outlines automaton it found cached first:
    one request with `constraint_backend: "outlines"` made auto serve that pattern from outlines, on disk too."""
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="auto", cache_dir=tmp_path)
    for spec in ({"regex": r"[0-9]+(\.[0-9]+)?"}, {"choice": ["yes", "no"]}):
        assert c.compile(spec_from_request(**spec, backend="outlines")).backend == "outlines"
        assert c.compile(spec_from_request(**spec)).backend == "llguidance"
    assert c.compile(_spec("outlines")).backend == "outlines"
    assert c.compile(_spec()).backend == "outlines"  # (a schema auto builds with outlines is served from it)
    c.close()


def test_a_request_for_auto_gets_the_auto_policy_whatever_the_server_runs(tmp_path, tokenizers, vocabs):
    """A request's `constraint_backend: "auto"` read as "the server's backend": on an outlines server an open object
    was a 400 that auto serves with llguidance (QA ops F1)."""
    open_object = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path,
                        background_outlines=False)
    try:
        response_format = {"type": "json_schema", "json_schema": {"name": "o", "schema": open_object}}
        assert c.compile(spec_from_request(response_format=response_format, backend="auto")).backend == "llguidance"
        with pytest.raises(ConstraintError, match="closed objects"):  # (the server's, where the request names none)
            c.compile(spec_from_request(response_format=response_format))
    finally:
        c.close()


def test_a_pattern_neither_backend_reads_is_named_by_llguidance_or_left_unenforced(tmp_path, tokenizers, vocabs):
    """auto tried outlines where llguidance refused, or left a keyword unenforced, and outlines' failure was the
    answer: a 400 "outlines cannot compile this constraint: Failed to build DFA", a non-strict request too (QA
    review8 F5). Now strict is refused with llguidance's message (the keyword's pointer), the rest served."""
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="auto", cache_dir=tmp_path,
                        background_outlines=False)
    schema = {"type": "object", "properties": {"v": {"type": "string", "pattern": "^(?!A)(?i:a)$"}},
              "required": ["v"], "additionalProperties": False}
    try:
        def spec(strict):
            return spec_from_request(response_format={"type": "json_schema", "json_schema": {
                "name": "x", "schema": schema, "strict": strict}})
        with pytest.raises(ConstraintError, match="look-around") as refused:
            c.compile(spec(True))
        assert refused.value.pointer == "/properties/v/pattern"
        g = c.compile(spec(False))
        assert g.backend == "llguidance" and g.unenforced == ("/properties/v/pattern",)
    finally:
        c.close()


def test_a_broken_automaton_file_on_disk_is_built_again_not_a_400(tmp_path, tokenizers, vocabs):
    """A truncated or empty `.outlines.npz` (a crash, a full disk, a copy cut short) was a 400 invalid_constraint
    on every request for its schema, on every server sharing the cache, until someone deleted the file. One that
    reads but whose arrays make no automaton (written by another program) was a 500 IndexError on every request
    for its schema, and stayed (QA round 27)."""
    import io

    import numpy as np

    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path)
    c.compile(_spec())
    c.close()
    [written] = list(tmp_path.rglob("*.outlines.npz"))
    with np.load(written) as z:
        arrays = {k: z[k] for k in z.files}

    def npz(**changed) -> bytes:
        out = io.BytesIO()
        np.savez(out, **{**arrays, **changed})
        return out.getvalue()

    inconsistent = [npz(nexts=np.full_like(arrays["nexts"], 1_000_000)),
                    npz(tokens=np.full_like(arrays["tokens"], 32 * vocabs["gpt2"].words)),
                    npz(offsets=arrays["offsets"][:-1]), npz(dist=arrays["dist"][:1]),
                    npz(final=arrays["final"].astype(np.float64))]
    for broken in (b"", written.read_bytes()[:100], *inconsistent):
        written.write_bytes(broken)
        restarted = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path)
        try:
            m = restarted.compile(_spec()).matcher()
            assert all(m.accept(t) for t in tokenizers["gpt2"].encode('{"ok": true}')) and m.can_end()
            assert restarted.stats.compiles == 1 and written.stat().st_size > 100  # (built and written again)
        finally:
            restarted.close()


def test_a_cache_folder_that_cannot_take_an_automaton_builds_it_in_memory(tmp_path, tokenizers, vocabs, caplog,
                                                                          monkeypatch):
    """A full disk under --cache-dir made every new outlines build a 400 compile_failed blaming the request, and
    the failure was remembered for the schema after space was freed. The build goes to memory instead."""
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path)
    unfinished_path = c.disk.unfinished_path

    def in_the_way(key):  # (a folder where the file is to go: the worker's write fails, as on a full disk)
        path = unfinished_path(key)
        path.mkdir()
        return path

    monkeypatch.setattr(c.disk, "unfinished_path", in_the_way)
    try:
        m = c.compile(_spec()).matcher()
        assert all(m.accept(t) for t in tokenizers["gpt2"].encode('{"ok": true}')) and m.can_end()
        assert "cannot be written" in caplog.text and not c._failed
    finally:
        c.close()


def _ordered(names: list[str]) -> dict:
    """An object of integers `names`, declared in that order (`required` the same whatever the order)."""
    return {"type": "object", "properties": {n: {"type": "integer"} for n in names}, "required": sorted(names),
            "additionalProperties": False}


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_a_schema_of_the_same_properties_in_another_order_is_compiled_as_written(backend, tmp_path, tokenizers,
                                                                                  vocabs):
    """Schemas were cached under their keys sorted: after `{first, second}`, a schema declaring `{second, first}`
    was served the first one's grammar, and wrote `first` first, on both backends, for tools too, and from the
    disk after a restart (QA cachekeys F1). Properties come in the order each schema declares them."""
    tok = tokenizers["gpt2"]

    def spec(names):
        return spec_from_request(response_format={"type": "json_schema", "json_schema": {
            "name": "o", "schema": _ordered(names), "strict": True}}, backend=backend)

    def takes(grammar, text: str) -> bool:
        m = grammar.matcher()
        return all(m.accept(t) for t in tok.encode(text)) and m.can_end()

    c = GrammarCompiler(vocabs["gpt2"], tok, backend=backend, cache_dir=tmp_path, background_outlines=False)
    try:
        assert takes(c.compile(spec(["first", "second"])), '{"first": 1, "second": 2}')
        reversed_grammar = c.compile(spec(["second", "first"]))
        assert takes(reversed_grammar, '{"second": 2, "first": 1}')
        assert not takes(reversed_grammar, '{"first": 1, "second": 2}')
    finally:
        c.close()
    tools = [{"type": "function", "function": {"name": "f", "parameters": _ordered(["q", "p"])}}]
    restarted = GrammarCompiler(vocabs["gpt2"], tok, backend=backend, cache_dir=tmp_path, background_outlines=False)
    try:
        assert takes(restarted.compile(spec(["second", "first"])), '{"second": 2, "first": 1}')
        first = restarted.compile(spec_from_request(tools=[{"type": "function", "function": {
            "name": "f", "parameters": _ordered(["p", "q"])}}], tool_choice="required", backend=backend))
        second = restarted.compile(spec_from_request(tools=tools, tool_choice="required", backend=backend))
        assert first is not second
    finally:
        restarted.close()


def test_an_automaton_file_of_another_constraint_is_built_again(tmp_path, tokenizers, vocabs, caplog):
    """A file was trusted as its key's automaton whenever its arrays made one: another schema's automaton copied
    over it (a sync between hosts, a restore from a backup) was served for this schema, `{"v": "Y"}` under `const:
    "X3"`, with no warning, and stayed (QA cachekeys F2). A file names the constraint it was built for."""
    def schema(value: str) -> dict:
        return {"type": "object", "properties": {"v": {"const": value}}, "required": ["v"],
                "additionalProperties": False}

    def spec(value: str):
        return spec_from_request(response_format={"type": "json_object", "schema": schema(value)})

    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path)
    c.compile(spec("X3"))
    [x_file] = list(tmp_path.rglob("*.outlines.npz"))
    c.compile(spec("Y"))
    c.close()
    [y_file] = [p for p in tmp_path.rglob("*.outlines.npz") if p != x_file]
    x_file.write_bytes(y_file.read_bytes())
    restarted = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="outlines", cache_dir=tmp_path)
    try:
        with caplog.at_level("WARNING", logger="constrain.compiler"):
            m = restarted.compile(spec("X3")).matcher()
        assert all(m.accept(t) for t in tokenizers["gpt2"].encode('{"v": "X3"}')) and m.can_end()
        assert restarted.stats.compiles == 1 and restarted.stats.disk_hits == 0
        assert "another constraint" in caplog.text
        assert restarted.compile(spec("Y")).backend == "outlines" and restarted.stats.disk_hits == 1
    finally:
        restarted.close()


def test_a_schema_of_the_same_keywords_in_another_order_is_a_cache_hit(tokenizers, vocabs):
    """Only the properties' order is written out: keys ordered as sent made a schema whose keywords came in
    another order compile again, and build a second outlines automaton (~6 MB on disk; QA review F4)."""
    a = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 5}, "b": {"const": {"x": 1, "y": 2}}},
         "required": ["a"], "additionalProperties": False}
    b = {"additionalProperties": False, "required": ["a"], "type": "object",
         "properties": {"a": {"maxLength": 5, "type": "string"}, "b": {"const": {"x": 1, "y": 2}}}}
    other_const = {**a, "properties": {**a["properties"], "b": {"const": {"y": 2, "x": 1}}}}

    def spec(schema):
        return spec_from_request(response_format={"type": "json_schema", "json_schema": {"name": "s",
                                                                                          "schema": schema}})

    assert spec(a).key == spec(b).key
    assert spec(a).key != spec(other_const).key  # (an object `const` is written in its order)
    assert spec(a).key != spec(_ordered(["b", "a"])).key != spec(_ordered(["a", "b"])).key
    c = GrammarCompiler(vocabs["gpt2"], tokenizers["gpt2"], backend="llguidance")
    try:
        assert c.compile(spec(a)) is c.compile(spec(b)) and c.stats.compiles == 1
    finally:
        c.close()
