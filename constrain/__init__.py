"""The constraint compiler: request constraints -> token-level automata. Knows nothing about HTTP or models."""

from constrain.grammar import ConstraintError, ConstraintSpec, Grammar, Matcher

__all__ = ["ConstraintError", "ConstraintSpec", "Grammar", "Matcher"]
