"""StopMatcher: stop strings across token boundaries, earliest match, nothing leaked before it is decided."""

from __future__ import annotations

import random

import pytest

from constrain.stops import StopMatcher
from constrain.tools import calls_opening


def stream(matcher: StopMatcher, pieces: list[str]) -> tuple[list[str], bool]:
    out = []
    for piece in pieces:
        text, stopped = matcher.push(piece)
        out.append(text)
        if stopped:
            return out, True
    out.append(matcher.flush())
    return out, False


def test_stop_string_split_across_deltas_is_matched_and_never_emitted():
    out, stopped = stream(StopMatcher(["END"]), ["hello E", "N", "D tail"])
    assert stopped
    assert "".join(out) == "hello "
    assert all("E" not in piece for piece in out)


def test_partial_stop_is_held_back_then_released_when_it_cannot_match():
    m = StopMatcher(["END"])
    assert m.push("abc EN") == ("abc ", False)
    assert m.push("x") == ("ENx", False)
    assert m.flush() == ""


def test_include_stop_str_in_output_keeps_the_stop_string():
    out, stopped = stream(StopMatcher(["\n\n"], include_stop_str_in_output=True), ["a\n", "\nb"])
    assert stopped and "".join(out) == "a\n\n"


def test_earliest_match_wins_over_a_stop_listed_first():
    out, stopped = stream(StopMatcher(["world", "lo"]), ["hello world"])
    assert stopped and "".join(out) == "hel"


def test_longer_stop_starting_earlier_wins_over_a_shorter_one_completed_first():
    # "b" completes at position 1 first, but "abc" starts at 0: the matcher waits until "abc" is decided.
    out, stopped = stream(StopMatcher(["abc", "b"]), ["a", "b", "c"])
    assert stopped and "".join(out) == ""
    out, stopped = stream(StopMatcher(["abc", "b"]), ["a", "b", "x"])
    assert stopped and "".join(out) == "a"


def test_text_without_stop_passes_through_unchanged_and_flush_returns_the_held_tail():
    m = StopMatcher(["</s>"])
    text1, _ = m.push("a <")
    text2, _ = m.push("/")
    assert text1 + text2 == "a "
    assert m.flush() == "</"


def test_no_stops_is_a_pass_through():
    m = StopMatcher([])
    assert m.push("anything") == ("anything", False)
    assert m.flush() == ""


def test_random_splits_give_the_same_output_as_the_whole_text():
    rng = random.Random(0)
    stops = ["STOP", "ab", "\n\n"]
    for _ in range(300):
        text = "".join(rng.choice("aSTOPb\n x") for _ in range(rng.randint(0, 30)))
        whole, whole_stopped = stream(StopMatcher(stops), [text])
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 6))))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        split, split_stopped = stream(StopMatcher(stops), pieces)
        assert "".join(split) == "".join(whole), (text, pieces)
        assert split_stopped == whole_stopped
        # Whatever was emitted never contains a stop string.
        assert not any(s in "".join(split) for s in stops)


# ---- tool calls are never cut (CallsOpening, from constrain/tools.py)

def test_calls_are_never_cut_when_the_whole_output_is_calls():
    for tool_choice in ("required", "named"):
        out, stopped = stream(StopMatcher(['"', "\n"], calls=calls_opening("hermes", tool_choice)),
                              ["<tool_call>", '\n{"name"', ': "f"}\n</tool_call>'])
        assert not stopped and "".join(out) == '<tool_call>\n{"name": "f"}\n</tool_call>'


def test_text_before_tagged_calls_is_cut_but_the_calls_are_not():
    hermes = calls_opening("hermes", "auto")
    # A stop in the text before the tag: the output ends there (no call follows).
    out, stopped = stream(StopMatcher(["\n"], calls=hermes), ["Sure.\n", "<tool_call>\n{}"])
    assert stopped and "".join(out) == "Sure."
    # After the tag, stop strings do not apply, in any split.
    text = 'Sure. <tool_call>\n{"name": "f", "arguments": {"a": "x\\ny"}}\n</tool_call>'
    for cut in range(len(text) + 1):
        out, stopped = stream(StopMatcher(["\n", '"', "<"], calls=hermes), [text[:cut], text[cut:]])
        assert not stopped and "".join(out) == text, cut


def test_a_stop_that_may_be_the_beginning_of_a_tag_waits_for_the_tag():
    hermes = calls_opening("hermes", "auto")
    m = StopMatcher(["<"], calls=hermes)
    assert m.push("a <tool") == ("a ", False)  # undecided: the tag may be coming
    assert m.push("_call>{}") == ("<tool_call>{}", False)
    m = StopMatcher(["<"], calls=hermes)
    assert m.push("a <to") == ("a ", False)
    assert m.push("y") == ("", True)  # not the tag: the stop string it began with ends the output
    m = StopMatcher(["<"], calls=hermes)
    assert m.push("a <to") == ("a ", False)
    assert m.flush() == "" and m.stopped  # the output ended there: a partial tag is text


def test_json_calls_begin_at_the_first_character_and_text_is_cut_as_usual():
    array = calls_opening("json_array", "auto")
    out, stopped = stream(StopMatcher(["\n", '"'], calls=array), ["\n", '[{"name"', ': "f"}]'])
    assert not stopped and "".join(out) == '\n[{"name": "f"}]'
    out, stopped = stream(StopMatcher(["\n", '"'], calls=array), ["\n", "Hello", ' "x"'])
    assert stopped and "".join(out) == ""  # text: the leading newline was already a stop
    out, stopped = stream(StopMatcher(['"'], calls=array), ["Hi ", '"x"'])
    assert stopped and "".join(out) == "Hi "


def test_a_lead_tag_kept_in_the_text_opens_calls():
    llama = calls_opening("llama3_json", "auto")  # text may start with "<", calls with "{" or <|python_tag|>
    out, stopped = stream(StopMatcher(['"'], calls=llama), ["<|python", '_tag|>{"name": "f"}'])
    assert not stopped and "".join(out) == '<|python_tag|>{"name": "f"}'
    out, stopped = stream(StopMatcher(['"', "x"], calls=llama), ["<|py", "x", 'y"'])
    assert stopped and "".join(out) == "<|py"  # not the tag: text, cut as usual


def test_calls_random_splits_match_the_whole_text():
    rng = random.Random(1)
    hermes = calls_opening("hermes", "auto")
    stops = ["<", "\n", "ab"]
    for _ in range(300):
        text = "".join(rng.choice(["a", "b", "\n", "<", "<tool_call>", "x", " "]) for _ in range(rng.randint(0, 12)))
        whole, whole_stopped = stream(StopMatcher(stops, calls=hermes), [text])
        cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 6))))
        pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)])]
        split, split_stopped = stream(StopMatcher(stops, calls=hermes), pieces)
        assert "".join(split) == "".join(whole), (text, pieces)
        assert split_stopped == whole_stopped
        emitted = "".join(split)
        before_calls = emitted.split("<tool_call>")[0]
        assert not any(s in before_calls for s in stops)  # a stop string only ever appears inside calls
        if "<tool_call>" in text and not whole_stopped:
            assert emitted == text


@pytest.mark.parametrize("tool_format, calls", [
    ("json_array", ' [{"name": "f", "arguments": {"a": 1}}]'),
    ("llama3_json", '{"name": "f", "parameters": {"a": 1}}'),
    ("llama3_json", '<|python_tag|>{"name": "f", "parameters": {"a": 1}}'),
    ("mistral", '[{"name": "f", "arguments": {"a": 1}}]'),
    ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]'),
    ("mistral_args", 'Hi[TOOL_CALLS]f[ARGS]{"a": 1}'),
    ("hermes", 'Hi<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'),
    ("qwen3_coder", 'Hi<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>'),
    ("glm45", 'Hi<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n</tool_call>'),
    ("glm47", 'Hi<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>'),
])
def test_every_format_s_calls_pass_stop_strings_whole(tool_format, calls):
    """Each format's calls under tool_choice "auto", token by token, against a stop string for every character
    they hold but the text's before them ("Hi"): nothing is cut."""
    stops = sorted(set(calls) - set("Hi"))
    out, stopped = stream(StopMatcher(stops, calls=calls_opening(tool_format, "auto")), list(calls))
    assert not stopped and "".join(out) == calls


def test_text_pushed_before_stops_may_end_the_output_ends_nothing_but_a_match_ending_later_does():
    """vLLM's `min_tokens`: no stop string ends the output within its first tokens' text; one that begins there
    and ends in a later token's text does, and nothing of it has been emitted."""
    m = StopMatcher(["ab", "xyz"])
    assert m.push("ab a", may_stop=False) == ("ab ", False)  # ("a" held: it may begin "ab")
    assert m.push("b", may_stop=True) == ("", True) and m.matched == "ab"
    m = StopMatcher(["xyz"])
    assert m.push("1xy", may_stop=False) == ("1", False)
    assert m.push("z2") == ("", True)
    m = StopMatcher(["xyz"], include_stop_str_in_output=True)
    assert m.push("xyz", may_stop=False) == ("xyz", False) and m.flush() == ""
