"""The constraint compiler: request constraints -> token-level automata. Knows nothing about HTTP or models."""

from constrain.compiler import GrammarCompiler
from constrain.grammar import ConstraintError, ConstraintSpec, Grammar, Matcher
from constrain.spec import spec_from_request
from constrain.tools import ToolCall, parse_tool_calls, tools_system_prompt
from constrain.vocabulary import Vocabulary

__all__ = ["ConstraintError", "ConstraintSpec", "Grammar", "GrammarCompiler", "Matcher", "ToolCall", "Vocabulary",
           "parse_tool_calls", "spec_from_request", "tools_system_prompt"]
