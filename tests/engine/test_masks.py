"""Every row respects its own grammar in a mixed batch (regex, choice, JSON schema, unconstrained), with the
real constraint compiler (llguidance and outlines-core backends) on the built-in Qwen2 vocabulary."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import jsonschema
import pytest
import torch

from constrain import ConstraintSpec, Grammar, GrammarCompiler, Matcher, Vocabulary
from engine import Engine
from tests.engine.driver import collect_events, request, run_all, run_one

PROMPT = list(range(1000, 1012))
REGEX = r"[0-9]{3}-[a-z]{2}"
CHOICES = ("yes", "no", "maybe")
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["a", "b", "c"],
          "properties": {"a": {"enum": [0, 7, 42]},
                         "b": {"type": "string", "maxLength": 5}, "c": {"type": "boolean"}}}


@pytest.fixture(scope="module")
def compilers(builtin):
    vocab = Vocabulary.from_tokenizer(builtin.tokenizer, builtin.logits_width, builtin.eos_token_ids)
    # (a time limit of its own, as tests/constrain's compilers have: the default 60 s build of SCHEMA in a niced
    # worker ran out on a loaded 2-core machine, and these tests are about masks, not build times)
    made = {b: GrammarCompiler(vocab, builtin.tokenizer, backend=b, background_outlines=False, compile_timeout_s=300)
            for b in ("llguidance", "outlines")}
    yield made
    for c in made.values():
        c.close()


def replay_respects_mask(grammar, tokens: list[int], eos_ids, width: int) -> bool:
    """Walk the sampled tokens through a fresh matcher: each must be allowed by the mask of its position."""
    m = grammar.matcher()
    bitmask = torch.zeros((1, (width + 31) // 32), dtype=torch.int32)
    for tok in tokens:
        m.fill_bitmask(bitmask, 0)
        if not (int(bitmask[0, tok // 32]) >> (tok % 32)) & 1:
            return False
        if tok in eos_ids:
            return True
        if not m.accept(tok):
            return False
    return True


@pytest.fixture(params=[(True, 1), (False, 1), (True, 4)],
                ids=["fill-during-forward", "fill-after-forward", "four-mask-threads"])
def fill_engine(builtin, request):
    overlap, threads = request.param
    eng = Engine(builtin, max_batch_size=8, overlap_fill=overlap, mask_threads=threads)
    eng.start()
    yield eng
    eng.shutdown()


@pytest.mark.parametrize("backend", ["llguidance", "outlines"])
def test_every_row_respects_its_own_mask_in_a_mixed_batch(fill_engine, builtin, compilers, backend):
    engine, compiler = fill_engine, compilers[backend]
    regex = compiler.compile(ConstraintSpec(kind="regex", pattern=REGEX))
    choice = compiler.compile(ConstraintSpec(kind="choice", choices=CHOICES))
    schema = compiler.compile(ConstraintSpec(kind="json_schema", schema=SCHEMA))
    sampled = dict(temperature=1.0, max_tokens=40)
    results = run_all(
        engine,
        request("regex", PROMPT, grammar=regex, seed=1, **sampled),
        request("free", PROMPT, seed=2, **sampled),
        request("choice", PROMPT, grammar=choice, seed=3, n=2, **sampled),
        request("schema", list(range(5000, 5020)), grammar=schema, seed=4, **sampled),
        request("greedy-schema", PROMPT, grammar=schema, temperature=0.0, max_tokens=60),
    )
    by_name = dict(zip(["regex", "free", "choice", "schema", "greedy-schema"], results))
    assert re.fullmatch(REGEX, by_name["regex"][0].text)
    for c in by_name["choice"].values():
        assert c.text in CHOICES and c.last.finish_reason == "stop"
    for name in ("schema", "greedy-schema"):
        doc = json.loads(by_name[name][0].text)
        jsonschema.validate(doc, SCHEMA)
        assert by_name[name][0].last.finish_reason == "stop"
    assert by_name["free"][0].last.finish_reason == "length" and len(by_name["free"][0].tokens) == 40
    assert not re.fullmatch(REGEX, by_name["free"][0].text)
    for name, grammar in (("regex", regex), ("schema", schema), ("greedy-schema", schema)):
        assert replay_respects_mask(grammar, by_name[name][0].tokens, builtin.eos_token_ids, builtin.logits_width)
    for c in by_name["choice"].values():
        assert replay_respects_mask(choice, c.tokens, builtin.eos_token_ids, builtin.logits_width)


def test_constrained_request_gives_the_same_tokens_alone_and_in_a_batch(engine, compilers):
    schema = compilers["llguidance"].compile(ConstraintSpec(kind="json_schema", schema=SCHEMA))
    target = request("t", PROMPT, grammar=schema, temperature=1.0, seed=11, max_tokens=60)
    (alone,) = run_all(engine, target)
    batched, _, _ = run_all(engine, target, request("x", PROMPT, temperature=1.0, max_tokens=30),
                            request("y", list(range(7000, 7040)), grammar=schema, temperature=0.0, max_tokens=60))
    assert batched[0].tokens == alone[0].tokens


@pytest.mark.parametrize("threads", [1, 4])
def test_a_request_gets_the_same_tokens_whichever_mask_threads_fill_its_rows(builtin, compilers, threads):
    """Rows of four lanes, filled at once on four threads (llguidance's parses per lane, outlines' shared rows),
    give each request the tokens it gets alone, as rows filled one at a time do."""
    grammars = [compilers[b].compile(ConstraintSpec(kind="json_schema", schema=SCHEMA)) for b in ("llguidance",
                                                                                               "outlines")]
    targets = [request(f"t{i}", list(range(1000 + 50 * i, 1012 + 50 * i)), grammar=grammars[i % 2],
                       temperature=1.0, seed=20 + i, max_tokens=40) for i in range(6)]
    eng = Engine(builtin, max_batch_size=8, overlap_fill=True, mask_threads=threads)
    eng.start()
    try:
        alone = [run_all(eng, t)[0] for t in targets]
        together = run_all(eng, *targets)
    finally:
        eng.shutdown()
    assert [c[0].tokens for c in together] == [c[0].tokens for c in alone]
    for c in together:
        jsonschema.validate(json.loads(c[0].text), SCHEMA)


def test_a_new_grammars_first_rows_move_to_their_lanes_parses_and_keep_their_tokens(builtin, compilers, monkeypatch):
    """A burst of requests for a new schema makes its rows before their lanes' parses come (their matchers copy
    lane 0's, and wait for its lexer): each moves to its lane's own parse at a fill after that came, its output so
    far replayed, and every request gets the tokens it gets alone."""
    from constrain.llg_backend import LlgGrammar, LlgMatcher

    parse_may_end, accepted, moved = threading.Event(), [], []
    real_parse, real_accept, real_replayed = LlgGrammar._parse_lane, LlgMatcher.accept, LlgMatcher._replayed

    def accept(self, token_id):
        accepted.append(token_id)
        if len(accepted) == 12:  # (three tokens a row: the lanes' parses come while the outputs are under way)
            parse_may_end.set()
        return real_accept(self, token_id)

    monkeypatch.setattr(LlgGrammar, "_parse_lane",
                        lambda self, lane, text: parse_may_end.wait(60) and real_parse(self, lane, text))
    monkeypatch.setattr(LlgMatcher, "accept", accept)
    monkeypatch.setattr(LlgMatcher, "_replayed", lambda self: moved.append(self._lane) or real_replayed(self))
    schema = dict(SCHEMA, title="a schema not compiled before")
    grammar = compilers["llguidance"].compile(ConstraintSpec(kind="json_schema", schema=schema))
    targets = [request(f"b{i}", list(range(2000 + 30 * i, 2012 + 30 * i)), grammar=grammar, temperature=1.0,
                       seed=40 + i, max_tokens=40) for i in range(4)]
    results = {}
    for threads in (4, 1):
        eng = Engine(builtin, max_batch_size=8, overlap_fill=True, mask_threads=threads)
        eng.start()
        try:
            results[threads] = run_all(eng, *targets) if threads == 4 else [run_all(eng, t)[0] for t in targets]
        finally:
            eng.shutdown()
        if threads == 4:
            assert sorted(set(moved)) == [1, 2, 3]
    assert [c[0].tokens for c in results[4]] == [c[0].tokens for c in results[1]]
    for c in results[4]:
        jsonschema.validate(json.loads(c[0].text), SCHEMA)


class _MeetingMatcher(Matcher):
    """Allows every token; its first fill waits at `barrier` for the other rows' first fills and notes the thread
    it ran on: the barrier is passed only if the rows are filled at the same time."""

    def __init__(self, barrier, threads: list[str]):
        self.barrier, self.threads = barrier, threads

    def fill_bitmask(self, bitmask, row, tokens_left=None):
        if len(self.threads) < self.barrier.parties:
            self.threads.append(threading.current_thread().name)
            self.barrier.wait()
        bitmask[row].fill_(-1)

    def accept(self, token_id):
        return True

    def is_terminated(self):
        return False

    def can_end(self):
        return True


def test_the_rows_of_different_lanes_are_filled_at_once_on_their_own_threads(builtin):
    """Four rows on four mask threads (a request's four choices, which join together): each is made on its own
    lane, and their rows are filled by four threads at once (one thread after another, the first would wait at
    the barrier until it broke)."""
    barrier, threads = threading.Barrier(4, timeout=60), []
    grammar = _TestGrammar(lambda: _MeetingMatcher(barrier, threads))
    eng = Engine(builtin, max_batch_size=8, mask_threads=4)
    eng.start()
    try:
        (choices,) = run_all(eng, request("r", PROMPT, grammar=grammar, n=4, temperature=1.0, max_tokens=3))
    finally:
        eng.shutdown()
    assert all(choices[i].last.finish_reason in ("stop", "length") for i in range(4))  # (not "error")
    assert len(set(threads)) == 4 and not barrier.broken


def test_a_constrained_request_joining_an_unconstrained_batch_gets_its_mask(fill_engine, compilers):
    """The newcomer is the only constrained row: on the step it joins and after, the running row's mask row must
    allow everything (its tokens are those it gets alone) and the newcomer's must be its grammar's."""
    schema = compilers["llguidance"].compile(ConstraintSpec(kind="json_schema", schema=SCHEMA))
    free = request("free", PROMPT, temperature=1.0, seed=8, max_tokens=30)

    async def main():
        joined, events = None, []
        async for ev in fill_engine.generate(free):
            events.append(ev)
            if joined is None:
                joined = asyncio.create_task(run_one(fill_engine, request(
                    "late", list(range(5000, 5020)), grammar=schema, temperature=1.0, seed=9, max_tokens=60)))
        return collect_events(events), await joined

    (alone,) = run_all(fill_engine, free)
    batched, late = asyncio.run(main())
    assert batched[0].tokens == alone[0].tokens and batched[0].last.finish_reason == "length"
    jsonschema.validate(json.loads(late[0].text), SCHEMA)
    assert late[0].last.finish_reason == "stop"


class _ReplacingMatcher(Matcher):
    """Allows every token, and vets every sampled token into `token`: the engine must append the vetted one."""

    def __init__(self, token: int):
        self.token = token

    def fill_bitmask(self, bitmask, row, tokens_left=None):
        bitmask[row].fill_(-1)

    def vet(self, token_id, tokens_left):
        return self.token

    def accept(self, token_id):
        return token_id == self.token

    def is_terminated(self):
        return False

    def can_end(self):
        return True


class _TestGrammar(Grammar):
    """Hands out the matchers `make` builds: a grammar for test matchers."""

    backend = "test"

    def __init__(self, make):
        self.make = make

    def matcher(self, lane=0):
        return self.make()


def test_a_vetted_token_is_appended_with_its_own_raw_logprob(engine, builtin):
    token = 4000
    grammar = _TestGrammar(lambda: _ReplacingMatcher(token))
    (out,) = run_all(engine, request("v", PROMPT, grammar=grammar, temperature=1.0, seed=3, max_tokens=3,
                                     logprobs=True))
    assert out[0].tokens == [token] * 3
    with torch.inference_mode():
        logits = builtin.model(torch.tensor([PROMPT + [token] * 2], device=builtin.device)).logits[0, -3:].float()
    from constrain.vocabulary import unsampled_ids

    pads = torch.tensor(unsampled_ids(builtin.tokenizer, builtin.logits_width), device=logits.device)
    logits = logits.index_fill(-1, pads, float("-inf"))  # (no token: never listed)
    expected = torch.log_softmax(logits, -1)[:, token].tolist()
    got = [lp for ev in out[0].events for lp in ev.logprobs]
    assert [lp.token_id for lp in got] == [token] * 3
    assert all(abs(lp.logprob - e) < 1e-4 for lp, e in zip(got, expected))


class _RefusingReplacingMatcher(_ReplacingMatcher):
    """Vets every sampled token into `token`, which its own mask refuses (as llguidance's budget rule spelled
    Phi-3's `</s>` with the added token its mask never allows)."""

    def fill_bitmask(self, bitmask, row, tokens_left=None):
        bitmask[row].fill_(-1)
        bitmask[row, self.token >> 5] &= ~(1 << (self.token & 31))

    def accept(self, token_id):
        return token_id != self.token


def test_a_vetted_token_the_mask_refuses_leaves_the_sampled_token(engine):
    """The budget rule's replacement is taken only where this step's mask allows it: one it refused was appended,
    the grammar refused it, and the request ended with a 500 'token ... was sampled but the grammar rejected it'."""
    grammar = _TestGrammar(lambda: _RefusingReplacingMatcher(4000))
    (out,) = run_all(engine, request("v", PROMPT, grammar=grammar, temperature=1.0, seed=3, max_tokens=4))
    assert out[0].last.finish_reason in ("stop", "length") and out[0].tokens and 4000 not in out[0].tokens


class PanicException(BaseException):
    """What pyo3 raises for a panic in a Rust extension (llguidance, outlines-core, rpds under jsonschema): a
    BaseException, not an Exception."""


class _FailingMatcher(_ReplacingMatcher):
    """Raises `error` in `where` ("fill", "vet" or "accept") on the third step, like a backend bug would."""

    def __init__(self, where: str, error: type[BaseException] = RuntimeError):
        super().__init__(token=0)
        self.where, self.error, self.steps = where, error, 0

    def fill_bitmask(self, bitmask, row, tokens_left=None):
        self.steps += 1
        if self.where == "fill" and self.steps == 3:
            raise self.error("fill broke")
        bitmask[row].fill_(-1)

    def vet(self, token_id, tokens_left):
        if self.where == "vet" and self.steps == 3:
            raise self.error("vet broke")
        return token_id

    def accept(self, token_id):
        if self.where == "accept" and self.steps == 3:
            raise self.error("accept broke")
        return True


@pytest.mark.parametrize("error", [RuntimeError, PanicException])
@pytest.mark.parametrize("where", ["fill", "vet", "accept"])
def test_a_failing_grammar_ends_its_choice_with_an_error_and_the_batch_goes_on(fill_engine, where, error):
    """A panic too: one in rpds (a RecursionError in jsonschema's reference lookup, while a late check validated a
    value) ended the engine thread, and every later request hung."""
    plain = request("plain", PROMPT, temperature=1.0, seed=5, max_tokens=12)
    (alone,) = run_all(fill_engine, plain)
    grammar = _TestGrammar(lambda: _FailingMatcher(where, error))
    broken, together = run_all(fill_engine, request("broken", PROMPT, grammar=grammar, temperature=1.0,
                                                    max_tokens=12), plain)
    assert broken[0].last.finish_reason == "error" and broken[0].last.error_code == "internal"
    assert f"{where} broke" in broken[0].last.error
    assert len(broken[0].tokens) == 2  # two good steps, then the failure
    assert together[0].tokens == alone[0].tokens and together[0].last.finish_reason == "length"
