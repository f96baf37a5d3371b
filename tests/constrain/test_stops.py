"""StopMatcher: stop strings across token boundaries, earliest match, nothing leaked before it is decided."""

from __future__ import annotations

import random

from constrain.stops import StopMatcher


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
