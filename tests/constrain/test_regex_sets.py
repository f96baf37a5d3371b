"""constrain.regex_sets.py: the complement of a pattern matches exactly the strings the pattern finds no match
in, checked against Python's `re` on a seeded bank of strings built from each pattern's own alphabet."""

import random
import re

import pytest

from constrain.regex_sets import (complement_pattern, disjoint_regions, finite_language, pattern_examples,
                                  search_region)

# Patterns found under `not` or `oneOf` in real-world schemas (JSONSchemaBench), and the edge cases of
# the construction: anchors on one side, hoisted by Python's parser, inside a group; lazy repeats; classes with
# shorthands; the dot; counted repeats.
PATTERNS = [
    "abc", "^[A-Fa-f\\d]{24}$", "^[\\w]*$", "\\d\\d", "^[\\w]+", "1.*2", "^....$", "[a|b]", "(^[^5]*$)|7",
    "^([a-z][0-9])+$", "^https?://.+$", "(t|8){10,10}$", "^/?([^/]+/)*[^/]+/?$", "[^a-zA-Z0-9.,()@&' -]",
    "^[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}$", "^(0|([1-9]\\d*))\\.(0|([1-9]\\d*))\\.(0|([1-9]\\d*))$",
    "^\\d+-\\d+|^\\d+$", ",,|^,|,$", "^.*\\.[Cc][Aa][Nn]$", "^\\$[A-Z0-9-_]+", "^a*$", "x*?y", "^$", "[^\"]+",
    "^\\s*\\S", "\\Aab\\Z", "a{2,3}b?", "(?:ab|a)c",
    # an optional group that begins or ends in a loop (an RFC 3339 time's fraction)
    "^[0-5][0-9](\\.[0-9]+)?Z$", "^(x*y)?z$", "^a(b+c)?$",
    # counts at a side the search does not anchor: the count costs no states (`_trim_edges`)
    "[A-Za-z0-9-_.:]{1,255}", "^x[0-9]{2,300}", "[0-9]{1,300}$", "(?:q|[ab]{3,400})", "a{0,500}b",
]

_EXTRA = ["a", "b", "0", "1", "9", "x", "-", ".", "/", ",", " ", "\t", "\n", "\"", "\\", "é", "\u0663", "\u00a0",
          "😀", "_", ":"]


def _bank(pattern: str, rnd: random.Random) -> list[str]:
    """Strings over the pattern's own characters and a few others: random, and prefixes/edits of matches."""
    alphabet = sorted(set(c for c in pattern if c.isprintable()) | set(_EXTRA))
    out = ["", "abc", "0123456789abcdef01234567", "1.2.3", "http://x", "@/a", "a.can", "a1b2c3", "x8ttt8ttt8tt",
           "0123abcd-0123-4567-89ab-0123456789ab"]
    for _ in range(1500):
        n = rnd.choice([0, 1, 2, 3, 4, 5, 8, 12, 23, 24, 25, 36, 40])
        out.append("".join(rnd.choice(alphabet) for _ in range(n)))
    regex = re.compile(pattern)
    matches = [s for s in out if regex.search(s)]
    for s in matches[:200]:  # the boundary: one character dropped, changed or added
        i = rnd.randrange(len(s) + 1)
        out += [s[:i] + s[i + 1:], s[:i] + rnd.choice(alphabet) + s[i + 1:], s[:i] + rnd.choice(alphabet) + s[i:]]
    # (Python's `$` also matches before a final newline; the complement follows ECMA-262's `$`: the very end)
    return [s for s in out if not s.endswith("\n")]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_complement_matches_exactly_the_strings_the_pattern_does_not(pattern):
    other = complement_pattern(pattern)
    assert other is not None and other.startswith("^") and other.endswith("$")
    positive, negative = re.compile(pattern), re.compile(other)
    bank = _bank(pattern, random.Random(pattern))
    wrong = [s for s in bank if (negative.search(s) is None) == (positive.search(s) is None)]
    assert wrong == []
    assert any(positive.search(s) for s in bank) and any(negative.search(s) for s in bank)


def test_an_optional_group_cannot_be_skipped_into_its_loop():
    """`(\\.[0-9]+)?` is the dot and digits or nothing: never digits without the dot (the skip of an optional part
    once led into the loop at its end)."""
    from constrain.regex_sets import pattern_search

    for pattern, yes, no in [("^[0-5][0-9](\\.[0-9]+)?Z$", ["46Z", "46.5Z", "46.55Z"], ["465Z", "4655Z", "46.Z"]),
                             ("^(x*y)?z$", ["z", "yz", "xxyz"], ["xz", "xxz"])]:
        region = re.compile(disjoint_regions([pattern])[0][0])
        search = pattern_search(pattern)
        for text in yes + no:
            assert bool(region.fullmatch(text)) == search(text) == (text in yes), (pattern, text)


@pytest.mark.parametrize("pattern", [
    "a(?=b)", "(?<!a)b", "(a)\\1", "\\bfoo", "(?i)abc", "a(?i:b)", "a$b", "(a|^b)c",  # not regular, or flags
    "", ".*", "^[\\s\\S]*",  # matches every string: the complement is empty
    "^[0-9a-zA-Z_-]{1,255}$", "(a|b)*a(a|b){12}",  # automata too large to write back
    "a\"b", "\\\\",  # a class with every control character but no quote (llguidance would let \" through it)
    "x" * 1001,
])
def test_what_is_out_of_reach_gives_none(pattern):
    assert complement_pattern(pattern) is None


@pytest.mark.parametrize("pattern", ["((a{100}){100}){100}", "(?:(?:a|b)*c){50}d{0,1000}", "[\\w\\d\\s]{1000}"])
def test_hostile_patterns_stop_at_the_automaton_limits(pattern):
    assert complement_pattern(pattern) is None


@pytest.mark.parametrize("patterns", [
    ["^\\w[-\\w_]*$", "^(relationships|links)$"], ["a*", "aaa*"], ["X_", "[0-9]{2,}"], ["b.*", "f.*", "^.{1,3}$"],
    ["netdir_(projects|work|scratch|share)", "netdrv_([a-z]+)"], ["^[a-zA-Z0-9_-]{1,}$", "^MD5$"],
])
def test_disjoint_regions_cut_the_union_by_which_patterns_match(patterns):
    regions = disjoint_regions(patterns)
    assert regions is not None and any(len(members) > 1 for _, members in regions)
    compiled = [re.compile(p) for p in patterns]
    cut = [(re.compile(r), members) for r, members in regions]
    rnd = random.Random(" ".join(patterns))
    bank = [s for p in patterns for s in _bank(p, rnd)] + ["relationships", "links", "MD5", "netdir_work", "X_12"]
    for s in bank:
        matched = frozenset(i for i, p in enumerate(compiled) if p.search(s))
        inside = [members for r, members in cut if r.search(s)]
        assert inside == ([matched] if matched else []), s


def test_disjoint_patterns_give_one_region_each():
    regions = disjoint_regions(["^a", "^b"])
    assert sorted(members for _, members in regions) == [frozenset({0}), frozenset({1})]


@pytest.mark.parametrize("pattern", ["^a+$", "b", "^[0-9]{3}-[a-z]+$", r"^\d+(\.\d+)?x$", "(ab|cd)e", "^$", "x$",
                                     "[^a-c]", "^(a|b)*c?$", r"^[0-5][0-9](\.[0-9]+)?x$", "^(a*b)?c$"])
def test_pattern_search_agrees_with_pythons_search(pattern):
    import random
    import re

    from constrain.regex_sets import pattern_search

    search = pattern_search(pattern)
    rng = random.Random(pattern)
    for _ in range(500):
        text = "".join(rng.choice("abcdex019.-") for _ in range(rng.randrange(9)))
        assert search(text) == bool(re.search(pattern, text)), text


def test_pattern_search_runs_a_catastrophic_pattern_in_linear_time():
    """`^(a+)+$` on "aaa...ab" backtracks exponentially in a regex engine; the automaton reads each character
    once (a time-out here would mean the regex was run)."""
    from constrain.regex_sets import pattern_search

    search = pattern_search("^(a+)+$")
    assert search("a" * 5000) and not search("a" * 5000 + "b")
    assert pattern_search("^(?=a)") is None  # (lookarounds are out of reach)


def test_pattern_search_takes_larger_automata_than_the_rewrites_within_a_shared_budget():
    """Searching only runs the DFA, so `{1,255}` and a dozen words searched anywhere are in reach (the rewrites,
    which write a regex back, stop at 200 states); one schema's searches share a budget, so many hostile
    patterns cannot buy unbounded work."""
    import re

    from constrain.regex_sets import Work, pattern_search

    for pattern, texts in [("^[0-9a-zA-Z_-]{1,255}$", ["a" * 255, "a" * 256, "", "a b"]),
                           ("^(portal)|(console)|(signup)|(libraries)|(X-[a-z0-9\\-]*)$",
                            ["portal!", "my console", "X-ab", "X-ab!", "nothing"])]:
        assert complement_pattern(pattern) is None
        search = pattern_search(pattern)
        assert [search(t) for t in texts] == [bool(re.search(pattern, t)) for t in texts]
    work = Work.for_search()
    found = [pattern_search(f"(a|b)*a(a|b){{{n}}}c", work) for n in [8] * 40]
    assert found[0] is not None and found[-1] is None  # (the budget is spent)


@pytest.mark.parametrize("pattern", ["^(?!pattern$).*$", "^(?=.{1,5}$)[a-z]+", "^(?!x)(?!ab)[a-z]{0,4}$",
                                     "^(?=a)(?!ab)"])
def test_leading_lookaheads_become_one_pattern_matching_the_same_strings(pattern):
    import random
    import re

    from constrain.regex_sets import without_lookaheads

    plain = without_lookaheads(pattern)
    assert plain is not None and "(?=" not in plain and "(?!" not in plain
    rng = random.Random(pattern)
    for _ in range(2000):
        text = "".join(rng.choice("abpattern.x\n") for _ in range(rng.randrange(10)))
        assert bool(re.search(pattern, text)) == bool(re.search(plain, text)), text


@pytest.mark.parametrize("pattern", ["^(?!a)\\S$", "^(?![a-c])\\S+$"])
def test_a_class_is_written_without_surrogates_at_its_ends(pattern):
    """`\\S` less `a` came out with `\\uD800-\\uDFFF` among its items, which no Rust regex may name: llguidance
    refused the pattern (QA review8 F6). Between characters of a JSON text, the class means the same."""
    from constrain.regex_sets import without_lookaheads
    from constrain.rewrite import _narrowest

    narrowed = _narrowest(pattern)  # (as the rewrite spells it first: every dialect's `\\S`, less surrogates)
    plain = without_lookaheads(narrowed, explicit=True)
    assert plain is not None and not re.search(r"\\u[dD][89a-fA-F]", plain), plain
    for text in ("b", "a", " ", "é", "\ud7ff", "\ue000", "\U0001F600", "ab"):
        assert bool(re.search(narrowed, text)) == bool(re.search(plain, text)), text


@pytest.mark.parametrize("pattern", ["abc", "a(?!b)", "^a(?=b)", "^(?<=a)b", "^(?!(a)\\1)"])
def test_lookaheads_elsewhere_are_out_of_reach(pattern):
    from constrain.regex_sets import without_lookaheads

    assert without_lookaheads(pattern) is None


@pytest.mark.parametrize("pattern, shortest", [
    (r"[a-f0-9]{24}", 24), (r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}.\d{6}", 26), (r"^[^@\s]+@[^@.\s]+(\.[^@.\s]+)+$", 5),
    (r"^pbj:([a-z0-9-]+):([0-9]+-[0-9]+)$", 9), (r"^(a|bc)*d$", 1), (r"^[é]+$", 1), (r"x\"?y", 2), (r"^$", 0), ("", 0),
])
def test_pattern_examples_begin_with_a_shortest_match_without_needless_escapes(pattern, shortest):
    """Hints for closing walks stuck in a string (constrain/llg_backend.py): a match, as short as any, with no
    character a JSON string would have to escape unless the pattern needs one."""
    example = pattern_examples(pattern)[0]
    assert re.search(pattern, example), example
    assert len(example) == shortest
    assert not any(ch in '"\\' or ord(ch) < 0x20 for ch in example)


@pytest.mark.parametrize("pattern, examples", [
    (r"^all|tags$", ["all", "tags"]),  # (a string that began otherwise can still end with "tags")
    (r"(^Hpt_|^Int_|_Armour_)", ["Hpt_", "Int_", "_Armour_"]),
    (r"(?:^a$|^bb$)", ["a", "bb"]),
    (r"^(?:a|bb)$", ["a", "bb"]),  # (those of a group anchored at both ends: `^(0|\$\([a-z]+\))$`)
    (r"^\\d+/\\d+$", [r"\d/\d"]),  # a backslash (and a quote) where nothing else fits
    (r'^"$', ['"']),
    (r"^a(b|c)$", ["ab"]),  # alternatives below the top level are not enumerated
    (r"^x{2,5000}$", ["xx"]),  # a count past the automata's limit, taken at its minimum
    (r"(?i)^ab$", ["ab"]),  # a global flag that only widens the matches, read as absent
])
def test_pattern_examples_give_a_shortest_match_per_top_level_alternative(pattern, examples):
    assert pattern_examples(pattern) == examples
    assert all(re.search(pattern, e) for e in examples)


@pytest.mark.parametrize("pattern", [r"^(?=a)b", r"(a)\1", r"^[^\s\S]$"])
def test_pattern_examples_are_empty_when_the_pattern_is_out_of_reach_or_matches_nothing(pattern):
    assert pattern_examples(pattern) == []


@pytest.mark.parametrize("pattern, example", [(r"^[\x00-\x1f]+$", "\t"), (r"^a\nb$", "a\nb"), (r"^\x01$", "\x01"),
                                              (r"^[\x00-\x1f\"]$", '"')])
def test_a_control_character_is_written_where_nothing_else_fits(pattern, example):
    """A JSON string holds it escaped (a closing walk inside `^[a-z]+\\n[0-9]+$` had no example, and ran on)."""
    assert pattern_examples(pattern) == [example]


@pytest.mark.parametrize("pattern, region", [
    ("[ab]{1,255}", True), ("^x-[a-z]{1,64}", True), ("[0-9]{1,30}$", True), ("(?:q|[ab]{3,400})", True),
    ("[a-z]{3,9}", False),  # a short count: left as written
    ("^[a-z]{1,255}$", False), ("x[0-9]{2,100}y", False),  # counts the search must make: nothing to cut
    ("a+", False),  # unbounded: counting costs nothing
])
def test_search_region_names_the_same_strings_without_a_long_count_at_an_unanchored_side(pattern, region):
    """What `patternProperties` regexes such as `[A-Za-z0-9-_.:]{1,255}` become: llguidance unrolled the count
    while matching keys until it gave up mid-output."""
    out = search_region(pattern)
    assert (out is not None) == region
    if out is not None:
        assert out.startswith("^") and out.endswith("$") and "{" not in out
        bank = _bank(pattern, random.Random(pattern))
        wrong = [s for s in bank if bool(re.search(out, s)) != bool(re.search(pattern, s))]
        assert wrong == []


@pytest.mark.parametrize("pattern, names", [
    ("^(math|art)$", ["art", "math"]), ("^[a-c]$", ["a", "b", "c"]), ("^x(y|z)?$", ["x", "xy", "xz"]),
    ("^(a|b)$|^c$", ["a", "b", "c"]), ("^$", [""]),
    ("a", None), ("^a+$", None), ("^[a-z]{3}$", None),  # (unanchored, a cycle, past the limit)
])
def test_the_finitely_many_names_a_pattern_matches(pattern, names):
    found = finite_language(pattern, 64)
    assert (sorted(found) if found is not None else None) == names



def test_patterns_that_python_warns_about_compile_without_a_warning(tmp_path):
    """A client's `[[a-z]]` or `[a--b]` made Python's `re` warn (FutureWarning: "Possible nested set") wherever the
    pattern was compiled (jsonschema's schema check, the spec's regex check, the late checks): the server's log
    filled with them. Such patterns are compiled and enforced as before, silently. (In a process of its own: pytest
    resets the warning filters the package installs when imported.)"""
    import subprocess
    import sys

    from tests.conftest import TOKENIZERS

    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[[a-z]]+$"},
                                               "b": {"type": "string", "pattern": "^[a-z--b]+$"},
                                               "c": {"type": "string", "pattern": "^[x&&y]+$"},
                                               "d": {"type": "string", "pattern": "^[x||y~~z]+$"}},
              "required": ["a", "b", "c", "d"]}
    script = f"""
from transformers import AutoTokenizer
from constrain import GrammarCompiler, Vocabulary, spec_from_request
tokenizer = AutoTokenizer.from_pretrained({str(TOKENIZERS["gpt2"])!r})
vocab = Vocabulary.from_tokenizer(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
compiler = GrammarCompiler(vocab, tokenizer, backend="llguidance", cache_dir={str(tmp_path)!r})
for request in ({{"response_format": {{"type": "json_schema", "json_schema": {{"name": "s", "schema": {schema!r}}}}}}},
                {{"regex": "[[a-z]]{{3}}"}}):
    compiler.compile(spec_from_request(**request)).matcher()
compiler.close()
print("compiled")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "compiled", done.stderr[-2000:]
    assert "Warning" not in done.stderr, done.stderr[-2000:]
