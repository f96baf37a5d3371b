"""The budget rule (#9): a document always closes within max_tokens when one fits (exactly on outlines, by a
forced greedy completion on llguidance)."""

from __future__ import annotations

import datetime
import json
import random
import re

import jsonschema
import pytest

from constrain import ConstraintSpec, GrammarCompiler, spec_from_request
from constrain.token_dfa import INF
from tests.constrain.conftest import decode, offered_walk, random_walk

SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a", "b"],
     "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"],
                                "additionalProperties": False}, "minItems": 2},
    {"type": "object", "properties": {"s": {"type": "string", "minLength": 3},
                                      "e": {"enum": ["alpha", "beta gamma", 7, None]}},
     "required": ["s", "e"], "additionalProperties": False},
]


def _shortest(grammar) -> int:
    """Tokens of the shortest document: exact on outlines (DFA distances), the greedy completion on llguidance."""
    if grammar.backend == "outlines":
        return int(grammar.dfa.dist[0])
    from constrain.llg_backend import closing_tokens

    return len(closing_tokens(grammar.matcher()._m, grammar.vocab))


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
@pytest.mark.parametrize("schema", SCHEMAS, ids=["object", "array", "enum"])
def test_tight_max_tokens_still_yields_complete_valid_documents(schema, backend, gpt2_compiler, vocabs):
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, backend=backend))
    shortest = _shortest(g)
    rng = random.Random(7)
    for max_tokens in (shortest, shortest + 1, shortest + 3, shortest + 10, shortest + 20):
        for _ in range(4):
            toks, ended = random_walk(g, vocabs["gpt2"], rng, max_tokens, budget=True)
            assert len(toks) <= max_tokens
            m = g.matcher()
            assert all(m.accept(t) for t in toks) and m.can_end(), "truncated document"
            jsonschema.validate(json.loads(decode(vocabs["gpt2"], toks)), schema)


@pytest.mark.parametrize("backend", ["outlines", "llguidance"])
def test_budget_below_the_shortest_document_keeps_the_grammar_mask_and_ends_at_the_limit(
        backend, gpt2_compiler, vocabs):
    """No document fits: the budget rule cannot help, so the row keeps a non-empty grammar mask (never an empty
    set, which would fail the request) and the answer ends at max_tokens, as OpenAI's does ("length")."""
    import torch

    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=SCHEMAS[0], backend=backend))
    too_few = _shortest(g) - 2
    budgeted = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
    g.matcher().fill_bitmask(budgeted, 0, tokens_left=too_few)
    assert int(budgeted.count_nonzero()) > 0
    toks, ended = random_walk(g, vocabs["gpt2"], random.Random(1), too_few, budget=True)
    m = g.matcher()
    assert len(toks) == too_few and all(m.accept(t) for t in toks) and not m.can_end()


def test_llguidance_closes_open_json_objects_and_regexes_within_max_tokens(gpt2_compiler, vocabs):
    specs = [ConstraintSpec(kind="json_object"), ConstraintSpec(kind="regex", pattern=r"[a-z]{3,9}@example\.com"),
             ConstraintSpec(kind="json_schema", schema={"type": "array", "items": {"type": "string"}})]
    rng = random.Random(3)
    for spec in specs:
        g = gpt2_compiler.compile(ConstraintSpec(**{**spec.__dict__, "backend": "llguidance"}))
        for max_tokens in (_shortest(g) + 2, 24, 40):
            for _ in range(4):
                toks, _ = random_walk(g, vocabs["gpt2"], rng, max_tokens, budget=True)
                m = g.matcher()
                assert all(m.accept(t) for t in toks) and m.can_end(), (spec.kind, decode(vocabs["gpt2"], toks))
                text = decode(vocabs["gpt2"], toks)
                if spec.kind == "regex":
                    assert re.fullmatch(spec.pattern, text)
                else:
                    json.loads(text)


@pytest.mark.parametrize("pattern", [r"[a-z]+!", r"[a-z]+-[0-9]{2}", r"[a-z]+ ok", r"[a-z]{3,}@x\.com",
                                     r"[A-Z][a-z]+ [A-Z][a-z]+\.", r"(cat|dog)s? [a-z]+;"])
def test_a_regex_loop_left_by_a_byte_the_walk_does_not_prefer_closes_within_max_tokens(gpt2_compiler, vocabs,
                                                                                     pattern):
    """A top-level regex whose loop is left by punctuation or a space: the closing walk preferred letters, wrote
    the alphabet (each letter 4 times) before trying `!`, and so found no completion under ~50 tokens: answers
    ran to max_tokens unmatched. Stuck in a loop, it now finishes with a tail of the pattern's shortest example."""
    from constrain import llg_backend

    g = gpt2_compiler.compile(ConstraintSpec(kind="regex", pattern=pattern, backend="llguidance"))
    rng = random.Random(4)
    for max_tokens in (8, 12, 20):
        for _ in range(3):
            toks, _ = random_walk(g, vocabs["gpt2"], rng, max_tokens, budget=True)
            text = decode(vocabs["gpt2"], toks)
            assert re.fullmatch(pattern, text), (max_tokens, text)
    assert len(llg_backend.closing_tokens(g.matcher()._m, vocabs["gpt2"], hints=g.hints)) <= 8


def test_following_the_completion_walks_once(gpt2_compiler, vocabs, monkeypatch):
    """With no slack, vetting the completion's next token takes the rest of the completion as the completion after
    it, instead of walking again (before: one walk per row per step)."""
    import torch

    from constrain import llg_backend
    from tests.constrain.conftest import allowed_ids

    vocab = vocabs["gpt2"]
    g = gpt2_compiler.compile(ConstraintSpec(kind="regex", pattern=r"[a-z]{3,9}@example\.com", backend="llguidance"))
    m = g.matcher()
    path = llg_backend.closing_tokens(m._m, vocab, hints=g.hints)
    budget = len(path)
    walks = []
    real = llg_backend.closing_tokens
    monkeypatch.setattr(llg_backend, "closing_tokens", lambda *args: walks.append(1) or real(*args))
    bm = torch.zeros((1, vocab.words), dtype=torch.int32)
    written = []
    for step in range(budget):
        m.fill_bitmask(bm, 0, tokens_left=budget - step)
        token = path[step]
        assert token in allowed_ids(bm).tolist()
        assert m.vet(token, budget - step) == token and m.accept(token)
        written.append(token)
    assert m.can_end() and re.fullmatch(r"[a-z]{3,9}@example\.com", decode(vocab, written))
    assert len(walks) == 1


@pytest.mark.parametrize("pattern, written", [("[ab]", "b"), ("[ab]{3}", "bbb")])
def test_with_no_slack_every_token_that_still_fits_is_allowed(gpt2_compiler, vocabs, pattern, written):
    """The mask held only the completion's next token when the tokens left equal its length: `[ab]` with one token
    left always wrote `a`, at logprob 0, whatever the model, a greedy choice or logit_bias favoured (helper-23).
    The mask is the grammar's; `vet` keeps what fits."""
    import torch

    from tests.constrain.conftest import allowed_ids

    vocab = vocabs["gpt2"]
    g = gpt2_compiler.compile(ConstraintSpec(kind="regex", pattern=pattern, backend="llguidance"))
    m = g.matcher()
    bm = torch.zeros((1, vocab.words), dtype=torch.int32)
    b = vocab.ids_by_bytes()[b"b"]
    for left in range(len(written), 0, -1):
        m.fill_bitmask(bm, 0, tokens_left=left)
        assert {vocab.ids_by_bytes()[b"a"], b} <= set(allowed_ids(bm).tolist())
        assert m.vet(b, left) == b and m.accept(b)
    assert m.can_end() and decode(vocab, [b] * len(written)) == written


@pytest.mark.parametrize("pattern", [r"^\w+\.txt$", r"^[a-z]+@[a-z]+\.com$", r"^.+@.+$"])
def test_a_regex_anchored_at_its_ends_still_closes_within_the_budget(pattern, gpt2_compiler, vocabs):
    """Its closing walk found no example with the anchors inside the whole-match wrapper, and without one the walk
    never closed `.+@`: nothing was vetted, and answers ended with `length` (helper-24: 9 of 10 walks)."""
    vocab = vocabs["gpt2"]
    g = gpt2_compiler.compile(ConstraintSpec(kind="regex", pattern=pattern, backend="llguidance"))
    for seed in range(6):
        toks, done = random_walk(g, vocab, random.Random(seed), 10, budget=True)
        assert done and re.fullmatch(pattern[1:-1], decode(vocab, toks)), decode(vocab, toks)


@pytest.mark.parametrize("spec, max_tokens", [({"regex": r"\d{20}|N/A"}, 3), ({"choice": ["a" * 60, "b"]}, 2),
                                              ({"regex": "(abcdefghij){5}|q"}, 1), ({"regex": "[a-z]{50}|-"}, 3)])
def test_a_short_alternative_of_a_regex_or_choice_closes_within_the_budget(spec, max_tokens, gpt2_compiler, vocabs):
    """The walk follows the alternative its preferred bytes begin (digits, letters): `\\d{20}|N/A` at max_tokens 3
    wrote digits and was cut with `length` (QA: 5 seeds in 6), where `N/A` fitted. A hint's tail that ends the
    output now closes it where it is shorter; sampled from the long alternative too."""
    vocab = vocabs["gpt2"]
    g = gpt2_compiler.compile(spec_from_request(**spec, backend="llguidance"))
    pattern = spec.get("regex") or "|".join(map(re.escape, spec["choice"]))
    long_first = [vocab.ids_by_bytes()[b] for b in (b"8", b"a", b"abc", b"x") if b in vocab.ids_by_bytes()]
    for offered in ([], long_first * max_tokens):
        out = offered_walk(g, vocab, [], offered, max_tokens)
        assert re.fullmatch(pattern, decode(vocab, out)), decode(vocab, out)


def test_llguidance_does_not_repeat_a_failed_closing_walk_every_step(gpt2_compiler, vocabs, monkeypatch):
    """A completion out of the walk's reach is the costly case: it must be retried rarely, not per token."""
    import torch

    from constrain import llg_backend

    walks = []
    real = llg_backend.closing_tokens
    monkeypatch.setattr(llg_backend, "closing_tokens",
                        lambda *args: walks.append(1) or real(*args))
    g = gpt2_compiler.compile(ConstraintSpec(kind="regex", pattern="[a-z]{3000}", backend="llguidance"))
    m = g.matcher()
    bm = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
    for step in range(200):
        m.fill_bitmask(bm, 0, tokens_left=500 - step)  # (the walk goes 2,048 bytes: `_walk_limit`)
        assert bm.count_nonzero() > 0
        assert m.accept(vocabs["gpt2"].byte_tokens()[ord("a")])
    assert real(m._m, vocabs["gpt2"]) is None  # the walk really fails here
    assert 1 <= len(walks) <= 6  # backoff 8, 16, 32, 64, 128 steps


def test_llguidance_measures_a_long_completion_far_from_the_budget_as_rarely_as_it_is_long(
        gpt2_compiler, vocabs, monkeypatch):
    """`[a-z]{3000}` with 5,000 tokens left: the walk (as far as the tokens left may spell, `_walk_limit`) finds
    a completion of some thousand tokens, which costs ~35 ms; measured every 8 steps it cost ~4 ms a step far from
    the budget. A long one is measured every 1/16th of its length."""
    import torch

    from constrain import llg_backend

    walks = []
    real = llg_backend.closing_tokens
    monkeypatch.setattr(llg_backend, "closing_tokens", lambda *args: walks.append(1) or real(*args))
    g = gpt2_compiler.compile(ConstraintSpec(kind="regex", pattern="[a-z]{3000}", backend="llguidance"))
    m = g.matcher()
    bm = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
    for step in range(200):
        m.fill_bitmask(bm, 0, tokens_left=5000 - step)
        assert m.accept(vocabs["gpt2"].byte_tokens()[ord("a")])
    found = real(m._m, vocabs["gpt2"], max_bytes=llg_backend._walk_limit(4800))
    assert found is not None and len(found) >= 16 * 16  # (found, and long)
    assert 1 <= len(walks) <= 200 // 16 + 1


def test_llguidance_does_not_remeasure_every_step_a_completion_longer_than_the_budget(
        gpt2_compiler, vocabs, monkeypatch):
    """`[a-z ]{600}` with 64 tokens left: the completion is found, but it is long and more than twice the tokens
    left, so the rule has nothing to steer to. Measuring it each step (twice, with the sampled token's probe) cost
    ~90 ms per step on the built-in model; it is re-measured with the backoff of a failed walk, and the output
    keeps its plain grammar mask."""
    import torch

    from constrain import llg_backend

    walks = []
    real = llg_backend.closing_tokens
    monkeypatch.setattr(llg_backend, "closing_tokens", lambda *args: walks.append(1) or real(*args))
    g = gpt2_compiler.compile(ConstraintSpec(kind="regex", pattern="[a-z ]{600}", backend="llguidance"))
    m = g.matcher()
    assert len(real(m._m, vocabs["gpt2"])) > 64  # the completion exists, and is longer than the budget
    walks.clear()
    letter = vocabs["gpt2"].byte_tokens()[ord("q")]
    bm = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
    for step in range(64):
        m.fill_bitmask(bm, 0, tokens_left=64 - step)
        assert bm.count_nonzero() > 1
        assert m.vet(letter, 64 - step) == letter
        assert m.accept(letter)
    assert 1 <= len(walks) <= 3  # steps 0, 16, 48


def test_a_short_completion_out_of_reach_is_still_measured_every_step(gpt2_compiler, vocabs, monkeypatch):
    """A completion of at most 64 tokens that does not fit is walked every step (cheap): a sampled token may bring
    a shorter one back in reach (random walks under `contains` did). Only long ones back off."""
    import torch

    from constrain import llg_backend

    vocab = vocabs["gpt2"]
    g = gpt2_compiler.compile(ConstraintSpec(kind="regex", pattern="[a-z]{40}", backend="llguidance"))
    m = g.matcher()
    shortest = len(llg_backend.closing_tokens(m._m, vocab))
    assert shortest <= 64
    walks = []
    real = llg_backend.closing_tokens
    monkeypatch.setattr(llg_backend, "closing_tokens", lambda *args: walks.append(1) or real(*args))
    bm = torch.zeros((1, vocab.words), dtype=torch.int32)
    letter = vocab.byte_tokens()[ord("q")]
    tokens_left = shortest // 3  # out of reach, and the completion is more than twice the tokens left
    for step in range(4):
        m.fill_bitmask(bm, 0, tokens_left=tokens_left - step)
        assert m.accept(letter)
    assert len(walks) == 4


class _CountingMatcher:
    """An llguidance matcher (and its copies) whose `validate_tokens` calls are counted: the walk's unit of work."""

    def __init__(self, inner, calls: list):
        self.inner, self.calls = inner, calls

    def deep_copy(self) -> "_CountingMatcher":
        return _CountingMatcher(self.inner.deep_copy(), self.calls)

    def validate_tokens(self, tokens):
        self.calls.append(1)
        return self.inner.validate_tokens(tokens)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_closing_walk_stays_cheap_when_it_must_repeat_bytes(gpt2_compiler, vocabs):
    """A walk that must write 600 letters avoids a byte it keeps writing (to leave `0.000...` loops) only while
    another byte fits: once every byte that fits is avoided it starts over, instead of trying all ~256 bytes for
    each byte it writes (~110k tries and ~60 ms per walk before)."""
    from constrain.llg_backend import closing_tokens

    g = gpt2_compiler.compile(ConstraintSpec(kind="regex", pattern="[a-z ]{600}", backend="llguidance"))
    tries: list = []
    closing = closing_tokens(_CountingMatcher(g.matcher()._m, tries), vocabs["gpt2"])
    text = decode(vocabs["gpt2"], closing)
    assert re.fullmatch("[a-z ]{600}", text)
    assert len(tries) < 40 * 600


def test_outlines_budget_rows_equal_the_transitions_filtered_by_distance(gpt2_compiler, vocabs):
    """The cached budget rows (keyed by the largest successor distance within the budget) hold exactly the tokens
    whose next state accepts within the budget, plus EOS in accepting states, for every budget that a document
    still fits in."""
    import torch

    from tests.constrain.conftest import allowed_ids

    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=SCHEMAS[2], backend="outlines"))
    d, eos = g.dfa, sorted(vocabs["gpt2"].eos_token_ids)
    bitmask = torch.zeros((1, vocabs["gpt2"].words), dtype=torch.int32)
    rng = random.Random(0)
    m = g.matcher()
    for _ in range(12):  # a random path through the document's states
        s = m.state
        lo, hi = d.offsets[s], d.offsets[s + 1]
        for tokens_left in range(0, g.slack(s) + 3):
            m.fill_bitmask(bitmask, 0, tokens_left=tokens_left)
            # (below the shortest completion no budget helps: the plain mask, see the test above)
            limit = tokens_left - 1 if d.dist[s] <= tokens_left else INF - 1
            expected = d.tokens[lo:hi][d.dist[d.nexts[lo:hi]] <= limit].tolist()
            expected += eos if d.final[s] else []
            assert sorted(allowed_ids(bitmask).tolist()) == sorted(expected), (s, tokens_left)
        m.fill_bitmask(bitmask, 0)
        choices = [t for t in allowed_ids(bitmask).tolist() if t not in eos]
        if not choices:
            break
        assert m.accept(rng.choice(choices))


def test_llguidance_budget_holds_when_one_token_opens_many_obligations(gpt2_compiler, vocabs):
    """Near the limit, a token like `,` in an array of objects with six required fields adds a whole object to
    write: a margin of a few tokens cannot absorb that, so each sampled token is vetted there and replaced by
    the completion's next token when it would leave no room. Every walk ends complete and valid."""
    item = {"type": "object", "additionalProperties": False, "required": list("abcdef"),
            "properties": {k: {"type": "integer"} for k in "abcdef"}}
    schema = {"type": "array", "items": item, "minItems": 1}
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, backend="llguidance"))
    shortest = _shortest(g)
    rng = random.Random(5)
    for max_tokens in range(shortest, shortest + 60, 3):
        for _ in range(3):
            toks, _ = random_walk(g, vocabs["gpt2"], rng, max_tokens, budget=True)
            m = g.matcher()
            assert all(m.accept(t) for t in toks) and m.can_end(), (max_tokens, decode(vocabs["gpt2"], toks))
            jsonschema.validate(json.loads(decode(vocabs["gpt2"], toks)), schema)


@pytest.mark.parametrize("schema", [
    {"type": "object", "minProperties": 3},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "minProperties": 4},
    {"type": "array", "items": {"type": "object", "minProperties": 2, "additionalProperties": {"type": "integer"}},
     "minItems": 2},
], ids=["free", "required-and-more", "items"])
def test_llguidance_budget_completions_write_distinct_keys_where_keys_are_counted(schema, gpt2_compiler, vocabs):
    """`minProperties` where keys may repeat is checked on the parsed object (constrain/late_keywords.py), so a
    completion that wrote `{"": 1, "": 2}` would be refused at its last `}` and the answer would run to the limit.
    The backend keeps counting pairs (its completions write enough of them) and completions write no key twice in
    one object: walks from tight budgets up end complete, valid, with distinct keys."""
    from constrain.checked import backend_matcher
    from constrain.llg_backend import closing_tokens

    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, strict=True, backend="llguidance"))
    start = backend_matcher(g.matcher())
    shortest = closing_tokens(start._m, vocabs["gpt2"], start._followed(), distinct_keys=start._distinct_keys)
    assert shortest is not None
    jsonschema.validate(json.loads(decode(vocabs["gpt2"], shortest)), schema)
    rng = random.Random(11)
    for max_tokens in (len(shortest), len(shortest) + 2, len(shortest) + 8, 30, 50):
        for _ in range(4):
            toks, ended = random_walk(g, vocabs["gpt2"], rng, max_tokens, budget=True)
            assert ended, (max_tokens, b"".join(vocabs["gpt2"].token_bytes[t] for t in toks))
            text = decode(vocabs["gpt2"], toks)
            jsonschema.validate(json.loads(text), schema)
            pairs = json.loads(text, object_pairs_hook=lambda kv: [k for k, _ in kv])
            for keys in (pairs if schema["type"] == "array" else [pairs]):
                assert len(keys) == len(set(keys)), text


@pytest.mark.parametrize("string", [
    {"type": "string", "pattern": "[a-f0-9]{24}"},  # searched anywhere: any byte fits until a match is written
    {"type": "string", "pattern": r"^[_a-z0-9-]+(\.[_a-z0-9-]+)*@[_a-z0-9-]+(\.[a-z]{2,3})$"},
    {"type": "string", "format": "email"},
    {"type": "string", "pattern": "^all|tags$"},  # once the string does not start with "all", it ends with "tags"
    {"type": "string", "pattern": "(^Hpt_|^Int_|_Armour_)"},
    {"type": "string", "pattern": "(?i)abc"},  # a global flag: its examples are those of `abc`
    {"type": "string", "pattern": "^([0-9]+|\\$\\([a-z]+\\))$"},  # the alternatives of a group, anchored
    {"type": "string", "pattern": "^((ab)*c)+$"},  # a cycle of a picked `a` and a forced `b`, not one byte
    {"type": "string", "pattern": "^[a-z]+\\n[0-9]+$"},  # an example holding a control character (escaped)
    {"type": "string", "pattern": "^[^a]{1,4000}z$"},  # a count past the automata's limit: its minimum
], ids=["unanchored", "email-pattern", "email-format", "anchored-alternatives", "searched-alternatives",
        "global-flag", "group-alternatives", "cycle", "control-character", "long-count"])
def test_llguidance_budget_closes_strings_whose_pattern_the_greedy_walk_cannot_finish(string, gpt2_compiler, vocabs):
    """A closing walk inside such a value kept writing one byte (`}}}}`, `0000`) and found no completion, so no
    budget rule: answers ran to the limit. It now tries the schema's pattern and format examples (one per top-level
    alternative, and their tails) when stuck, else another byte: walks entering the value at random end complete
    and valid."""
    from constrain.spec import normalise_schema

    schema = {"type": "object", "properties": {"id": string}, "required": ["id"], "additionalProperties": False}
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend="llguidance"))
    checker = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    rng = random.Random(13)
    for max_tokens in (30, 50):
        for _ in range(5):
            toks, ended = random_walk(g, vocabs["gpt2"], rng, max_tokens, budget=True)
            assert ended, b"".join(vocabs["gpt2"].token_bytes[t] for t in toks)
            assert checker.is_valid(json.loads(decode(vocabs["gpt2"], toks)))


def test_a_pattern_of_a_long_unicode_class_still_closes_within_the_budget(gpt2_compiler, vocabs):
    """`\\p{L}` is ~9,400 characters as Python spells it: past the examples' pattern limit, `\\p{L}cole` had no
    example, and every answer ran to max_tokens (QA testsuite2 F3)."""
    from constrain.spec import normalise_schema

    schema = normalise_schema({"type": "object", "properties": {"id": {"type": "string", "pattern": r"\p{L}cole"}},
                               "required": ["id"], "additionalProperties": False})
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, strict=True, backend="llguidance"))
    rng = random.Random(13)
    for max_tokens in (30, 50) * 3:
        toks, ended = random_walk(g, vocabs["gpt2"], rng, max_tokens, budget=True)
        assert ended, b"".join(vocabs["gpt2"].token_bytes[t] for t in toks)
        jsonschema.validate(json.loads(decode(vocabs["gpt2"], toks)), schema)  # (the pattern as Python spells it)


@pytest.mark.parametrize("value, prefix", [
    ({"type": "string", "pattern": "^[^a-z]*$"}, '"ABC'),  # `}` and `]` fit inside the string, a letter does not
    ({"type": "string", "not": {"pattern": "[a-z]{1,255}"}}, '"X}'),  # the same, from the complement of a search
    ({"type": "number", "exclusiveMinimum": 0}, "0.000"),  # a digit other than 0 closes it
    ({"type": "string", "pattern": r"^\\d+/\\d+$"}, '"\\\\ddd'),  # literal backslashes, written escaped
    ({"type": "string", "pattern": r"^a\s*\+b$"}, '"a  '),  # spaces fit forever; only `+b` ends it
    ({"type": "string", "pattern": "^all|tags$"}, '"x'),  # no longer "all...": "...tags"
    ({"type": "string", "pattern": "^((ab)*c)+$"}, '"ababab'),  # a cycle: a picked `a`, a forced `b`
])
def test_a_closing_walk_finishes_values_where_its_greedy_byte_would_repeat_forever(value, prefix, gpt2_compiler,
                                                                                  tokenizers, vocabs):
    """From inside such a value the greedy walk wrote the same byte until it gave up (no completion, so no budget
    rule). Now it tries the pattern's examples, then another byte, and finds a completion. Inside a string whose
    pattern refuses letters, it took `}` for a closer and wrote `}]}]...` into the string: it now knows (from the
    output followed as JSON) that it is inside a string, and closes it."""
    from constrain.checked import backend_matcher
    from constrain.llg_backend import closing_tokens

    from constrain.spec import normalise_schema

    schema = {"type": "object", "properties": {"id": value}, "required": ["id"], "additionalProperties": False}
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=normalise_schema(schema), strict=True,
                                             backend="llguidance"))
    m = g.matcher()
    start = '{"id": ' + prefix
    assert all(m.accept(t) for t in tokenizers["gpt2"].encode(start, add_special_tokens=False))
    backend = backend_matcher(m)
    closing = closing_tokens(backend._m, vocabs["gpt2"], backend._followed(), backend._g.hints)
    assert closing is not None
    jsonschema.validate(json.loads(start + decode(vocabs["gpt2"], closing)), schema)


def test_llguidance_budget_sees_a_token_that_opens_a_large_item_coming(gpt2_compiler, vocabs):
    """`,{` opening another item with four required members makes the completion ~30 tokens longer at once: with
    the vetting zone sized by the completion alone, walks that had room to close the array opened one item too
    many and ran to the limit. The zone now has room for such growth (an allowance, or the most growth seen with
    the schema), so such walks close in time."""
    item = {"type": "object", "properties": {k: {"type": "integer"} for k in ("alpha", "beta", "gamma", "delta")},
            "required": ["alpha", "beta", "gamma", "delta"], "additionalProperties": False}
    schema = {"type": "array", "items": item}
    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, strict=True, backend="llguidance"))
    rng = random.Random(5)
    for max_tokens in (60, 80, 100):
        for _ in range(6):
            toks, ended = random_walk(g, vocabs["gpt2"], rng, max_tokens, budget=True)
            assert ended, (max_tokens, b"".join(vocabs["gpt2"].token_bytes[t] for t in toks))
            jsonschema.validate(json.loads(decode(vocabs["gpt2"], toks)), schema)


EVENT = {"type": "object", "required": ["title", "start", "end"], "properties": {
    "attendees": {"type": "array", "items": {"type": "string"}}, "end": {"type": "string", "format": "date-time"},
    "location": {"type": "string"}, "start": {"type": "string", "format": "date-time"}, "title": {"type": "string"}}}


def test_llguidance_completions_skip_optional_keys_and_take_the_shorter_alternative(gpt2_compiler, vocabs):
    """A function schema as Glaive's are written: optional properties declared before required ones. The closing
    walk writes the required keys only (before, the first letters that fit spelled `"attendees": []` and
    `"location": ""` too) and ends a date-time with `Z`, not `+00:00`; so it measures the shortest document
    closely, and tight budgets still end valid (at 64 tokens on Qwen2's vocabulary, 7 of 20 walks had not)."""
    from constrain.checked import backend_matcher
    from constrain.llg_backend import closing_tokens

    g = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_object", "schema": EVENT},
                                                backend="llguidance"))  # (date-time as the server compiles it)
    m = backend_matcher(g.matcher())
    closing = closing_tokens(m._m, vocabs["gpt2"], m._followed(), m._g.hints, key_names=m._g.key_names)
    document = json.loads(decode(vocabs["gpt2"], closing))  # (a date-time of the pattern's hints: 14 tokens, as
    assert set(document) == {"end", "start", "title"} and document["title"] == ""  # `"0001-01-01T00:00:00Z"`)
    assert all(datetime.datetime.fromisoformat(document[k]).tzinfo is not None for k in ("end", "start"))
    rng = random.Random(3)
    for max_tokens in (len(closing), len(closing) + 4):
        for _ in range(6):
            toks, ended = random_walk(g, vocabs["gpt2"], rng, max_tokens, budget=True)
            assert ended and len(toks) <= max_tokens
            jsonschema.validate(json.loads(decode(vocabs["gpt2"], toks)), EVENT)


def test_llguidance_completions_write_null_where_a_value_may_be_null(gpt2_compiler, vocabs):
    """A required date that may be null: the closing walk writes `null`, not `"0001-01-01"` (its first byte was a
    quote, ahead of `n`), so it measures the shortest document and a budget below the date's still ends valid."""
    from constrain.checked import backend_matcher
    from constrain.llg_backend import closing_tokens

    schema = {"type": "object", "properties": {"due": {"type": ["string", "null"], "format": "date"},
                                               "title": {"type": "string"}},
              "required": ["due", "title"], "additionalProperties": False}
    g = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_object", "schema": schema},
                                                backend="llguidance"))
    m = backend_matcher(g.matcher())
    closing = closing_tokens(m._m, vocabs["gpt2"], m._followed(), m._g.hints, key_names=m._g.key_names)
    assert json.loads(decode(vocabs["gpt2"], closing)) == {"due": None, "title": ""}
    rng = random.Random(5)
    for _ in range(6):
        toks, ended = random_walk(g, vocabs["gpt2"], rng, len(closing) + 2, budget=True)
        assert ended
        jsonschema.validate(json.loads(decode(vocabs["gpt2"], toks)), schema)


AUDIT_EVENT = {"type": "object", "required": ["id", "type", "acknowledged"],
               "properties": {"acknowledged": {"type": "boolean"}, "created_at": {"type": "string", "format": "date-time"},
                              "id": {"type": "integer"}, "type": {"type": "string"}}}


def test_a_key_name_that_chooses_a_long_value_is_vetted_before_it_is_written(tokenizers, vocabs):
    """Tokens inside a string value are vetted later than those that open something (`_CLOSING_NEAR_FACTOR`), but
    a key's name chooses the member's value: `"c` (an extra property, 7 tokens to close) then `reated` (a
    date-time, 31) made the completion grow by 24 in one token. Offered that walk (a random walk of JSONSchemaBench
    Github_easy o21082), the output still ends complete and valid within 40 tokens: the key's tokens are vetted
    as openers are."""
    from constrain import GrammarCompiler

    vocab = vocabs["qwen2"]
    compiler = GrammarCompiler(vocab, tokenizers["qwen2"], backend="llguidance")
    grammar = compiler.compile(ConstraintSpec(kind="json_schema", schema=AUDIT_EVENT, strict=True))
    ids = vocab.ids_by_bytes()
    pieces = [b'{', b'"a', b'ck', b'nowled', b'ged', b'"', b':f', b'alse', b' ,"', b'c', b'reated', b'_at', b'":"',
              *(bytes([c]) for c in b"4089-06-03T08:07:32-23:22")]
    written = offered_walk(grammar, vocab, [], [ids[p] for p in pieces], 40)
    compiler.close()
    jsonschema.validate(json.loads(decode(vocab, written)), AUDIT_EVENT)


def test_tokens_inside_a_string_value_are_vetted_only_close_to_the_budget(tokenizers, vocabs, monkeypatch):
    """Each vet of a sampled token probes it on the engine thread. Inside a string value a token seldom makes the
    completion longer, so such tokens are vetted from 1.25 x (completion + margin) tokens before the budget's end,
    not 2 x; from 2 x on, the completion is known at each step in `fill_bitmask` instead (on the mask threads), so
    a token that did make it longer is seen at the next step. Known there, and in `vet`, without a walk (~60-150
    us) where the completion before the token still completes the output after it, or the token wrote its first
    bytes and the rest does (one check, ~3 us)."""
    import torch

    from constrain import GrammarCompiler, llg_backend

    vocab = vocabs["gpt2"]
    compiler = GrammarCompiler(vocab, tokenizers["gpt2"], backend="llguidance")  # (no growth seen yet)
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"],
              "additionalProperties": False}
    m = compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, strict=True)).matcher()
    ids = vocab.ids_by_bytes()
    assert all(m.accept(ids[p]) for p in (b'{"', b's', b'":"'))
    events: list[str] = []
    real_vet, real_walk, real_check = llg_backend.LlgMatcher.vet, llg_backend.closing_tokens, \
        llg_backend.LlgMatcher._still_completes
    vetting = []

    def vet(self, *args):
        vetting.append(1)
        try:
            return real_vet(self, *args)
        finally:
            vetting.clear()

    monkeypatch.setattr(llg_backend.LlgMatcher, "vet", vet)
    monkeypatch.setattr(llg_backend, "closing_tokens",
                        lambda *args: events.append("vet walk" if vetting else "fill walk") or real_walk(*args))
    monkeypatch.setattr(llg_backend.LlgMatcher, "_still_completes", lambda self, *args: events.append(
        "vet check" if vetting else "fill check") or real_check(self, *args))
    bm = torch.zeros((1, vocab.words), dtype=torch.int32)
    assert ids[b'"}'] in real_walk(m._m, vocab)  # (the completion: one token)
    events.clear()
    for tokens_left in (17, 16, 15, 12):  # 2 x (1 + 8) = 18 >= tokens left > 1.25 x (1 + 8) = 11.25
        m.fill_bitmask(bm, 0, tokens_left=tokens_left)
        assert m.vet(ids[b"abc"], tokens_left) == ids[b"abc"] and m.accept(ids[b"abc"])
    assert events == ["fill walk"] + ["fill check"] * 3
    m.fill_bitmask(bm, 0, tokens_left=11)
    assert m.vet(ids[b"abc"], 11) == ids[b"abc"] and m.accept(ids[b"abc"])
    assert events == ["fill walk"] + ["fill check"] * 4 + ["vet check"]
    m.fill_bitmask(bm, 0, tokens_left=10)
    assert m.vet(ids[b"\\"], 10) == ids[b"\\"]  # (after it `"}` writes an escaped quote: a walk)
    assert events[6:] == ["vet check", "vet walk"]
    assert m.vet(ids[b'"'], 10) == ids[b'"'] and m.accept(ids[b'"'])  # (it writes `"}`'s first byte: `}` is left)
    assert events[8:] == ["vet check"]
    m.fill_bitmask(bm, 0, tokens_left=9)
    assert events[9:] == [] and m.vet(ids[b"}"], 9) == ids[b"}"] and m.accept(ids[b"}"]) and m.can_end()
    compiler.close()


@pytest.fixture
def carried_inside_a_string(tokenizers, vocabs):
    """(matcher, ids by bytes) of a strict `{"s": string}` output at `{"s":"`, whose known completion is a valid one
    carried over from an earlier state (as `_still_completes` keeps them) but not the shortest: ten x's, then `"}`."""
    import torch

    from constrain import GrammarCompiler, llg_backend

    vocab = vocabs["gpt2"]
    compiler = GrammarCompiler(vocab, tokenizers["gpt2"], backend="llguidance")
    schema = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"],
              "additionalProperties": False}
    m = compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, strict=True)).matcher()
    ids = vocab.ids_by_bytes()
    assert all(m.accept(ids[p]) for p in (b'{"', b's', b'":"'))
    m.fill_bitmask(torch.zeros((1, vocab.words), dtype=torch.int32), 0, tokens_left=64)
    carried = [ids[b"x"]] * 10 + [ids[b'"}']]
    inner = getattr(m, "inner", m)  # (under the distinct-keys check every llguidance JSON output has)
    assert isinstance(inner, llg_backend.LlgMatcher)
    inner._closing, inner._closing_len, inner._closing_kept = carried, len(carried), True
    yield m, ids
    compiler.close()


def test_a_completion_carried_over_that_does_not_fit_is_walked_afresh_before_the_rule_gives_up(
        carried_inside_a_string):
    """A completion carried over from before a token (`_still_completes`) is a valid one, not always the shortest:
    where the sampled token leaves none that fits and the carried one does not fit either, the rule walks from
    here before it gives up, and steers to that walk's first token when it fits."""
    m, ids = carried_inside_a_string
    assert m.vet(ids[b"abc"], 1) == ids[b'"}'] and m.accept(ids[b'"}']) and m.can_end()


def test_the_fewest_tokens_to_end_are_walked_once_where_a_completion_was_carried_over(carried_inside_a_string,
                                                                                        monkeypatch):
    """`min_tokens_to_end` (which choices fit, constrain/either.py) does not report a carried-over completion that a
    walk from here beats, and walks once for a state, not at each call."""
    from constrain import llg_backend

    m, _ = carried_inside_a_string
    walks = []
    real_walk = llg_backend.closing_tokens
    monkeypatch.setattr(llg_backend, "closing_tokens", lambda *args: walks.append(1) or real_walk(*args))
    assert m.min_tokens_to_end() == 1 and m.min_tokens_to_end() == 1 and len(walks) == 1


@pytest.mark.parametrize("divisor", [1024, 101, 10007, 1000003, 60])
def test_an_integer_under_a_multiple_of_closes_within_the_budget(divisor, tokenizers, vocabs):
    """The closing walk wrote zeros after an integer that could not end as it was: under a divisor prime to 10
    they never make a multiple, and 1024 needs ten, so no completion was found and the answer ran to max_tokens
    (`{"n": -984387613711126...`, finish_reason length, at 200 tokens). The walk now writes the digits that do."""
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    compiler = GrammarCompiler(vocab, tok, backend="llguidance", background_outlines=False)
    try:
        schema = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": divisor}},
                  "required": ["n"], "additionalProperties": False}
        grammar = compiler.compile(spec_from_request(response_format={"type": "json_object", "schema": schema}))
        prefix = tok.encode('{"n": -984387613711126', add_special_tokens=False)
        out = offered_walk(grammar, vocab, prefix, [], 12)
        document = json.loads(tok.decode(prefix + out))
        assert document["n"] % divisor == 0, document
    finally:
        compiler.close()


@pytest.mark.parametrize("bounds, shortest", [
    ({"minimum": 3, "maximum": 3}, "3"), ({"exclusiveMinimum": 0}, "1"), ({"minimum": 7}, "7"),
    ({"exclusiveMinimum": 0, "exclusiveMaximum": 1}, "0.5"), ({"type": "integer", "minimum": 5}, "5"),
    ({"type": "integer", "minimum": 18}, "18"), ({"type": "integer", "minimum": 42}, "42"),
    ({"type": "integer", "maximum": -42}, "-42"), ({"type": "integer", "minimum": 995, "maximum": 10000}, "995"),
    ({"enum": [100, 2000]}, "100"), ({"type": "integer", "minimum": 123456}, "123456")])
def test_a_number_with_a_lower_bound_closes_within_a_budget_of_its_shortest_document(bounds, shortest, tokenizers,
                                                                                     vocabs):
    """The closing walk wrote a space after the colon and then the first digit that fit (`0` under `exclusiveMinimum:
    0`, which goes on as `0.000...1`): its completion overestimated, and at a budget of the shortest document 16
    answers in 20 under `ge=3, le=3` were cut (QA numbers F1). It now writes no space JSON does not need, and a
    number's byte after which it may end where one fits, and where none does, the fewer of two runs of digits
    (`_number_tail`: the first digit that fit went on as `100` under `minimum: 42`)."""
    tok, vocab = tokenizers["qwen2"], vocabs["qwen2"]
    compiler = GrammarCompiler(vocab, tok, backend="llguidance", background_outlines=False)
    try:
        schema = {"type": "object", "properties": {"x": {"type": "number", **bounds}}, "required": ["x"],
                  "additionalProperties": False}
        grammar = compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, strict=True))
        budget = len(tok.encode('{"x":%s}' % shortest, add_special_tokens=False))
        rng = random.Random(0)
        for _ in range(12):
            toks, ended = random_walk(grammar, vocab, rng, budget, budget=True)
            assert ended, decode(vocab, toks)
            jsonschema.validate(json.loads(decode(vocab, toks)), schema)
    finally:
        compiler.close()


def test_the_multiple_written_is_of_the_number_s_own_divisor(tokenizers, vocabs):
    """The walk took the schema's first divisor whose digits the grammar took, another property's (7 for `k`
    inside `n`, under 10007): its multiples never let `n` end, and no completion was found (42 ms a walk)."""
    tok, vocab = tokenizers["gpt2"], vocabs["gpt2"]
    compiler = GrammarCompiler(vocab, tok, backend="llguidance", background_outlines=False)
    try:
        schema = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 10007},
                                                   "k": {"type": "integer", "multipleOf": 7}},
                  "required": ["n"], "additionalProperties": False}
        grammar = compiler.compile(spec_from_request(response_format={"type": "json_object", "schema": schema}))
        for start in ('{"n": 3', '{"n": 42', '{"n": 123'):
            prefix = tok.encode(start, add_special_tokens=False)
            document = json.loads(tok.decode(prefix + offered_walk(grammar, vocab, prefix, [], 12)))
            assert document["n"] % 10007 == 0, document
    finally:
        compiler.close()


@pytest.mark.parametrize("fmt, written, most", [("ipv6", '{"v": "Dead:cfee:3Cb8:FDA8:fADD', 3),
                                                ("ipv6", '{"v": "1:2', 3), ("email", '{"v": "abc', 6),
                                                ("uri", '{"v": "ht', 4)])
def test_a_string_that_cannot_close_yet_is_finished_with_a_hint_first(fmt, written, most, gpt2_compiler, tokenizers):
    """Inside a string whose quote does not fit yet, the walk wrote its preferred bytes until it got stuck, and
    only then tried the format's hints: `:0000:0000:0` where `::` closes an IPv6 address (QA: 8 answers in 12
    cut at the greedy answer's length), `0000a@a.aa` for an e-mail address. The hints are tried first now."""
    schema = {"type": "object", "properties": {"v": {"type": "string", "format": fmt}}, "required": ["v"],
              "additionalProperties": False}
    g = gpt2_compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "s", "schema": schema, "strict": True}}, backend="llguidance"))
    m = g.matcher()
    assert all(m.accept(t) for t in tokenizers["gpt2"].encode(written))
    assert m.min_tokens_to_end() <= most


UNDERSCORE_KEY = {"type": "object", "properties": {"a": {"type": "string"}, "_id": {"type": "integer"}},
                  "required": ["a", "_id"], "additionalProperties": False}


@pytest.mark.parametrize("tokens_left", range(10, 16))
def test_a_completion_through_forced_bytes_counts_the_tokens_llguidance_forces(tokens_left, tokenizers, vocabs):
    """Where the grammar forces bytes (a required key's name), llguidance's mask holds only the tokenizer's own
    tokens for them, read after the token before: Qwen2 writes `","` `_` `id`, where the completion had been spelled
    `","` `_id`, one token fewer. Half the answers to such a schema (keys `_id`, `_elements`) ended one token short
    of their `}` (QA soundness F1; these tokens are a served answer's, cut at `"_id":7`)."""
    vocab = vocabs["qwen2"]
    compiler = GrammarCompiler(vocab, tokenizers["qwen2"], backend="llguidance")
    grammar = compiler.compile(ConstraintSpec(kind="json_schema", schema=UNDERSCORE_KEY, strict=True))
    ids = vocab.ids_by_bytes()
    pieces = ['{"', "a", '":"', " pháp", "负债", " disappointed", " ));", '","', "_", "id", '":', "7", "}"]
    written = offered_walk(grammar, vocab, [], [ids[p.encode()] for p in pieces], tokens_left)
    compiler.close()
    jsonschema.validate(json.loads(decode(vocab, written)), UNDERSCORE_KEY)


DOUBLE_UNDERSCORE_KEY = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}},
                                                        "__v": {"type": "integer"}},
                         "required": ["a", "__v"], "additionalProperties": False}


@pytest.mark.parametrize("tokens_left", range(10, 18))
def test_a_completion_kept_past_a_token_that_leaves_bytes_forced_counts_the_forced_tokens(tokens_left, tokenizers,
                                                                                         vocabs):
    """A completion measured where nothing was forced (`,` then an optional space) is kept past a space, after
    which `"__v` is forced: llguidance forces `"` `__` `v`, where the completion kept spelled `"_` `_v`, not in the
    mask (review of 7841d65: the engine kept the sampled token, and the answer ended at `"__v":`)."""
    vocab = vocabs["qwen2"]
    compiler = GrammarCompiler(vocab, tokenizers["qwen2"], backend="llguidance")
    grammar = compiler.compile(ConstraintSpec(kind="json_schema", schema=DOUBLE_UNDERSCORE_KEY, strict=True))
    ids = vocab.ids_by_bytes()
    offered = [ids[p] for p in (b'{"', b"a", b'":', b"[", b"],", b" ")] + [ids[b"1"]] * 12
    written = offered_walk(grammar, vocab, [], offered, tokens_left)
    compiler.close()
    jsonschema.validate(json.loads(decode(vocab, written)), DOUBLE_UNDERSCORE_KEY)


# The pattern sits under `local`, no keyword: only the $ref that names it leads there (JsonSchemaStore's vtestunit)
PATTERN_UNDER_AN_UNKNOWN_KEY = {"$ref": "#/definitions/a/full", "definitions": {"a": {
    "local": {"one": {"type": "string", "pattern": r"\.([Yy][Aa][Mm][Ll]|[Jj][Ss][Oo][Nn])$"}},
    "full": {"type": "object", "properties": {"includes": {"$ref": "#/definitions/a/local/one"}},
             "required": ["includes"], "additionalProperties": False}}}}


def test_a_pattern_that_only_a_ref_leads_to_still_closes_within_the_budget(tokenizers, vocabs):
    """The completion finishes a string its pattern must end with `.json` from the pattern's examples (hints),
    which were looked for only where a walk of the schema goes: this one was missed, and answers ran to max_tokens
    inside the string (QA soundness F3)."""
    vocab = vocabs["qwen2"]
    compiler = GrammarCompiler(vocab, tokenizers["qwen2"], backend="llguidance")
    grammar = compiler.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "strict": True, "schema": PATTERN_UNDER_AN_UNKNOWN_KEY}}))
    rng = random.Random(0)
    for max_tokens in (16, 24, 40):
        for _ in range(8):
            toks, _ = random_walk(grammar, vocab, rng, max_tokens, budget=True)
            m = grammar.matcher()
            assert all(m.accept(t) for t in toks) and m.can_end(), ("truncated", max_tokens)
            jsonschema.validate(json.loads(decode(vocab, toks)), PATTERN_UNDER_AN_UNKNOWN_KEY)
    compiler.close()


def test_a_shortest_document_past_2048_bytes_still_closes_in_time(gpt2_compiler, vocabs):
    """The closing walk went at most 2,048 bytes: a schema whose shortest document is longer (JSONSchemaBench
    Github_ultra o90698, 2,479 bytes) was never steered, and every answer ran to max_tokens 2,000, cut. It now goes
    as far as the tokens left may spell (`_walk_limit`): these names spell ~6 bytes a token, with little slack."""
    words = ["administration", "configuration", "description", "information", "organization", "international",
             "communication", "representation", "specification"]
    names = [a + b.capitalize() for a in words for b in words]
    schema = {"type": "object", "properties": {n: {"type": "string"} for n in names}, "required": names,
              "additionalProperties": False}
    from constrain.llg_backend import closing_tokens

    g = gpt2_compiler.compile(ConstraintSpec(kind="json_schema", schema=schema, backend="llguidance"))
    shortest = closing_tokens(g.matcher()._m, g.vocab, max_bytes=32768)
    assert len(decode(vocabs["gpt2"], shortest)) > max(2048, 5 * len(shortest))
    rng = random.Random(3)
    for _ in range(2):
        toks, ended = random_walk(g, vocabs["gpt2"], rng, len(shortest) + 12, budget=True)
        assert ended, "truncated document"
        jsonschema.validate(json.loads(decode(vocabs["gpt2"], toks)), schema)


def test_uuids_close_in_time_where_a_document_fits(tokenizers, vocabs):
    """Inside a `format: uuid` string the completion finished it with the format's example, `00000000-0000-...`,
    which Qwen2 spells a token a digit (36 tokens, against 10 for `ffffffff-ffff-...`): so long that no completion
    seemed to fit, and the rule let answers run to max_tokens, cut, a few tokens from where one fitted (all 12
    random walks at the first completion's length plus 0-4; pydantic's `UUID` fields through instructor, QA)."""
    schema = {"type": "object", "required": ["a", "b", "c"],
              "properties": {k: {"type": "string", "format": "uuid"} for k in "abc"}}
    compiler = GrammarCompiler(vocabs["qwen2"], tokenizers["qwen2"], backend="llguidance")
    try:
        g = compiler.compile(spec_from_request(
            response_format={"type": "json_schema", "json_schema": {"name": "u", "schema": schema}},
            backend="llguidance"))
        shortest = _shortest(g)
        rng = random.Random(0)
        for max_tokens in (shortest, shortest + 2, shortest + 4, shortest + 8):
            for _ in range(6):
                toks, ended = random_walk(g, vocabs["qwen2"], rng, max_tokens, budget=True)
                assert ended, decode(vocabs["qwen2"], toks)
                jsonschema.validate(json.loads(decode(vocabs["qwen2"], toks)), schema)
    finally:
        compiler.close()


@pytest.fixture(scope="module")
def qwen2_llguidance(tokenizers, vocabs):
    c = GrammarCompiler(vocabs["qwen2"], tokenizers["qwen2"], backend="llguidance", background_outlines=False)
    yield c
    c.close()


UUID_PATTERN = "^[a-f0-9]{8}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{12}$"


@pytest.mark.parametrize("properties, shortest", [
    ({"a": {"type": "string", "minLength": 1}, "b": {"type": "string", "format": "uuid"}}, '{"a":"x"}'),
    ({"a": {"type": "string", "minLength": 1}, "b": {"type": "string", "pattern": UUID_PATTERN}}, '{"a":"x"}'),
    ({"e": {"type": "string", "minLength": 3}, "d": {"type": "string", "format": "date"}}, '{"e":"xxx"}'),
    ({"s": {"type": "string", "minLength": 10}}, '{"s":"xxxxxxxxxx"}'),
    ({"x": {"enum": ["alpha beta gamma delta", "z"]}}, '{"x":"z"}'),
    ({"x": {"enum": ["go", "update", "unpublish_edition"]}}, '{"x":"go"}'),
    ({"x": {"enum": ["tools/call", "ping", "prompts/get"]}}, '{"x":"ping"}'),
    ({"x": {"enum": ["DISABLE", "REQUIRE", "VERIFY_CA", "VERIFY_FULL"]}}, '{"x":"DISABLE"}'),
    ({"x": {"enum": ["\\", "zzzzzzz"]}}, '{"x":"\\\\"}'),
    ({"v": {"anyOf": [{"type": "string", "minLength": 5}, {"type": "integer", "minimum": 7}]}}, '{"v":7}')])
def test_a_string_closes_within_a_budget_of_the_shortest_document(properties, shortest, qwen2_llguidance, tokenizers,
                                                                  vocabs):
    """The closing walk filled a string that may not be empty with a whole hint of the schema's, whichever string
    it came from (another property's uuid), `minLength: 10` with `}}}}]]]],""`, and an enum with its first
    value: its completion overestimated, and at a budget of the shortest document up to 10 answers in 10 were cut
    (QA budget F1, F2). A string is now filled with a run of the byte the vocabulary spells in the fewest tokens,
    and a string's first byte is, of those that fit, one that forces the least."""
    tok, vocab = tokenizers["qwen2"], vocabs["qwen2"]
    schema = {"type": "object", "properties": properties, "required": [next(iter(properties))]}
    grammar = qwen2_llguidance.compile(ConstraintSpec(kind="json_schema", schema=schema))
    budget = len(tok.encode(shortest, add_special_tokens=False))
    rng = random.Random(0)
    for _ in range(12):
        toks, ended = random_walk(grammar, vocab, rng, budget, budget=True)
        assert ended, vocab_bytes(vocab, toks)
        jsonschema.validate(json.loads(decode(vocab, toks)), schema)


def vocab_bytes(vocab, toks: list[int]) -> bytes:
    """What a walk wrote, as bytes (a walk cut short may end inside a character)."""
    return b"".join(vocab.token_bytes[t] or b"" for t in toks)


def test_a_required_tool_call_closes_within_a_budget_of_the_shortest_call(qwen2_llguidance, tokenizers, vocabs):
    """Every call began with the function whose name came first in the byte order (`get_weather`), whose required
    arguments took more tokens than were left, where a call of `ping` fitted: at the budget of that call, every
    answer was cut (QA budget F2); so again beside `post_message`, whose `p` leaves two names open (QA
    budgetsweep2 F1)."""
    tok, vocab = tokenizers["qwen2"], vocabs["qwen2"]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "minLength": 2}, "units": {"enum": ["c", "f"]}},
        "required": ["city", "units"]}}},
             {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}},
             {"type": "function", "function": {"name": "post_message", "parameters": {
                 "type": "object", "properties": {"text": {"type": "string", "minLength": 3}}, "required": ["text"]}}}]
    grammar = qwen2_llguidance.compile(spec_from_request(tools=tools, tool_choice="required"))
    budget = len(tok.encode('[{"name":"ping","arguments":{}}]', add_special_tokens=False))
    rng = random.Random(0)
    for _ in range(12):
        toks, ended = random_walk(grammar, vocab, rng, budget, budget=True)
        assert ended, vocab_bytes(vocab, toks)
        assert {call["name"] for call in json.loads(decode(vocab, toks))} <= {"get_weather", "ping"}


@pytest.mark.parametrize("schema, shortest", [
    ({"type": "object", "properties": {"s": {"enum": ["get_weather", "ping"]}, "loc": {"type": "string"}},
      "required": ["s"], "if": {"properties": {"s": {"const": "ping"}}}, "then": {"required": ["loc"]}},
     '{"s":"get_weather"}'),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 42}, "x": {"type": "string"}},
      "required": ["n"], "if": {"properties": {"n": {"maximum": 99}}}, "then": {"required": ["x"]}}, '{"n":100}'),
    ({"type": "object", "properties": {"code": {"type": "string", "minLength": 1}, "reason": {"type": "string"}},
      "required": ["code"], "if": {"properties": {"code": {"pattern": "^-"}}}, "then": {"required": ["reason"]}},
     '{"code":"}"}')])
def test_a_short_value_that_makes_the_rest_longer_is_not_the_walk_s_choice(schema, shortest, qwen2_llguidance,
                                                                          tokenizers, vocabs):
    """The shortest value of its own (`"ping"`, `90`, a filler `"-"`) made an `if`/`then` require another property:
    the completion took 8 tokens where `{"s":"get_weather"}` closed in 6, and at that budget every answer was cut
    (QA review F1). The walk keeps the shorter of the completions with and without such choices."""
    tok, vocab = tokenizers["qwen2"], vocabs["qwen2"]
    grammar = qwen2_llguidance.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "s", "schema": schema, "strict": True}}))
    budget = len(tok.encode(shortest, add_special_tokens=False))
    assert grammar.matcher().min_tokens_to_end() <= budget
    rng = random.Random(0)
    for _ in range(8):
        toks, ended = random_walk(grammar, vocab, rng, budget, budget=True)
        assert ended, vocab_bytes(vocab, toks)
        jsonschema.validate(json.loads(decode(vocab, toks)), schema)


@pytest.mark.parametrize("tokens_left", [3, 4])
def test_a_completion_carried_into_a_two_digit_exponent_is_not_one_that_lengthens_it(tokens_left, qwen2_llguidance,
                                                                                     tokenizers, vocabs):
    """The completion `0}` measured after `-5e` was carried on as each digit came (llguidance's number takes any
    exponent); past `-5e51` its `0` makes a third digit, which the distinct-keys check refuses. Vetting a `,` with
    two tokens left, the rule offered that `0`, the check refused it, the `,` stood, and the answer was cut at
    max_tokens where `}` fitted (QA budget F5)."""
    tok, vocab = tokenizers["qwen2"], vocabs["qwen2"]
    grammar = qwen2_llguidance.compile(ConstraintSpec(kind="json_schema", schema={
        "type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}))
    ids = vocab.ids_by_bytes()
    prefix = tok.encode('{"x": -5e', add_special_tokens=False)
    out = offered_walk(grammar, vocab, prefix, [ids[b"5"], ids[b"1"]] + [ids[b","]] * 4, tokens_left)
    assert tok.decode(prefix + out, skip_special_tokens=True) == '{"x": -5e51}'


@pytest.mark.parametrize("keyword", ["anyOf", "oneOf"])
def test_the_key_a_completion_writes_picks_the_branch_that_requires_least(keyword, qwen2_llguidance, tokenizers,
                                                                          vocabs):
    """The closing walk wrote the shortest required name first, `a`, which picked the branch that requires four
    keys: a completion of 11 tokens where `{"xyz":0}` closes in 5, so answers that fitted a budget between the two
    were cut, and tokens that fitted were refused (QA budget F7). Names of the smallest `required` list come first."""
    tok, vocab = tokenizers["qwen2"], vocabs["qwen2"]
    schema = {"type": "object", keyword: [
        {"properties": {"a": {"type": "string"}, "bb": {"type": "string"}, "cc": {"type": "string"},
                        "dd": {"type": "integer"}}, "required": ["a", "bb", "cc", "dd"]},
        {"properties": {"xyz": {"type": "integer"}}, "required": ["xyz"]}]}
    grammar = qwen2_llguidance.compile(ConstraintSpec(kind="json_schema", schema=schema))
    budget = len(tok.encode('{"xyz":0}', add_special_tokens=False))
    assert grammar.matcher().min_tokens_to_end() == budget
    rng = random.Random(0)
    for _ in range(6):
        toks, ended = random_walk(grammar, vocab, rng, budget, budget=True)
        assert ended, decode(vocab, toks)
        jsonschema.validate(json.loads(decode(vocab, toks)), schema)


def test_a_completion_closes_no_key_that_ends_in_a_newline_where_such_keys_are_refused(qwen2_llguidance, vocabs):
    """Keys of at least 4 characters holding an `a` and a `b`, in an object whose `^.{1,3}$` pattern (with a `$`)
    makes the distinct-keys check refuse keys ending in a newline (JSONSchemaBench Handwritten allOfPProp1). The
    closing walk met `^.{1,3}$: false` with `"ba\\n"` (`.` takes no newline), and a completion was carried on after
    a sampled newline: the rule offered the quote that closes such a key, the check refused it, the sampled token
    stood, and answers were cut at max_tokens (7 random walks in 72 at budgets of the shortest document)."""
    vocab = vocabs["qwen2"]
    schema = {"type": "object", "allOf": [
        {"patternProperties": {"^.{1,3}$": False}, "additionalProperties": True},
        {"patternProperties": {"a": True}, "additionalProperties": False},
        {"patternProperties": {"b": True}, "additionalProperties": False}], "minProperties": 4}
    grammar = qwen2_llguidance.compile(spec_from_request(response_format={"type": "json_schema", "json_schema": {
        "name": "s", "schema": schema, "strict": True}}))
    shortest = grammar.matcher().min_tokens_to_end()
    rng = random.Random(0)
    for extra in range(6):
        for _ in range(3):
            toks, ended = random_walk(grammar, vocab, rng, shortest + extra, budget=True)
            assert ended, b"".join(vocab.token_bytes[t] for t in toks)
            jsonschema.validate(json.loads(decode(vocab, toks)), schema)
