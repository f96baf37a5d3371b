"""The constraint compiler's public shapes: spec in, grammar out, matcher with four methods (`fill_bitmask`,
`accept`, `is_terminated`, `can_end`) and what the budget rule and the engine's look-ahead ask of it (`vet`,
`min_tokens_to_end`, `forced_after`, `mask_after`).

Knows grammars and vocabularies; never imports HTTP or model code. Masks are packed int32 bitmasks of shape
[batch, ceil(logits_width / 32)] (bit i of word w set = token 32*w+i allowed), the format both llguidance and
outlines-core write natively.
"""

from __future__ import annotations

import abc
import functools
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from constrain.support import VALUE_KEYWORDS

ConstraintKind = Literal["json_schema", "json_object", "regex", "choice", "tools"]


class ConstraintError(ValueError):
    """A constraint the client sent that we cannot honour. The service turns it into a 400.

    `param` names the request field (e.g. "response_format"); `pointer` is the JSON Pointer of the offending
    schema keyword, when there is one, and is part of the message too.
    """

    def __init__(self, message: str, param: str | None = None, pointer: str | None = None,
                 code: str = "invalid_constraint"):
        super().__init__(message)
        self.message = message
        self.param = param
        self.pointer = pointer
        self.code = code


def refuse_unread_fields(obj: dict, known: tuple[str, ...], param: str, hint: str = "",
                         unlisted: tuple[str, ...] = ()) -> None:
    """A field of a constraint's object that this server does not read is a 400 naming it (`param.field`), as
    OpenAI answers: a schema sent under a key the shape does not have would otherwise leave the output silently
    unconstrained. A field set to null counts as not sent. `unlisted`: fields taken too, which the message does not
    offer (another server's private ones)."""
    for name, value in obj.items():
        if name not in known + unlisted and value is not None:
            raise ConstraintError(f"Unknown parameter: '{param}.{name}': {param} takes "
                                  f"{', '.join(repr(k) for k in known)}{hint}", param=f"{param}.{name}",
                                  code="unknown_parameter")


@dataclass(frozen=True)
class ConstraintSpec:
    """A normalised output constraint, hashable and serialisable (its `key` feeds the compile caches)."""

    kind: ConstraintKind
    schema: Any = None  # json_schema / json_object (None = any JSON object) / tools (the call schema)
    strict: bool = False  # OpenAI json_schema strict: unsupported keyword -> ConstraintError (tools: see below)
    pattern: str | None = None  # regex
    choices: tuple[str, ...] = ()  # choice
    tool_names: tuple[str, ...] = ()  # tools: the functions the output may call
    tool_choice: str = "auto"  # tools: "auto" | "required" | "named"
    parallel_tool_calls: bool = True
    strict_tools: tuple[int, ...] = ()  # tools: the functions declared strict (their index in the call schema)
    tool_format: str = "json_array"  # tools: how calls are written, one of constrain.tools.TOOL_FORMATS
    backend: str | None = None  # per-request override: "outlines" | "llguidance" | "auto" | None (server default)
    # tools under tool_choice "auto" with a response_format too: the constraint on an answer that is not calls
    # (else free text)
    answer: "ConstraintSpec | None" = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def strict_under(self) -> tuple[str, ...]:
        """JSON Pointers of the subschemas in which every keyword must be enforced ("" is the whole schema): for
        tools, the parameters of each strict function (OpenAI's `strict` is per function); else all or nothing."""
        if self.kind == "tools":
            return tuple(f"/$defs/tool{i}" for i in self.strict_tools)
        return ("",) if self.strict else ()

    @property
    def param(self) -> str:
        """The request field this constraint came from: the `param` of its errors."""
        if "param" in self.extra:  # a field other than the usual one for its kind (constrain/spec.py)
            return self.extra["param"]
        return {"tools": "tools", "regex": "regex", "choice": "choice"}.get(self.kind, "response_format")

    @functools.cached_property
    def key(self) -> str:
        """Stable text identifying what this spec accepts and writes (not which backend serves it): the schema as
        `in_written_order` has it. Computed once per spec (every cache lookup of a request uses it)."""
        import json

        return json.dumps(
            [self.kind, in_written_order(self.schema), self.strict, self.pattern, list(self.choices),
             list(self.tool_names),
             self.tool_choice, self.parallel_tool_calls, list(self.strict_tools), self.tool_format,
             self.answer.key if self.answer is not None else None],
            separators=(",", ":"), default=str,
        )


def in_written_order(schema: Any) -> Any:
    """`schema` with each object's keys sorted, but for the names of `properties`, which keep their order: it is the
    order their members are written in (sorted, a schema of the same properties in another order was served the
    first one's grammar, on disk too: QA cachekeys F1), and values (`VALUE_KEYWORDS`: an object `const` is written
    in its key order). The order of other keywords changes nothing that is compiled (kept, a schema of them in
    another order compiled, and built a 6 MB outlines automaton, again: QA review F4). A name that is a keyword's
    (a `$defs` entry called `properties`) is only kept in its order: never a merge of two different schemas."""
    if isinstance(schema, list):
        return [in_written_order(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key in sorted(schema):
        value = schema[key]
        if key in VALUE_KEYWORDS:
            out[key] = value
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: in_written_order(sub) for name, sub in value.items()}
        else:
            out[key] = in_written_order(value)
    return out


class Matcher(abc.ABC):
    """Per-sequence automaton state. Not thread-safe; owned by the engine thread once decoding starts."""

    # Where the last accepted token's text goes, for grammars that know (constrain/harmony.py): "reasoning",
    # "answer", "tag" or "reasoning_tag" (dropped; the latter counted as reasoning), "call_header" (the answer's
    # text then begins with `call_text`). None: the engine decides (the answer, or constrain/reasoning.py's tags).
    token_role: str | None = None
    call_text: str = ""
    # False while the tokens accepted are a wrapper's own, before the answer's grammar has taken one
    # (constrain/reasoning.py: the block and the whitespace after it): the engine strips whitespace only then.
    answer_begun: bool = True

    @abc.abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int, tokens_left: int | None = None) -> None:
        """Write the allowed-token bits into `bitmask[row]` (int32, CPU). EOS ids are allowed exactly when the
        grammar may end here. With `tokens_left`, allow only tokens from which the document can still be
        completed within that many tokens (the budget rule), when the backend knows distances."""

    def vet(self, token_id: int, tokens_left: int | None) -> int:
        """The token to append in place of `token_id`, sampled under this step's mask with `tokens_left` tokens
        left (this one included): itself, unless appending it would leave no way to complete the output in time
        and another token keeps one, or the output is complete now and an EOS id ends it (the budget rule, for
        backends whose masks cannot know distances). Called before `accept`, which then takes the returned token
        (an EOS id ends the output instead); never with an EOS id."""
        return token_id

    @abc.abstractmethod
    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False (state unchanged) if the token is not allowed. Never called with
        an EOS id: EOS means finished."""

    @abc.abstractmethod
    def is_terminated(self) -> bool:
        """No token but EOS can follow: the constrained output is complete."""

    @abc.abstractmethod
    def can_end(self) -> bool:
        """The output so far is a complete document (EOS would be accepted)."""

    def min_tokens_to_end(self) -> int | None:
        """How many tokens complete the output from here: the fewest where the backend knows distances, else the
        length of one completion it found; None when it knows none. For constraints that run before this one
        and must leave it room (constrain/reasoning.py)."""
        return None

    def forced_after(self, tokens: list[int]) -> bytes | None:
        """The bytes the grammar forces after `tokens`, this matcher left as it is (b"" where it leaves a choice):
        the distinct-keys lookahead (constrain/distinct_keys.py). None where the grammar refuses the tokens, or the
        backend cannot tell."""
        return None

    def mask_after(self, tokens: list[int]):
        """The mask row (a numpy array of uint32 words, EOS included where the output may end) after `tokens`,
        this matcher left as it is: the lookahead of the checks on finished values (constrain/late_keywords.py).
        None where the grammar refuses the tokens, or the backend cannot tell."""
        return None


class Grammar(abc.ABC):
    """A compiled constraint for one vocabulary; immutable and shared, hands out fresh matchers."""

    backend: str  # "outlines" | "llguidance"; a grammar made of parts: `backend_of_parts`
    unenforced: tuple[str, ...] = ()  # JSON Pointers of keywords accepted but not enforced (non-strict only)
    # tools with a response_format (constrain/either.py): the answer's unenforced pointers, in its schema's terms
    answer_unenforced: tuple[str, ...] = ()
    # Tool calls written between tags: the opening tag (the JSON followers of constrain/checked.py follow each
    # call as an item of the call schema's array); None: the output is one JSON document, or text.
    call_tag: bytes | None = None

    @abc.abstractmethod
    def matcher(self, lane: int = 0) -> Matcher:
        """A fresh matcher. Matchers of different `lane`s share no mutable state with each other, so that the
        engine's mask threads may fill their rows at once (llguidance's copies of one parse share a lexer, which
        serialises them: constrain/llg_backend.py keeps a parse per lane); lane 0 when one thread fills them all."""


def backend_of_parts(*parts: Grammar | None) -> str:
    """The backend of a grammar made of parts (each function's arguments, the answer beside calls): the distinct
    backends of its parts, joined by "+" (`llguidance+outlines`). One part alone named it, and the auto policy moves
    a repeated part to outlines on its own: where one part named it, the response header and the fingerprint hid
    that a seed's tokens had changed (a harmony call's arguments came in other tokens under the same header)."""
    return "+".join(sorted({name for part in parts if part is not None for name in part.backend.split("+")}))
