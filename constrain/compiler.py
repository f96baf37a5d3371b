"""GrammarCompiler: ConstraintSpec -> Grammar, off the event loop, cached in memory (LRU bounded in bytes) and on disk.

The `auto` policy (measured, see README): llguidance compiles any schema in milliseconds, outlines-core takes
seconds on a 152k vocabulary. So a new constraint is served by llguidance; when it is requested a second time and
outlines can enforce it exactly, an outlines compile starts in the background and, once done (memory and disk
cache), serves the later repeats (cached mask rows, exact budget rule). When llguidance refuses a constraint that
outlines enforces exactly, outlines serves it (waiting for the compile). When both refuse: ConstraintError.
Outlines builds run in worker processes (constrain/compile_worker.py): killed at the time limit, capped in
memory, at the lowest CPU priority. A failed outlines build is remembered, so repeats never rebuild it.
Never imports HTTP or model code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import logging
import re
import shutil
import tempfile
import threading
import time
import unicodedata
import weakref
import zipfile
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from constrain.args_calls import ArgsCallsGrammar
from constrain.call_token import CallTokenGrammar
from constrain.compile_worker import BuildFailed, BuildTimeout, CompileWorkers
from constrain.disk_cache import DiskCache
from constrain.distinct_keys import (DistinctKeysGrammar, comma_key_index, exponent_index, names_restricted,
                                    newline_names_refused)
from constrain.either import EitherGrammar
from constrain.grammar import ConstraintError, ConstraintSpec, Grammar
from constrain.harmony import HarmonyGrammar, HarmonyTokens
from constrain.late_keywords import (COUNT_REFUSAL, ONE_OF_REFUSAL, REFUSALS, LateGrammar, LatePlan,
                                     late_from_the_start, plan_late_keywords, token_sets)
from constrain.limits import read_json
from constrain.llg_backend import (build_lltokenizer, compile_calls_or_text, compile_hermes_calls, compile_llg,
                                   compile_xml_calls, json_call_names, takes_nothing)
from constrain.outlines_backend import OutlinesGrammar, TokenDFA, core_regex_length, schema_regex
from constrain.pattern_dialects import portable_pattern, python_pattern, schema_patterns, without_edge_anchors
from constrain.plain_keys import PlainKeysGrammar, key_escape_tokens, keys_need_plain_spelling
from constrain.regex_sets import repeat_product
from constrain.support import (client_pointer, containers_only, outlines_unsupported, pointer_child, resolve_ref,
                               unescape_pointer_part, walk)
from constrain.tools import (HERMES_OPEN, LEAD_TAGS, LLAMA3_CALL_TAG, MISTRAL_ARGS, MISTRAL_CALLS, TOKEN_THEN_ARRAY,
                             TOOL_DEF, XML_FORMATS, call_item_schema, call_token_id, client_pointer_of_call,
                             free_text_pattern, function_schema, hermes_regex, text_may_not_start)
from constrain.unique_items import UniqueItemsGrammar, UniquePlan, plan_unique_items, token_index
from constrain.unique_objects import UniqueObjectsGrammar, plan_unique_objects
from constrain.vocabulary import Vocabulary
from constrain.xml_calls import as_the_client_wrote

log = logging.getLogger(__name__)

BACKENDS = ("auto", "outlines", "llguidance")
_REQUEST_THREADS = 32  # compiles of requests at once, most of them waiting (see GrammarCompiler.__init__)
_JSON_KINDS = ("json_schema", "json_object", "tools")  # (JSON output: `_on_backend` keeps its keys distinct)


@dataclass
class CompileStats:
    compiles: int = 0
    cache_hits: int = 0
    disk_hits: int = 0
    errors: int = 0
    compile_seconds_total: float = 0.0  # what requests' compiles took (a wait on an outlines build included)
    outlines_builds: int = 0  # outlines automata builds started, in the background (the auto policy) or not
    build_seconds_total: float = 0.0  # what those builds took, failed and timed-out ones included
    outlines_failures: int = 0  # builds that failed or ran past the time limit (remembered: never built again)


def choice_regex(choices: tuple[str, ...]) -> str:
    """An alternation of literal strings, escaped for the Rust regex syntax both backends use."""
    def esc(s: str) -> str:
        return "".join("\\" + c if c in "\\.^$|?*+()[]{}-&~#" else c for c in s)
    return "(" + "|".join(esc(c) for c in choices) + ")"


def _entry_beginning_another(choices: tuple[str, ...]) -> tuple[str, str] | None:
    """Two entries, the first a proper prefix of the second, if any: outlines-core 0.2.14 drops some of its
    automaton's transitions out of an accepting state (`["a", "ab"]` and `["a", "a.b"]` could only answer `a`; QA
    regex F2).
    (In sorted order an entry that begins another begins the entry right after it.)"""
    ordered = sorted(choices)
    return next(((a, b) for a, b in zip(ordered, ordered[1:]) if b.startswith(a) and a != b), None)


class _LRU:
    """Grammars by key, evicting least recently used beyond `max_bytes` or `max_entries`. Each grammar reports its
    size (`nbytes`), which may grow while it is cached (an llguidance grammar parses a lane per mask thread as rows
    use them; an outlines grammar writes a mask row for each state decoding visits): every size is read again each
    time the cache is used, so rows written after a schema's last lookup count too (~1 ms for 8,192 grammars). The
    bound on entries holds the cache however far a size is off."""

    def __init__(self, max_bytes: int, max_entries: int = 8192):
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.bytes = 0
        self._d: OrderedDict[str, Grammar] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Grammar | None:
        with self._lock:
            g = self._d.get(key)
            if g is None:
                return None
            self._count(key, g)
            return g

    def put(self, key: str, g: Grammar) -> None:
        with self._lock:
            self._count(key, g)

    def _count(self, key: str, g: Grammar) -> None:
        """`g` under `key`, most recently used; every size counted as it is now; evicts beyond the bounds."""
        self._d.pop(key, None)
        self._d[key] = g
        sizes = {k: grammar.nbytes for k, grammar in self._d.items()}
        self.bytes = sum(sizes.values())
        while (self.bytes > self.max_bytes or len(self._d) > self.max_entries) and len(self._d) > 1:
            evicted, _ = self._d.popitem(last=False)
            self.bytes -= sizes[evicted]

    def __len__(self) -> int:
        return len(self._d)


class GrammarCompiler:
    """Compiles specs for one vocabulary. Thread-safe; `compile_async` never blocks the event loop."""

    def __init__(self, vocab: Vocabulary, tokenizer, *, backend: str = "auto", cache_dir: Path | None = None,
                 schemas_dir: Path | None = None, max_workers: int = 2, compile_timeout_s: float = 60.0,
                 whitespace_pattern: str = "[ ]?", lru_max_bytes: int = 512 << 20, disk_max_bytes: int = 4 << 30,
                 background_outlines: bool = True,
                 max_outlines_regex_chars: int = 30_000, max_outlines_repeat: int = 24,
                 compile_memory_mb: int = 8192):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}")
        self.vocab = vocab
        self.tokenizer = tokenizer
        self.backend = backend
        self.disk = (DiskCache.open(Path(cache_dir), vocab.fingerprint, code_fingerprint(), disk_max_bytes)
                     if cache_dir else None)
        self.schemas_dir = Path(schemas_dir) if schemas_dir else None
        self.compile_timeout_s = compile_timeout_s
        self.whitespace_pattern = whitespace_pattern
        self.background_outlines = background_outlines
        self.max_outlines_regex_chars = max_outlines_regex_chars
        self.max_outlines_repeat = max_outlines_repeat
        self.stats = CompileStats()
        self._lru = _LRU(lru_max_bytes)
        # Request threads: compile_async awaits outlines builds off them (`compile` blocking on one, as many as
        # the build workers left a new schema on llguidance waiting behind two builds for a minute: helper-20).
        # The builds are bounded by the workers.
        self._requests = ThreadPoolExecutor(max_workers=max(_REQUEST_THREADS, max_workers),
                                            thread_name_prefix="grammar-compile")
        self._builds = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="outlines-index")
        self.workers = CompileWorkers(vocab.token_bytes, vocab.eos_token_ids, max_workers=max_workers,
                                      memory_mb=compile_memory_mb)
        self._pending: dict[str, Future] = {}  # outlines builds under way
        self._began: dict[str, float] = {}  # when each build under way began, its worker ready (time.monotonic)
        self._waiters: dict[str, int] = {}  # outlines key -> requests awaiting its build (`compile_async`)
        self._local = threading.local()  # `waited`, `seen`: of the compile_async compile on this thread
        self._llg_pending: dict[str, Future] = {}  # llguidance compiles under way (`_llg`)
        self._failed: OrderedDict[str, ConstraintError] = OrderedDict()  # outlines builds that failed, bounded
        self._seen_once: OrderedDict[str, None] = OrderedDict()  # outlines keys requested once so far, bounded
        self._outlines_policy: OrderedDict[str, bool] = OrderedDict()  # outlines key -> auto may serve it, bounded
        self._unique_plans: OrderedDict[str, tuple] = OrderedDict()  # by spec key, bounded (`_unique_plan`)
        self._late_plans: OrderedDict[str, LatePlan] = OrderedDict()  # specs whose backend refused a keyword
        self._no_stronger_plan: OrderedDict[str, None] = OrderedDict()  # non-strict specs the checks add nothing to
        # id() of a backend grammar -> its distinct-keys wrapper, while that lives (it holds the grammar, so the id
        # stays that grammar's; a dict keyed by the grammar itself would hold both for ever)
        self._distinct_keys: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        self._lltok = None
        self._harmony_tokens: HarmonyTokens | None = None
        self._tmp_dir: str | None = None
        self.named_schemas: dict[str, dict] = self._load_named()

    # ---- public -------------------------------------------------------------------------------------------
    def compile(self, spec: ConstraintSpec) -> Grammar:
        """Blocking compile (or cache hit). Raises ConstraintError on refusal, failure, limits or time-out."""
        backend = spec.backend if spec.backend in BACKENDS else self.backend  # (a request's "auto" is the policy)
        if spec.kind == "json_schema" and spec.schema is False:
            self.stats.errors += 1
            raise ConstraintError("cannot compile constraint: Unsatisfiable schema: it is `false`, or rewrites to "
                                  "`false` (such as {\"not\": {}}): no JSON document satisfies it",
                                  param=spec.param)
        if spec.kind == "tools" and spec.answer is not None:
            return self._calls_or_answer(spec)
        if spec.kind == "tools" and spec.tool_format in TOKEN_THEN_ARRAY:
            return self._after_call_token(spec)
        if spec.kind == "tools" and spec.tool_format == "mistral_args":
            return self._args_calls(spec)
        if spec.kind == "tools" and spec.tool_format == "harmony":
            return self._harmony_calls(spec)
        if spec.kind == "tools" and spec.tool_format in XML_FORMATS:
            return self._xml_calls(spec, backend)
        g = self._compile_one(spec, backend)
        if spec.kind == "tools" and spec.tool_format == "llama3_json":
            return self._python_tag_optional(spec, g, backend)
        return g

    def _compile_one(self, spec: ConstraintSpec, backend: str) -> Grammar:
        """The spec's grammar on `backend` (or by the auto policy), with the checks applied while decoding."""
        t0 = time.perf_counter()
        try:
            plan, objects = self._unique_plan(spec)
            if plan is not None:  # the backend compiles the schema without the uniqueItems the engine enforces
                spec = dataclasses.replace(spec, schema=plan.schema)
            g = self._with_late_keywords(spec, backend)
            g = UniqueItemsGrammar(g, plan, self.vocab) if plan is not None else g
            return UniqueObjectsGrammar(g, objects, self.vocab.token_bytes) if objects is not None else g
        except ConstraintError as exc:
            self.stats.errors += 1
            raise _in_client_terms(exc, spec) from None
        finally:
            self.stats.compile_seconds_total += time.perf_counter() - t0

    def _python_tag_optional(self, spec: ConstraintSpec, g: Grammar, backend: str) -> Grammar:
        """Llama 3's call (`g`), which the model may open with its `<|python_tag|>` token, as Llama 3.1 and 3.2
        sometimes do (their templates write it before calls to built-in tools): where the vocabulary has that
        token, the call may come with it or without."""
        token = call_token_id(self.tokenizer, LLAMA3_CALL_TAG)
        if token is None:
            return g
        auto = spec.tool_choice == "auto"
        calls = self._compile_one(dataclasses.replace(spec, tool_choice="required"), backend) if auto else g
        return CallTokenGrammar(calls, g, token, self.vocab)

    def _after_call_token(self, spec: ConstraintSpec) -> Grammar:
        """Calls in the "mistral" or "granite" format: the vocabulary's `[TOOL_CALLS]` (`<|tool_call|>`) token, then
        the calls as a JSON array (compiled, and cached, as that format's); under tool_choice "auto", or free text
        instead."""
        tag = LEAD_TAGS[spec.tool_format]
        token = call_token_id(self.tokenizer, tag)
        if token is None:
            self.stats.errors += 1
            raise ConstraintError(f"the {spec.tool_format} tool-call format needs {tag} to be one token of the "
                                  "model's vocabulary, and it is not", param="tools")
        auto = spec.tool_choice == "auto"
        calls = self.compile(dataclasses.replace(spec, tool_format="json_array",
                                                 tool_choice="required" if auto else spec.tool_choice))
        text = self.compile(ConstraintSpec(kind="regex", pattern=free_text_pattern(spec.tool_format),
                                           backend=spec.backend, extra={"param": "tools"})) if auto else None
        return CallTokenGrammar(calls, text, token, self.vocab)

    def _args_calls(self, spec: ConstraintSpec) -> Grammar:
        """Calls in the "mistral_args" format, `[TOOL_CALLS]name[ARGS]{arguments}`: the names as a choice, each
        function's parameters as a JSON schema (strict where the function is; errors and unenforced pointers
        name the entry of `tools`), and under tool_choice "auto" free text that calls may follow."""
        call_id, args_id = call_token_id(self.tokenizer), call_token_id(self.tokenizer, MISTRAL_ARGS)
        if call_id is None or args_id is None:
            self.stats.errors += 1
            raise ConstraintError(f"the mistral_args tool-call format needs {MISTRAL_CALLS} and {MISTRAL_ARGS} to be "
                                  "tokens of the model's vocabulary, and they are not", param="tools")
        arguments = self._function_grammars(spec)
        names = self.compile(ConstraintSpec(kind="choice", choices=spec.tool_names, backend=spec.backend,
                                            extra={"param": "tools"}))
        text = self.compile(ConstraintSpec(kind="regex", pattern=free_text_pattern("mistral_args"),
                                           backend=spec.backend, extra={"param": "tools"})) \
            if spec.tool_choice == "auto" else None
        return ArgsCallsGrammar(names, arguments, text, call_id, args_id, self.vocab,
                                many=spec.schema.get("maxItems") != 1, unenforced=_function_unenforced(arguments))

    def _function_grammars(self, spec: ConstraintSpec) -> dict[str, Grammar]:
        """Function name -> its parameters compiled as a JSON schema (strict where the function is; errors name the
        entry of `tools`), for the formats that write a call's name before its arguments."""
        arguments = {}
        for i, name in enumerate(spec.tool_names):
            one = ConstraintSpec(kind="json_schema", schema=function_schema(spec, i), strict=i in spec.strict_tools,
                                 backend=spec.backend, extra={"param": "tools"})
            try:
                arguments[name] = self.compile(one)
            except ConstraintError as exc:  # (told in terms of the call schema, then of `tools`)
                pointer = exc.pointer and f"/$defs/tool{i}{exc.pointer}"
                message = exc.message.replace(exc.pointer, pointer, 1) if exc.pointer else exc.message
                raise _in_client_terms(ConstraintError(message, param="tools", pointer=pointer, code=exc.code),
                                       spec) from None
        return arguments

    def harmony_tokens(self) -> HarmonyTokens:
        """The harmony format's tokens (constrain/harmony.py), built on first use."""
        with self._lock:
            if self._harmony_tokens is None:
                self._harmony_tokens = HarmonyTokens.for_tokenizer(self.tokenizer, self.vocab)
            return self._harmony_tokens

    def _calls_or_answer(self, spec: ConstraintSpec) -> Grammar:
        """Tools and a response_format under tool_choice "auto": calls, or an answer under the response_format
        (constrain/either.py; in harmony, the final message under it)."""
        answer = self.compile(spec.answer)  # (its errors name `response_format`)
        if spec.tool_format == "harmony":
            return self._harmony_calls(dataclasses.replace(spec, answer=None), answer)
        return EitherGrammar(self.compile(dataclasses.replace(spec, tool_choice="required", answer=None)), answer)

    def _harmony_calls(self, spec: ConstraintSpec, answer: Grammar | None = None) -> Grammar:
        """Calls in gpt-oss's harmony format (constrain/harmony.py): one call, after any reasoning, its arguments
        under its function's grammar; under tool_choice "auto" a final message instead, of free text or under
        `answer`."""
        try:
            tokens = self.harmony_tokens()
        except ConstraintError as exc:
            self.stats.errors += 1
            raise ConstraintError(exc.message, param="tools") from None
        arguments = self._function_grammars(spec)
        final = spec.tool_choice == "auto"
        if final and answer is None:  # (free text, which may not spell a call's header: `free_text_pattern`)
            answer = self.compile(ConstraintSpec(kind="regex", pattern=free_text_pattern("harmony"),
                                                 backend=spec.backend, extra={"param": "tools"}))
        return HarmonyGrammar(answer, arguments, final=final, tokens=tokens, vocab=self.vocab,
                              unenforced=_function_unenforced(arguments))

    def _xml_calls(self, spec: ConstraintSpec, backend: str) -> Grammar:
        """Calls in the "qwen3_coder", "glm45" or "glm47" format (constrain/xml_calls.py): one llguidance grammar,
        which writes the tags around values that may not be JSON; errors and unenforced pointers name the entry of
        `tools`."""
        if backend == "outlines":
            self.stats.errors += 1
            raise ConstraintError(f"the outlines backend cannot enforce the {spec.tool_format} tool-call format of "
                                  "this model's chat template; use the llguidance backend", param="tools",
                                  code="unsupported_schema")
        t0 = time.perf_counter()
        try:
            return self._llg(spec)
        except ConstraintError as exc:
            self.stats.errors += 1
            raise _in_client_terms(exc, spec) from None
        finally:
            self.stats.compile_seconds_total += time.perf_counter() - t0

    async def compile_async(self, spec: ConstraintSpec) -> Grammar:
        """`compile` on a request thread, which does not wait there for an outlines build: the build is awaited
        here, holding no thread, and the compile then runs again (finding the grammar, or the build's error where
        `compile` raises it). 33 requests naming outlines held all 32 request threads, so every other compile, a
        `choice` taking milliseconds too, waited for minutes behind the builds (QA hostile F2)."""
        loop = asyncio.get_running_loop()
        waited: dict[str, Future] = {}
        seen: set[str] = set()
        while True:
            try:
                return await loop.run_in_executor(self._requests, self._compile_not_waiting, spec, waited, seen)
            except _BuildPending as pending:
                done = await self._wait_for_build(pending.key, pending.build)
                if done is not None:
                    waited[pending.key] = done

    def _compile_not_waiting(self, spec: ConstraintSpec, waited: dict[str, Future], seen: set[str]) -> Grammar:
        """`compile`, raising _BuildPending where it would wait for an outlines build that is not in `waited`
        (the builds waited for, done). `seen`: the outlines keys this request's compile counted (`_seen_before`),
        so that compiling again counts none twice (a one-off schema beside a tool that waited for a build was
        built, as if sent twice)."""
        self._local.waited, self._local.seen = waited, seen
        try:
            return self.compile(spec)
        finally:
            self._local.waited = self._local.seen = None

    async def _wait_for_build(self, key: str, build: Future) -> Future | None:
        """`build`, done, or a future holding FutureTimeout past the time `compile` waits; None where another
        request dropped it. A build no request waits for any more (the client left, or its wait timed out) is
        dropped if it has not begun: a client that sent 130 requests and left had all of them built, in turn."""
        with self._lock:
            self._waiters[key] = self._waiters.get(key, 0) + 1
        # (asyncio.wait: this request leaving cancels its wait, neither the build nor, by itself, its waiting)
        waiting = asyncio.wrap_future(build)
        waiting.add_done_callback(lambda f: f.cancelled() or f.exception())  # (its error is raised by `compile`)
        done: Future | None = build
        try:
            finished, _ = await asyncio.wait({waiting}, timeout=self.compile_timeout_s + 1.0)
            if not finished:
                began = self._began.get(key)  # (None while its worker starts, and as it ends)
                late = began is None or time.monotonic() - began < self.compile_timeout_s
                done = Future()
                done.set_exception(FutureTimeout("queued" if not build.running() else "late" if late else "building"))
            elif build.cancelled():
                done = None  # (the next compile builds it anew)
        finally:
            with self._lock:
                self._waiters[key] -= 1
                if not self._waiters[key]:
                    del self._waiters[key]
                    if build.cancel() and self._pending.get(key) is build:
                        del self._pending[key]
        return done

    def precompile_named(self) -> dict[str, str]:
        """Compile every named schema (outlines too when it can serve them); returns name -> backend or error."""
        out = {}
        self.lltokenizer()  # ~1 s on a 152k vocabulary: paid at start-up, not by the first request
        # (~0.9 s: the tables of the checks applied while decoding)
        token_index(self.vocab), token_sets(self.vocab), key_escape_tokens(self.vocab), comma_key_index(self.vocab)
        exponent_index(self.vocab)
        portable_pattern("\\w")  # (~0.2 s: each regex dialect's classes, read once)
        for name, schema in self.named_schemas.items():
            spec = ConstraintSpec(kind="json_schema", schema=schema, extra={"name": name})
            try:
                g = self.compile(spec)
                if self.backend == "auto" and not outlines_unsupported(schema):
                    g = self._outlines(spec, wait=True)
                out[name] = g.backend
            except ConstraintError as exc:
                out[name] = f"error: {exc.message}"
                log.warning("named schema %s: %s", name, exc.message)
        return out

    def _with_late_keywords(self, spec: ConstraintSpec, backend: str) -> Grammar:
        """The grammar of `spec` on `backend`. When the backend refuses a keyword (`not`, `contains`, ... in a
        strict schema; a oneOf it cannot prove disjoint, min/maxProperties it cannot count), the schema compiles
        without them and matchers check them on each finished value (constrain/late_keywords.py); if the backend
        still refuses, its first refusal stands. A schema that is not strict, which the backend compiles with
        keywords left out, gets them checked too where the checks can (`_late_if_stronger`). Which schemas needed
        that is remembered, so repeats compile once."""
        with self._lock:
            plan = self._late_plans.get(spec.key)
        if plan is not None:  # (a plan that compiled before)
            inner = self._on_backend(dataclasses.replace(spec, schema=plan.schema), _checked_on(backend))
            self._remember_plan(spec.key, plan)
            return LateGrammar(inner, plan, self.vocab)
        if spec.kind in ("json_schema", "tools") and late_from_the_start(spec.schema):
            try:
                found = self._planned(spec, backend, one_of=False)  # (None: not checkable; the backend counts)
            except ConstraintError:
                found = None  # the backend refuses more: the refusal path below plans for it too
            if found is not None and _names_one_of(found[1].unenforced):
                # (not strict: a oneOf the backend left out is checked too, as `_late_if_stronger` has it; QA
                # review F6)
                found = self._fewer_unenforced(spec, backend, found[1].unenforced) or found
            if found is not None:
                self._remember_plan(spec.key, found[0])
                return LateGrammar(found[1], found[0], self.vocab)
        try:
            g = self._on_backend(spec, backend)
            return self._late_if_stronger(spec, backend, g) if g.unenforced else g
        except ConstraintError as exc:
            refused_keyword = exc.code == "unsupported_schema" or any(r in exc.message for r in REFUSALS)
            if not refused_keyword or spec.kind not in ("json_schema", "tools"):
                raise
            try:
                found = self._planned(spec, backend, one_of="oneOf" in exc.message,
                                      every_count=COUNT_REFUSAL in exc.message)
            except ConstraintError as later:  # (named by the keyword that still stands, where the client has it)
                # (a plain pointer: `a%20b` names `a%20b`, never `a b`)
                named = later.pointer and resolve_ref(spec.schema, "#" + quote(later.pointer)) is not None
                raise (later if named else exc) from None
            if found is None:
                raise
        self._remember_plan(spec.key, found[0])
        return LateGrammar(found[1], found[0], self.vocab)

    def _planned(self, spec: ConstraintSpec, backend: str, one_of: bool,
                 every_count: bool = False) -> tuple[LatePlan, Grammar] | None:
        """A late plan of `spec` (None: none can check it) and the backend's grammar of its schema. Where the
        backend refuses a plan that bounds `unevaluated*` (`plan_late_keywords`), the plan without, and a `oneOf`
        it cannot prove disjoint there, the plan that reads it as `anyOf`: what the bound declares may hide a
        discriminator from llguidance, or make a large union too large (QA review F1, F2). A count it refuses
        (beside optional properties another node declares) is taken out everywhere. Else the first refusal."""
        tries, tried = [(one_of, True, every_count)], set()
        first = None
        while tries:
            one, bound, counts = now = tries.pop(0)
            if now in tried:
                continue
            tried.add(now)
            plan = plan_late_keywords(spec.schema, one_of=one, bound_unevaluated=bound, every_count=counts)
            if plan is None:
                return None
            try:
                return plan, self._on_backend(dataclasses.replace(spec, schema=plan.schema), _checked_on(backend))
            except ConstraintError as exc:
                first = first or exc
                if not one and ONE_OF_REFUSAL in exc.message:
                    tries.insert(0, (True, bound, counts))
                if not counts and COUNT_REFUSAL in exc.message:
                    tries.insert(0, (one, bound, True))
                if plan.bounded:
                    tries.append((one, False, counts))
        raise first

    def _late_if_stronger(self, spec: ConstraintSpec, backend: str, g: Grammar) -> Grammar:
        """A schema that is not strict compiles with the keywords the backend cannot enforce left out and named
        (`unenforced`). Where the late checks enforce some of them, they do, as they do for a strict schema: a
        client that did not ask for `strict` (OpenAI's default) still gets every keyword that can be enforced."""
        with self._lock:
            if spec.kind not in ("json_schema", "tools") or spec.key in self._no_stronger_plan:
                return g
        found = self._fewer_unenforced(spec, backend, g.unenforced)
        if found is None:
            with self._lock:  # (so a repeat costs a lookup, not a plan)
                self._no_stronger_plan[spec.key] = None
                while len(self._no_stronger_plan) > 4096:
                    self._no_stronger_plan.popitem(last=False)
            return g
        self._remember_plan(spec.key, found[0])
        return LateGrammar(found[1], found[0], self.vocab)

    def _fewer_unenforced(self, spec: ConstraintSpec, backend: str,
                          unenforced: tuple[str, ...]) -> tuple[LatePlan, Grammar] | None:
        """The late plan of `spec` (and the backend's grammar of it), reading a `oneOf` in `unenforced` as `anyOf`,
        where it leaves fewer keywords unenforced than `unenforced`; else None."""
        try:
            found = self._planned(spec, backend, _names_one_of(unenforced))
        except ConstraintError:
            return None
        return found if found is not None and len(found[1].unenforced) < len(unenforced) else None

    def _remember_plan(self, key: str, plan: LatePlan) -> None:
        with self._lock:
            self._late_plans[key] = plan
            while len(self._late_plans) > 256:  # (a plan holds a copy of its schema)
                self._late_plans.popitem(last=False)

    def _on_backend(self, spec: ConstraintSpec, backend: str) -> Grammar:
        """The backend's grammar; JSON output keeps no key twice in one object (constrain/distinct_keys.py), the
        innermost check, under those of late keywords and uniqueItems. An outlines grammar needs no such check:
        outlines serves only schemas whose objects are all closed (`outlines_unsupported`), and writes their
        declared properties once each, in declared order. (The check's byte-by-byte follower costs ~20 us a token
        a row, most of a cached outlines row's cost.)"""
        if backend == "llguidance":
            g = self._llg(spec)
        elif backend == "outlines":
            g = self._outlines(spec, wait=True)
        else:
            g = self._auto(spec)
        if spec.kind not in _JSON_KINDS or spec.tool_format in XML_FORMATS or g.backend == "outlines":
            return g
        with self._lock:  # (one wrapper per backend grammar, so a cached grammar comes back as the same object)
            checked = self._distinct_keys.get(id(g))
            if checked is None:
                checked = self._distinct_keys[id(g)] = DistinctKeysGrammar(
                    g, self.vocab, names_restricted(spec.schema), newline_names_refused(spec.schema))
        return checked

    def _unique_plan(self, spec: ConstraintSpec) -> tuple[UniquePlan | None, UniquePlan | None]:
        """The uniqueItems this schema holds that the engine enforces (constrain/unique_items.py) and those over
        objects it steers (constrain/unique_objects.py), cached."""
        if spec.kind not in ("json_schema", "tools") or spec.schema is None:
            return None, None
        with self._lock:
            if spec.key in self._unique_plans:
                self._unique_plans.move_to_end(spec.key)
                return self._unique_plans[spec.key]
        plan = plan_unique_items(spec.schema), plan_unique_objects(spec.schema)
        with self._lock:
            self._unique_plans[spec.key] = plan
            while len(self._unique_plans) > 256:  # (a plan holds a copy of its schema)
                self._unique_plans.popitem(last=False)
        return plan

    def lltokenizer(self):
        with self._lock:
            if self._lltok is None:
                self._lltok = build_lltokenizer(self.tokenizer, self.vocab)
            return self._lltok

    def close(self) -> None:
        """Kills the compile workers (a build in progress fails), stops the thread pools."""
        self.workers.close()
        self._requests.shutdown(wait=False, cancel_futures=True)
        self._builds.shutdown(wait=False, cancel_futures=True)
        if self._tmp_dir:
            shutil.rmtree(self._tmp_dir, ignore_errors=True)
        if self.disk is not None:
            self.disk.close()

    # ---- policy -------------------------------------------------------------------------------------------
    def _auto(self, spec: ConstraintSpec) -> Grammar:
        okey = self._key(spec, "outlines")
        outlines_ok = self._outlines_supported(spec, okey)
        # (an automaton a request built with constraint_backend "outlines" serves auto only where auto would build it)
        g = self._cached_outlines(okey, _call_tag(spec)) if outlines_ok else None
        if g is not None:
            return g
        try:
            g = self._llg(spec)
        except ConstraintError as exc:
            # (a schema no document meets: outlines, tried, said it worse, "Failed to build DFA error building NFA")
            if not outlines_ok or "Unsatisfiable schema" in exc.message:
                raise
            try:
                return self._outlines(spec, wait=True)
            except ConstraintError:
                raise exc from None  # (it names the keyword: outlines' "Failed to build DFA" did not, QA review8 F5)
        if g.unenforced and outlines_ok:
            try:
                return self._outlines(spec, wait=True)
            except ConstraintError:
                return g  # (a request that strict refuses nothing: the keywords left are named, not a 400)
        if outlines_ok and self.background_outlines and okey not in self._failed and self._seen_before(okey):
            try:
                self._outlines(spec, wait=False)
            except ConstraintError:
                pass  # outlines cannot serve the repeats; llguidance does
        return g

    def _seen_before(self, okey: str) -> bool:
        """True from the second request for a constraint on. The background outlines build starts only then:
        it takes a core for seconds, which one-off schemas (generated per request, as dynamic tool schemas are)
        would never repay, and on a CPU host it slows the forward of the request that triggered it."""
        seen = getattr(self._local, "seen", None)  # (see compile_async)
        if seen is not None:
            if okey in seen:
                return False
            seen.add(okey)
        with self._lock:
            if okey in self._seen_once:
                del self._seen_once[okey]
                return True
            self._seen_once[okey] = None
            while len(self._seen_once) > 65536:
                self._seen_once.popitem(last=False)
            return False

    def _outlines_supported(self, spec: ConstraintSpec, okey: str) -> bool:
        """Whether auto may serve `spec` (its outlines key `okey`) from outlines; remembered per key, as the check
        walks the schema (20 ms on the largest of JSONSchemaBench) and repeats come back to it."""
        with self._lock:
            known = self._outlines_policy.get(okey)
        if known is None:
            known = self._outlines_policy_of(spec)
            with self._lock:
                self._outlines_policy[okey] = known
                while len(self._outlines_policy) > 65536:
                    self._outlines_policy.popitem(last=False)
        return known

    @staticmethod
    def _outlines_policy_of(spec: ConstraintSpec) -> bool:
        if spec.kind in ("regex", "choice"):
            # outlines-core 0.2.14 drops transitions in some regexes (`[0-9]+(\.[0-9]+)?` refuses "1.5"):
            # auto keeps arbitrary patterns on llguidance; JSON schemas are covered by the MaskBench subset.
            return False
        if spec.kind == "tools" and (spec.tool_choice == "auto" or _many_tagged_calls(spec)):
            return False
        if spec.kind == "json_object" or spec.schema is None:
            return False
        return not outlines_unsupported(spec.schema)

    # ---- backends -----------------------------------------------------------------------------------------
    def _llg(self, spec: ConstraintSpec) -> Grammar:
        """The llguidance grammar of `spec`, compiled once: requests for a schema whose compile is under way wait
        for it (16 requests at once with one new schema compiled it 16 times on the request threads)."""
        key = self._key(spec, "llguidance")
        g = self._lru.get(key)
        if g is not None:
            self.stats.cache_hits += 1
            return g
        with self._lock:
            pending = self._llg_pending.get(key)
            owner = pending is None
            if owner:
                pending = self._llg_pending[key] = Future()
        if not owner:
            g = pending.result()  # (its ConstraintError, where it failed)
            self.stats.cache_hits += 1
            return g
        try:
            g = self._llg_build(spec, key)
            pending.set_result(g)
            return g
        except BaseException as exc:
            pending.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._llg_pending.pop(key, None)

    def _llg_build(self, spec: ConstraintSpec, key: str) -> Grammar:
        t0 = time.perf_counter()
        lltok = self.lltokenizer()
        param = spec.param
        if spec.kind == "regex":
            g = compile_llg(lltok, self.vocab, "regex", regex=portable_pattern(spec.pattern), param=param)
            if takes_nothing(g):  # (else every request with it failed at its first token, after a 200 if streamed)
                raise ConstraintError("the regex matches no string", param=param)
        elif spec.kind == "choice":
            g = compile_llg(lltok, self.vocab, "regex", regex=choice_regex(spec.choices), param=param)
        elif spec.kind == "tools" and spec.tool_format in XML_FORMATS:
            g = compile_xml_calls(lltok, self.vocab, spec, whitespace_pattern=self.whitespace_pattern)
        elif _tagged(spec):
            g = compile_hermes_calls(lltok, self.vocab, spec.schema, strict_under=spec.strict_under,
                                     whitespace_pattern=self.whitespace_pattern, free_text=spec.tool_choice == "auto")
        elif spec.kind == "tools" and spec.tool_choice == "auto":
            g = compile_calls_or_text(lltok, self.vocab, spec.schema, strict_under=spec.strict_under,
                                      whitespace_pattern=self.whitespace_pattern,
                                      not_first=text_may_not_start(spec.tool_format),
                                      not_leading=LEAD_TAGS.get(spec.tool_format),
                                      call_names=json_call_names(spec.tool_names))
        else:  # (tool calls as JSON: a closing walk measures the call through each function's name)
            g = compile_llg(lltok, self.vocab, "json", schema=spec.schema, strict_under=spec.strict_under,
                            whitespace_pattern=self.whitespace_pattern, param=param,
                            call_names=json_call_names(spec.tool_names) if spec.kind == "tools" else ())
        if spec.kind not in ("regex", "choice") and spec.tool_format not in XML_FORMATS \
                and keys_need_plain_spelling(spec.schema):  # (XML formats refuse or name such objects instead)
            g = PlainKeysGrammar(g, self.vocab)  # (llguidance tells keys apart as spelled; outlines closes objects)
        self.stats.compiles += 1
        log.debug("llguidance compile %.1f ms", 1000 * (time.perf_counter() - t0))
        self._lru.put(key, g)
        return g

    def _outlines_regex(self, spec: ConstraintSpec) -> str:
        """The regex outlines builds for `spec`, or a ConstraintError where it cannot, or where the automaton would
        be too large to build in time (a count past `max_outlines_repeat`, a regex past `max_outlines_regex_chars`:
        for a client's `regex` and `choice` too, where `.{9000}x` held a build worker for the whole time limit)."""
        if spec.kind == "regex":
            regex = without_edge_anchors(portable_pattern(spec.pattern))
            copies = repeat_product(spec.pattern)
        elif spec.kind == "choice":
            begun = _entry_beginning_another(spec.choices)
            if begun is not None:
                raise ConstraintError(f"outlines cannot serve a choice where one entry begins another ({begun[0]!r} "
                                      f"begins {begun[1]!r}): its automaton goes no further than an entry's end, so "
                                      f"{begun[1]!r} could never be written; use the llguidance backend",
                                      param=spec.param, code="unsupported_schema")
            regex, copies = choice_regex(spec.choices), 1
        else:
            regex = self._outlines_schema_regex(spec)
            copies = max((repeat_product(python_pattern(p)) for _, p in schema_patterns(spec.schema)), default=1)
        # (a count in the regex outlines-core wrote, after an even run of backslashes: `\\{5}` counts, `\{5}` not)
        counts = [int(n) for *_, low, high in re.findall(r"(?<!\\)(\\\\)*\{(\d+)(?:,(\d*))?\}", regex)
                  for n in (low, high) if n]
        copies = max([copies, *counts])
        what = "schema" if spec.schema is not None else spec.kind
        if copies > self.max_outlines_repeat:
            raise ConstraintError(f"a length bound of {copies} makes the outlines automaton too large (limit "
                                  f"{self.max_outlines_repeat}, nested counts multiplied); use the llguidance "
                                  f"backend", param=spec.param, code="schema_too_large")
        if core_regex_length(regex) > self.max_outlines_regex_chars:
            raise ConstraintError(f"{what} expands to a {core_regex_length(regex)}-character regex; the outlines "
                                  f"limit is {self.max_outlines_regex_chars}", param=spec.param,
                                  code="schema_too_large")
        return regex

    def _outlines_schema_regex(self, spec: ConstraintSpec) -> str:
        param = spec.param
        if spec.kind == "json_object" or spec.schema is None or (spec.kind == "tools" and spec.tool_choice == "auto"):
            raise ConstraintError("outlines cannot enforce an unbounded JSON object or free-text tool output; "
                                  "use the llguidance backend", param=param, code="unsupported_schema")
        if spec.kind == "tools" and spec.tool_format == "llama3_json" and len(spec.tool_names) > 1:
            # (the bare call object is then an anyOf at the root, which outlines_unsupported refuses: see there)
            raise ConstraintError("outlines serves a call to one function in the tool-call format of this model's "
                                  "chat template (name the function in tool_choice, or use the llguidance backend)",
                                  param=param, code="unsupported_schema")
        bad = outlines_unsupported(spec.schema)
        if bad:
            raise _outlines_refusal(spec, bad)
        if _many_tagged_calls(spec):
            raise ConstraintError("outlines cannot enforce more than one call in the <tool_call> format of this "
                                  "model's chat template (send parallel_tool_calls: false, or use the llguidance "
                                  "backend)", param=param, code="unsupported_schema")
        try:
            if _tagged(spec):
                regex = hermes_regex(schema_regex(call_item_schema(spec.schema), self.whitespace_pattern))
            else:
                regex = schema_regex(spec.schema, self.whitespace_pattern)
        except Exception as exc:  # outlines raises ValueError / TypeError / PanicException subclasses
            raise ConstraintError(f"outlines cannot translate this schema: {str(exc)[:300]}", param=param,
                                  code="unsupported_schema") from None
        return regex

    def _outlines(self, spec: ConstraintSpec, wait: bool) -> Grammar | None:
        key = self._key(spec, "outlines")
        g = self._cached_outlines(key, _call_tag(spec))
        if g is not None:
            return g
        failed = self._failed.get(key)
        if failed is not None:
            raise ConstraintError(failed.message, param=spec.param, pointer=failed.pointer, code=failed.code)
        waited = getattr(self._local, "waited", None) if wait else None  # (see compile_async)
        fut = waited.get(key) if waited is not None else None
        if fut is None:
            regex = self._outlines_regex(spec)
            with self._lock:
                fut = self._pending.get(key)
                if fut is None:
                    fut = self._builds.submit(self._build_outlines, key, regex, _call_tag(spec))
                    self._pending[key] = fut
            if not wait:
                return None
            if waited is not None and not fut.done():
                raise _BuildPending(key, fut)
        try:
            # The build kills its worker at compile_timeout_s and resolves the future; the grace covers queueing.
            return fut.result(timeout=self.compile_timeout_s + 1.0)
        except FutureTimeout as exc:
            said = {("queued",): "queued", ("late",): "late", ("building",): "ran"}.get(exc.args)  # (_wait_for_build)
            began = self._began.get(key)  # (None while its worker starts, and as it ends)
            how = said or ("queued" if not (fut.done() or fut.running()) else
                           "late" if began is None or time.monotonic() - began < self.compile_timeout_s else "ran")
            raise self._timeout_error(spec.param, how) from None
        except ConstraintError as exc:
            raise ConstraintError(exc.message, param=spec.param, pointer=exc.pointer, code=exc.code) from None

    def _timeout_error(self, param: str | None, how: str = "ran") -> ConstraintError:
        """Why a wait for an outlines build ended: `queued`, the build had not begun, every build worker busy with
        other constraints (a `(yes|no)` was told it "took longer than 60 s" behind four slow builds); `late`, it
        began late for the same reason, or while its worker started (QA review15 F2), and goes on (QA cache F2); `ran`, it ran past the time limit and was stopped
        (remembered: told so again at once, QA cache F3)."""
        if how == "queued":
            return ConstraintError(f"the outlines build of this constraint did not begin within "
                                   f"{self.compile_timeout_s + 1.0:g} s: every build worker was busy with other "
                                   f"constraints; send it again later, or use the llguidance backend", param=param,
                                   code="compile_timeout")
        if how == "late":
            return ConstraintError("the outlines build of this constraint began late (behind other constraints' "
                                   "builds, or while a build worker started) and goes on: send it again shortly, or "
                                   "use the llguidance backend", param=param, code="compile_timeout")
        return ConstraintError(f"the outlines build of this constraint took longer than {self.compile_timeout_s:g} s "
                               f"and was stopped; this server does not build it again: use the llguidance backend "
                               f"(or the auto policy, which serves it with llguidance)", param=param,
                               code="compile_timeout")

    def _build_outlines(self, key: str, regex: str, call_tag: bytes | None) -> Grammar:
        """Runs on a `_builds` thread, which only waits: the work happens in a worker process."""
        path = self.disk.unfinished_path(key) if self.disk is not None else None
        if path is None:
            path = self._temporary_path(key)
        self.stats.outlines_builds += 1
        started = time.monotonic()

        def began() -> None:  # (a worker is ready: the time limit runs from here)
            with self._lock:
                self._began[key] = time.monotonic()

        try:
            try:
                self.workers.build(regex, path, self.compile_timeout_s, key, on_begin=began)
            except BuildFailed as exc:
                if exc.kind != "unwritable" or path.parent != getattr(self.disk, "folder", None):
                    raise
                log.warning("the grammar cache folder cannot be written (%s): building in memory", exc.message)
                path = self._temporary_path(key)
                self.workers.build(regex, path, self.compile_timeout_s, key, on_begin=began)
            dfa = TokenDFA.load(path, 32 * self.vocab.words, key)
            g = OutlinesGrammar(dfa, self.vocab, call_tag=call_tag)
            if self.disk is not None and path.parent == self.disk.folder:
                self.disk.finished(path, key)
            self.stats.compiles += 1
            log.debug("outlines compile %.2f s", time.monotonic() - started)
            self._lru.put(key, g)
            return g
        except BuildTimeout:
            raise self._remember(key, self._timeout_error(None, "ran")) from None
        except BuildFailed as exc:
            if exc.kind == "closed":
                raise ConstraintError("the compiler is shutting down", code="compile_failed") from None
            if exc.kind == "unwritable":  # (not remembered: the next request tries again, space may be freed)
                raise ConstraintError(f"the outlines automaton could not be written: {exc.message}",
                                      code="compile_failed") from None
            if exc.kind == "unstarted":  # (not remembered: `(yes|no)` was refused for good on a loaded machine)
                raise ConstraintError(f"the outlines build of this constraint could not begin: {exc.message}; "
                                      f"send it again later, or use the llguidance backend",
                                      code="compile_timeout") from None
            if exc.kind == "refused":
                err = ConstraintError(f"outlines cannot compile this constraint: {exc.message}")
            elif exc.kind == "memory":
                err = ConstraintError(f"the outlines automaton for this constraint {exc.message}; use the llguidance "
                                      "backend", code="schema_too_large")
            else:
                err = ConstraintError(f"the outlines compile failed: {exc.message}", code="compile_failed")
            raise self._remember(key, err) from None
        finally:
            self.stats.build_seconds_total += time.monotonic() - started  # (failed and timed-out builds too)
            path.unlink(missing_ok=True)  # (moved into the disk cache where it was read; else no more use)
            with self._lock:
                self._pending.pop(key, None)
                self._began.pop(key, None)

    def _temporary_path(self, key: str) -> Path:
        """Where a build is written when no disk cache takes it (a file read once, then deleted)."""
        with self._lock:
            if self._tmp_dir is None:
                self._tmp_dir = tempfile.mkdtemp(prefix="structgen-dfa-")
        return Path(self._tmp_dir) / f"{key}.npz"

    def _remember(self, key: str, err: ConstraintError) -> ConstraintError:
        """A failed outlines build, never built again (its requests are told why at once); logged and counted, so
        that an operator sees why a schema stays on llguidance (QA cache F1)."""
        log.warning("outlines build %s failed, not built again: %s", key, err.message)
        self.stats.outlines_failures += 1
        with self._lock:
            self._failed[key] = err
            while len(self._failed) > 4096:
                self._failed.popitem(last=False)
        return err

    # ---- caches -------------------------------------------------------------------------------------------
    def _key(self, spec: ConstraintSpec, backend: str) -> str:
        raw = json.dumps([spec.key, backend, self.whitespace_pattern, self.vocab.fingerprint])
        return hashlib.sha256(raw.encode()).hexdigest()[:32]

    def _cached_outlines(self, key: str, call_tag: bytes | None) -> Grammar | None:
        """The outlines grammar of a key from memory, else from disk (then kept in memory), else None."""
        g = self._lru.get(key)
        if g is not None:
            if self.disk is not None:
                self.disk.used(key)
        else:
            g = self._load_disk(key, call_tag)
            if g is None:
                return None
        self.stats.cache_hits += 1
        self._lru.put(key, g)
        return g

    def _load_disk(self, key: str, call_tag: bytes | None) -> Grammar | None:
        if self.disk is None:
            return None
        path = self.disk.path(key)
        if not path.exists():
            return None
        try:
            g = OutlinesGrammar(TokenDFA.load(path, 32 * self.vocab.words, key), self.vocab, call_tag=call_tag)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            log.warning("removing unreadable cache file %s (built again when asked for): %s", path, exc)
            with contextlib.suppress(OSError):  # (files are moved in whole: a broken one stays broken)
                path.unlink(missing_ok=True)
            return None
        self.disk.used(key)
        self.stats.disk_hits += 1
        return g

    def _load_named(self) -> dict[str, dict]:
        from constrain.spec import SCHEMA_NAME, validate_schema

        out: dict[str, dict] = {}
        if not self.schemas_dir or not self.schemas_dir.is_dir():
            return out
        for path in sorted(self.schemas_dir.glob("*.json")):
            if not SCHEMA_NAME.fullmatch(path.stem):
                log.warning("skipping named schema %s: a request could not name it (up to 64 letters, digits, "
                            "'_' and '-')", path.name)
                continue
            try:
                schema = read_json(path.read_text())
                validate_schema(schema, "response_format")
            except (OSError, ValueError, ConstraintError) as exc:
                log.warning("skipping named schema %s: %s", path.name, exc)
                continue
            out[path.stem] = schema
        return out


@functools.cache
def _checked_on(backend: str) -> str:
    """The backend that compiles a schema whose keywords are checked as values finish (a LatePlan's): under auto,
    llguidance, whose budget completions ask the checks. outlines' exact distances know nothing of them: once auto
    served such a schema's repeats from outlines, answers near max_tokens were steered to documents the checks
    refuse, and ran to max_tokens (`contains: {const}` at 24 tokens: 3 of 3 `length`, 0 on llguidance; QA
    latechecks F2)."""
    return "llguidance" if backend == "auto" else backend


def code_fingerprint() -> str:
    """A hash of this package's code, outlines-core's version and Python's Unicode tables (`\\p{..}` classes are
    spelled from them, constrain/pattern_dialects.py). The disk cache keeps its automata under it, so an upgrade that
    changes how a schema becomes a regex (or an automaton) never serves one built by older code."""
    h = hashlib.sha256(importlib.metadata.version("outlines-core").encode())
    h.update(unicodedata.unidata_version.encode())
    for path in sorted(Path(__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _client_pointer(spec: ConstraintSpec, pointer: str) -> tuple[str, bool]:
    """`pointer` (in the schema as compiled) told in terms of what the client sent, and whether it lies in a
    subschema an exact rewrite replaced: the response_format schema (`client_pointer`), or for tools the entry
    of the request's `tools` array (`tools.client_pointer_of_call`)."""
    if spec.kind == "tools":
        return client_pointer_of_call(spec, pointer)
    source = spec.extra.get("source")
    if source is None:
        return pointer, False
    mapped = client_pointer(source, pointer)
    return mapped, mapped != pointer


def _names_one_of(pointers: tuple[str, ...]) -> bool:
    """Some of `pointers` is a `oneOf` keyword's."""
    return any(p.rsplit("/", 1)[-1] == "oneOf" for p in pointers)


def _written_as_it_is(source: Any, compiled: Any, pointer: str, mapped: str) -> str | None:
    """The one place below `mapped` in the client's schema `source` holding the keyword that `pointer` names in the
    `compiled` schema, with the same value: a `pattern` in a `then` that the rewrite of `if`/`then` moved into a
    branch it built was named at `/`, the subschema around it (None: no such place, or more than one)."""
    node = compiled
    for segment in pointer.split("/")[1:]:
        found, node = pointer_child(node, segment)
        if not found:
            return None
    below = source
    for segment in mapped.split("/")[1:]:
        below = pointer_child(below, segment)[1]
    name = unescape_pointer_part(pointer.rpartition("/")[2])
    places = [p for p, k, n in walk(below, mapped) if k == name and n[k] == node]
    return places[0] if len(places) == 1 else None


def _as_written(spec: ConstraintSpec, pointer: str, mapped: str) -> str | None:
    """`_written_as_it_is` in the client's schema that `mapped` (`pointer` told by `_client_pointer`) is in: the
    response_format's, or the parameters of the entry of `tools` it names (tools named only the subschema a
    rewrite replaced, `/1/function/parameters` for a pattern in a `then`, where a response_format named it)."""
    if spec.kind != "tools":
        source = spec.extra.get("source")
        return None if source is None else _written_as_it_is(source, spec.schema, pointer, mapped)
    found = TOOL_DEF.match(pointer)
    sources = spec.extra.get("tool_sources", ())
    if found is None or int(found.group(1)) >= len(sources) or sources[int(found.group(1))][1] is None:
        return None
    index, params = sources[int(found.group(1))]
    base = f"/{index}/function/parameters"
    if mapped != base and not mapped.startswith(base + "/"):
        return None
    written = _written_as_it_is(params, spec.schema, pointer, mapped[len(base):])
    return None if written is None else base + written


def _outlines_refusal(spec: ConstraintSpec, bad: list[str]) -> ConstraintError:
    """The 400 for a schema outlines cannot serve (`bad`: the pointers `outlines_unsupported` names). An object
    open to undeclared properties is named as such, at the object: its `additionalProperties` is absent, and the
    refusal named it as a keyword at the root, `/`, said to be rewritten (QA: 56 of 94 outlines refusals)."""
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    if "/type" in bad and isinstance(spec.schema, dict) and not containers_only(spec.schema, spec.schema):
        return ConstraintError(f"the outlines backend serves only objects and arrays at the root (outlines-core "
                               f"0.2.14 loses transitions of a lone number: `2.5` is refused after `2`): use the "
                               f"llguidance backend{more}", param=spec.param, pointer="/type",
                               code="unsupported_schema")
    if bad[0] == "":  # (`outlines_unsupported`: the whole schema)
        return ConstraintError(f"the outlines backend cannot serve a schema that takes any JSON value, or none: give "
                               f"it a type and closed objects, or use the llguidance backend{more}",
                               param=spec.param, pointer="", code="unsupported_schema")
    holder, _, keyword = bad[0].rpartition("/")
    node = spec.schema
    for segment in holder.split("/")[1:]:  # (a pointer's segments, as written: `a%20b` is a name, not `a b`)
        node = pointer_child(node, segment)[1]
    if keyword == "additionalProperties" and isinstance(node, dict) and keyword not in node:
        where = f"at {holder}" if holder else "at the root"  # (the root's pointer is "", RFC 6901's)
        return ConstraintError(f"the outlines backend serves only closed objects, and the object {where} takes "
                               f"properties it does not declare: give it `additionalProperties: false`, or use the "
                               f"llguidance backend{more}", param=spec.param, pointer=holder,
                               code="unsupported_schema")
    return ConstraintError(f"the outlines backend cannot enforce the keyword at {bad[0]}{more}", param=spec.param,
                           pointer=bad[0], code="unsupported_schema")


def _tagged(spec: ConstraintSpec) -> bool:
    """`spec`'s output is tool calls written between tags (the hermes format of constrain/tools.py)."""
    return spec.kind == "tools" and spec.tool_format == "hermes"


def _many_tagged_calls(spec: ConstraintSpec) -> bool:
    """Tagged calls, more than one allowed. outlines-core 0.2.14 drops the transitions that leave an accepting
    state through states that are not (`a(bc)*` takes "a" but not "abc"; it is why `[0-9]+([.][0-9]+)?` refuses
    "1.5"), so after a call's closing tag it would refuse the next call."""
    return _tagged(spec) and spec.schema.get("maxItems") != 1


def _call_tag(spec: ConstraintSpec) -> bytes | None:
    """The tag opening each call of tagged calls (`Grammar.call_tag`), else None."""
    return HERMES_OPEN.encode() if _tagged(spec) else None


# llguidance names where an error arose as a URI into the schema it compiled (for tools: the call schema).
_SCHEMA_URI = re.compile(r"json-schema:///#(/[^\s'\"]*)?")
# llguidance's word for a `$ref` to an anchor no subschema defines, as the calls' schema prefixes a function's anchors
_TOOL_ANCHOR = re.compile(r"Anchor 'tool(\d+)-([^']*)' does not exist")


def _function_unenforced(arguments: dict[str, Grammar]) -> tuple[str, ...]:
    """The unenforced pointers of each function's arguments, told in terms of the call schema."""
    return tuple(f"/$defs/tool{i}{p}" for i, g in enumerate(arguments.values()) for p in g.unenforced)


class _BuildPending(Exception):
    """Raised on a request thread of `compile_async` where `compile` would wait for outlines build `build`."""

    def __init__(self, key: str, build: Future):
        super().__init__(key)
        self.key, self.build = key, build


def _in_client_terms(exc: ConstraintError, spec: ConstraintSpec) -> ConstraintError:
    """`exc` with its pointer, and the places llguidance's message names, told in terms of what the client sent
    (see `_client_pointer`): `tools` errors name `/1/function/parameters/...`, never the call schema's
    `/$defs/tool1`. An error raised where the request's field is not known (a grammar's start) gets it."""
    if exc.param is None:
        exc = ConstraintError(exc.message, param=spec.param, pointer=exc.pointer, code=exc.code)
    found = _TOOL_ANCHOR.search(exc.message) if spec.kind == "tools" else None
    if found is not None:  # (the anchor as the client wrote it, and the `$ref` that names it)
        ref = f"#tool{found.group(1)}-{found.group(2)}"
        places = [ptr for ptr, key, node in walk(spec.schema) if key == "$ref" and node[key] == ref]
        message = exc.message.replace(found.group(0), f"Anchor '{found.group(2)}' does not exist")
        exc = ConstraintError(message, param=exc.param, pointer=exc.pointer or min(places, default=None),
                              code=exc.code)
    if _SCHEMA_URI.search(exc.message):  # (llguidance's name for the schema's places: the client's pointers)
        message = _SCHEMA_URI.sub(lambda m: _client_pointer(spec, unquote(m.group(1) or ""))[0] or "the root",
                                  exc.message)  # (percent-encoded there: `a%20b` is `a b`, QA review6 F5)
        exc = ConstraintError(message, param=exc.param, pointer=exc.pointer, code=exc.code)
    if not exc.pointer:
        return exc
    named = as_the_client_wrote(spec, exc.pointer)[0]
    if named != exc.pointer:  # (the keyword the client wrote, not the `allOf` its rewrite is in)
        exc = ConstraintError(exc.message.replace(exc.pointer, named, 1), param=exc.param, pointer=named,
                              code=exc.code)
    pointer, rewritten = _client_pointer(spec, exc.pointer)
    written = _as_written(spec, exc.pointer, pointer) if rewritten else None
    pointer, rewritten = (written, False) if written else (pointer, rewritten)
    if pointer == exc.pointer:
        return exc
    # (the root's pointer is "", RFC 6901's: the message names it in words)
    message = exc.message.replace(exc.pointer, pointer, 1) if pointer else \
        exc.message.replace(f"at {exc.pointer}", "at the root", 1).replace(exc.pointer, "the root", 1)
    if rewritten:
        message += "; the keyword is in the equivalent form that the subschema there is rewritten into before compiling"
    return ConstraintError(message, param=exc.param, pointer=pointer, code=exc.code)


def _unenforced_place(spec: ConstraintSpec, pointer: str) -> str:
    """An unenforced keyword's pointer in the client's terms, as an error's (`_in_client_terms`): the keyword's own
    place where the client wrote it so, else the subschema a rewrite replaced; the root, whose pointer is empty,
    written `#` (its URI-fragment form: an empty header read as nothing unenforced, QA review6 F4)."""
    mapped, rewritten = _client_pointer(spec, pointer)
    if rewritten:
        mapped = _as_written(spec, pointer, mapped) or mapped
    return mapped or "#"


def unenforced_in_client_terms(spec: ConstraintSpec, grammar: Grammar) -> tuple[str, ...]:
    """The grammar's unenforced pointers, told in terms of what the client sent (grammars are shared by every
    schema that rewrites to the same one, so this is per request, not stored on the grammar)."""
    pointers = tuple(getattr(grammar, "unenforced", ()) or ())
    out = [_unenforced_place(spec, q) for p in pointers for q in as_the_client_wrote(spec, p)]
    if spec.answer is not None:  # (tools and a response_format: the answer's pointers say whose they are)
        out += ["response_format:" + _unenforced_place(spec.answer, p) for p in grammar.answer_unenforced]
    return tuple(dict.fromkeys(out))
