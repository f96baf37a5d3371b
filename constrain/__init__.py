"""The constraint compiler: request constraints -> token-level automata. Knows nothing about HTTP or models.

Names are imported on first use, so the compile worker process (`python -m constrain.compile_worker`) starts
without importing torch.
"""

from __future__ import annotations

import importlib
import warnings

# Python's `re` warns (FutureWarning) of a pattern whose meaning a future version may change: `[[a-z]]`, `[a--b]`,
# `[a&&b]`. The patterns here are clients' (schemas' `pattern`s, `regex`, formats), compiled by this package and
# by jsonschema, so these warnings said nothing to whoever reads the server's log, and filled it, once per pattern.
warnings.filterwarnings("ignore", category=FutureWarning,
                        message=r"Possible (nested set|set (difference|intersection|symmetric difference|union))")

_EXPORTS = {
    "GrammarCompiler": "constrain.compiler",
    "ConstraintError": "constrain.grammar", "ConstraintSpec": "constrain.grammar", "Grammar": "constrain.grammar",
    "Matcher": "constrain.grammar",
    "spec_from_request": "constrain.spec", "COMPAT_CONSTRAINT_FIELDS": "constrain.spec",
    "compat_options_ignored": "constrain.spec",
    "ToolCall": "constrain.tools", "parse_tool_calls": "constrain.tools", "tools_system_prompt": "constrain.tools",
    "Vocabulary": "constrain.vocabulary",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'constrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
