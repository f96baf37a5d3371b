"""The --json-whitespace option: only bounded JSON whitespace is accepted, so JSON mode can never loop on it."""

from __future__ import annotations

import pytest

from constrain.whitespace import MAX_WHITESPACE_CHARS, check_whitespace_pattern


@pytest.mark.parametrize("pattern", ["", "[ ]?", r"[ \t\n]{0,3}", r"(\n[ ]{0,16})?", " |\n", "(?:\r\n)?"])
def test_bounded_json_whitespace_patterns_are_accepted(pattern):
    assert check_whitespace_pattern(pattern) == pattern


@pytest.mark.parametrize("pattern, reason", [
    ("[ ]*", "unbounded"), (" +", "unbounded"), (r"[ \n]{2,}", "unbounded"),
    ("[ ]{0,%d}" % (MAX_WHITESPACE_CHARS + 1), f"limit is {MAX_WHITESPACE_CHARS}"),
    ("x?", "not JSON whitespace"), (r"\s?", "character class"), (r"[ \f]?", "character class"),
    (".?", "found any"), ("(", "invalid regex"),
])
def test_unbounded_or_non_whitespace_patterns_are_refused(pattern, reason):
    with pytest.raises(ValueError, match=reason.replace("(", r"\(")):
        check_whitespace_pattern(pattern)
