"""The whitespace JSON constraints allow between tokens: a regex checked to match only JSON whitespace, and only
a bounded amount of it, so JSON mode can never spend `max_tokens` on whitespace.

Pure validation of the server option; never compiles a grammar.
"""

from __future__ import annotations

import re._constants as sre_constants
import re._parser as sre_parse

DEFAULT_WHITESPACE = "[ ]?"  # one optional space: Python's json.dumps separators ", " and ": " fit
MAX_WHITESPACE_CHARS = 64  # the longest run one pattern may match
_JSON_WHITESPACE = frozenset(b" \t\n\r")
# Constructs with the same meaning in Python's and Rust's regex syntax (both backends use Rust's).
_PORTABLE = {sre_constants.LITERAL, sre_constants.IN, sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT,
             sre_constants.SUBPATTERN, sre_constants.BRANCH}


def _check_items(items) -> None:
    for op, arg in items:
        if op not in _PORTABLE:
            raise ValueError(f"only literal whitespace, [classes], groups, | and bounded repeats are allowed "
                             f"(found {str(op).lower()})")
        if op == sre_constants.LITERAL and arg not in _JSON_WHITESPACE:
            raise ValueError(f"{chr(arg)!r} is not JSON whitespace (space, \\t, \\n, \\r)")
        elif op == sre_constants.IN:
            for cop, carg in arg:
                chars = ({carg} if cop == sre_constants.LITERAL
                         else set(range(carg[0], carg[1] + 1)) if cop == sre_constants.RANGE else None)
                if chars is None or not chars <= _JSON_WHITESPACE:
                    raise ValueError("a character class may hold only JSON whitespace (space, \\t, \\n, \\r)")
        elif op in (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT):
            _check_items(arg[2])
        elif op == sre_constants.SUBPATTERN:
            _check_items(arg[-1])
        elif op == sre_constants.BRANCH:
            for branch in arg[1]:
                _check_items(branch)


def check_whitespace_pattern(pattern: str) -> str:
    """Return `pattern` when it matches only JSON whitespace, at most MAX_WHITESPACE_CHARS of it; else ValueError."""
    if not isinstance(pattern, str):
        raise ValueError("the whitespace pattern must be a string")
    try:
        parsed = sre_parse.parse(pattern)
    except Exception as exc:  # re.error, and sre_parse's own errors
        raise ValueError(f"invalid regex {pattern!r}: {exc}") from None
    _check_items(parsed)
    longest = parsed.getwidth()[1]
    if longest > MAX_WHITESPACE_CHARS:
        raise ValueError(f"{pattern!r} may match {'unbounded' if longest >= sre_constants.MAXREPEAT else longest}"
                         f" whitespace characters; the limit is {MAX_WHITESPACE_CHARS} (use {{m,n}}, not * or +)")
    return pattern
