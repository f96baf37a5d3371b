"""The tool-call output formats, in one place: the constraint that produces them, the parser that reads them
back, and the prompt text that describes ours to a model whose chat template has no tool support.

Each call is `{"name": <tool name>, "arguments": <object valid against that function's parameters>}`; exactly one
call when `parallel_tool_calls` is false or a named function is forced. The calls are written
- "json_array" (ours, for templates without tool support): as a JSON array. With tool_choice "auto" the output is
  either such an array or free text whose first character other than whitespace is not "[" or "{".
- "hermes" (the format of the chat templates of Qwen2.5, Qwen3, Hermes and their fine-tunes, which tell the model
  to write it): each call as `<tool_call>\n{...}\n</tool_call>`, calls separated by a newline. With tool_choice
  "auto" the output is calls, or free text holding no `<tool_call>`, or such text followed by calls (where the
  tag is one token of the vocabulary, as in those models').
- "qwen3_coder" (the format of Qwen3-Coder's and Qwen3.5's templates): each call in `<tool_call>` tags as
  `<function=NAME>` and a `<parameter=KEY>` per argument, its value raw text where its schema takes strings, else
  JSON (constrain/xml_calls.py, which also parses it). With tool_choice "auto" as in "hermes".
- "glm45" and "glm47" (the formats of GLM-4.5/4.6's and GLM-4.7's and later templates): each call as
  `<tool_call>NAME`, then `<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>` per argument, then `</tool_call>`,
  values written as in "qwen3_coder"; glm45 writes a newline after the name and after each argument, and between
  calls. The tags are special tokens of GLM's vocabulary: such requests are decoded with special tokens.
- "llama3_json" (the format of Llama 3.1, 3.2 and 3.3's templates): one call as a bare object whose arguments are
  under "parameters", `{"name": ..., "parameters": {...}}`. Always one call: those templates refuse to render an
  assistant message with more. With tool_choice "auto", the call or free text whose first character other
  than whitespace is not "{". The call may begin with the `<|python_tag|>` token, as those models sometimes
  write it (`CallTokenGrammar`, where the vocabulary has it).
- "mistral" (the format of Mistral's templates, Mistral 7B v0.3, Nemo, Large 2 and their fine-tunes): the token
  `[TOOL_CALLS]`, then the calls as in "json_array". That token is one of the vocabulary's special tokens, which
  no grammar writes (constrain/vocabulary.py): `CallTokenGrammar` puts it before the calls' grammar. With
  tool_choice "auto", the token and calls, or free text as in "json_array". The token is special, so the decoded
  text usually leaves it out; the parsers take the calls either way.
- "granite" (the format of IBM Granite 3's templates): the token `<|tool_call|>`, then the calls as in "json_array",
  as in "mistral" with that token for `[TOOL_CALLS]` (a special token of Granite's vocabulary).
- "mistral_args" (the format of Mistral's later templates: Mistral Small 3.2, Magistral, Devstral, Ministral 3):
  each call as `[TOOL_CALLS]name[ARGS]{arguments}`, both tags special tokens (`ArgsCallsGrammar`). With tool_choice
  "auto", also free text, or text followed by calls. The text must keep the tags to be read back: such requests
  are decoded with special tokens. (So are hermes calls where the vocabulary has the tags as special tokens, as
  some fine-tunes' do: the vocabulary lets grammars write those, `Vocabulary.from_tokenizer(writable_special=...)`.)
- "harmony" (gpt-oss's format, constrain/harmony.py): one call, after any reasoning messages, as
  `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{arguments}`, ended by `<|call|>`. Its
  header's text is the answer's text (special tokens as they are written), so the call reads back as the
  "mistral_args" calls do, with that header for their tags. With tool_choice "auto", a final message of free text
  instead.
Never imports HTTP.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urldefrag, urljoin

from constrain.grammar import ConstraintError, ConstraintSpec, refuse_unread_fields
from constrain.harmony import ARGS_OPEN, CALL_OPEN
from constrain.support import NAMED_SUBSCHEMAS, VALUE_KEYWORDS, id_keyword


TOOL_FORMATS = ("json_array", "hermes", "llama3_json", "mistral", "mistral_args", "qwen3_coder", "glm45", "glm47",
                "harmony", "granite")
XML_FORMATS = ("qwen3_coder", "glm45", "glm47")  # (constrain/xml_calls.py)
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
MISTRAL_CALLS, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
# The formats that write each call as a tag, the function's name, another tag, then the arguments' JSON object.
NAME_THEN_ARGS = {"mistral_args": (MISTRAL_CALLS, MISTRAL_ARGS), "harmony": (CALL_OPEN, ARGS_OPEN)}
LLAMA3_CALL_TAG = "<|python_tag|>"
GRANITE_CALLS = "<|tool_call|>"
# The special token a format's calls may begin with (left out of the text unless the request keeps special tokens).
LEAD_TAGS = {"mistral": MISTRAL_CALLS, "granite": GRANITE_CALLS, "llama3_json": LLAMA3_CALL_TAG}
# The formats whose calls are that token, then a JSON array of calls (constrain/call_token.py)
TOKEN_THEN_ARRAY = ("mistral", "granite")
# Free text under tool_choice "auto" where calls are told apart by their token: it may not start as calls would
# once that token is left out of the decoded text (see `parse_tool_calls`), after any whitespace.
# Both may also be empty or whitespace alone: an answer with nothing to say (and the budget rule's shortest answer,
# so a reasoning model whose thinking ran to max_tokens ends its block with no answer, and a model that wrote
# only newlines is cut there, not closed by a walk's one character).
MISTRAL_FREE_TEXT = r"[ \t\r\n]*([^\[{ \t\r\n][\s\S]*)?"
ANY_TEXT = r"[\s\S]*"  # free text where calls are told apart by tags


@functools.cache
def free_text_pattern(tool_format: str) -> str:
    """Free text (tool_choice "auto") in a format whose calls a special token opens, as a regex: text that cannot
    be read back as calls. A special token and its text spelled in ordinary tokens decode alike, and the parsers
    read the decoded text: free text `[TOOL_CALLS]f[ARGS]{"a": "X"}` came back as a call to `f`, its arguments
    never held to the schema (QA toolfmt F1). So the text holds no call tag where a format reads calls after text
    (mistral_args, harmony's final message), and does not begin, after whitespace, with one (or with what opens
    the calls' JSON) where the calls are the whole output (mistral, granite)."""
    from constrain.regex_sets import complement_pattern

    if tool_format in NAME_THEN_ARGS:
        opening = re.escape(NAME_THEN_ARGS[tool_format][0])
    elif tool_format in TOKEN_THEN_ARRAY:
        opening = rf"^[ \t\r\n]*(?:[\[{{]|{re.escape(LEAD_TAGS[tool_format])})"
    else:
        raise ValueError(f"{tool_format} calls are not opened by a special token")
    pattern = complement_pattern(opening)
    if pattern is None or not (pattern.startswith("^") and pattern.endswith("$")):
        raise ValueError(f"no free-text pattern for {tool_format}")
    return pattern[1:-1]  # (a constraint's regex matches the whole output)


def arguments_key(tool_format: str) -> str:
    """The key a call's arguments go under in `tool_format`."""
    return "parameters" if tool_format == "llama3_json" else "arguments"


def text_may_not_start(tool_format: str) -> str:
    """The characters free text (tool_choice "auto") may not start with in `tool_format`, after any whitespace:
    those that open calls (the hermes format tells calls by their tag instead). Leading whitespace is free text's
    own: a SentencePiece model's first word is a token that begins with a space ("▁The")."""
    return "{" if tool_format == "llama3_json" else "[{"


@dataclass(frozen=True)
class CallsOpening:
    """Where an output's tool calls begin in its decoded text, so that stop strings, which cut text, never cut a
    call (constrain/stops.py): the grammar ends calls, and a call cut short could not be read back."""

    always: bool = False  # the whole output is calls (tool_choice "required" or a named function)
    tags: tuple[str, ...] = ()  # calls begin where one of these appears in the text
    first: str = ""  # calls begin at the start when the output's first character but whitespace is one of these,
    first_tags: tuple[str, ...] = ()  # or when the output starts, after whitespace, with one of these


def calls_opening(tool_format: str, tool_choice: str, object_answer: bool = False) -> CallsOpening:
    """How `tool_format`'s calls announce themselves under `tool_choice` ("auto" | "required" | "named").
    `object_answer`: a response_format's answer may come instead (then a `{` opens it, not a call)."""
    if tool_choice != "auto":
        return CallsOpening(always=True)
    if tool_format == "hermes" or tool_format in XML_FORMATS:
        return CallsOpening(tags=(HERMES_OPEN,))
    if tool_format in NAME_THEN_ARGS:
        return CallsOpening(tags=(NAME_THEN_ARGS[tool_format][0],))
    lead = LEAD_TAGS.get(tool_format)  # (in the text when the request keeps special tokens)
    return CallsOpening(first="[" if object_answer else text_may_not_start(tool_format),
                        first_tags=(lead,) if lead else ())


def new_call_id() -> str:
    """A tool call's id, as OpenAI spells them: `call_` and 24 random hex digits."""
    return "call_" + secrets.token_hex(12)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object, as text (the OpenAI wire shape)
    id: str = field(default_factory=new_call_id)


@dataclass(frozen=True)
class ParsedCalls:
    """A finished output that made tool calls."""

    calls: list[ToolCall]
    # Text the model wrote before its calls (tagged formats under tool_choice "auto"), less the whitespace that ends
    # it: as a stream sends it (service/tool_stream.py), which cannot know at the first characters that calls follow.
    content: str | None = None
    # False: read as a stream reads an output max_tokens cut (service/tool_stream.py `as_streamed`), the last call's
    # arguments as far as they were written
    complete: bool = True


def _own_base(node: Any, id_key: str) -> str | None:
    """The URI the subschema `node` names itself with (its `$id`, less any fragment), if it does."""
    value = node.get(id_key) if isinstance(node, dict) else None
    return urldefrag(value).url if isinstance(value, str) and not value.startswith("#") else None


def _rebase_refs(node: Any, old: str, new: str, id_key: str = "$id", document: str | None = None,
                 anchors: str = "", names: bool = False) -> Any:
    """Local $refs that start with `old` start with `new` instead: "#" and "#/$defs/tool<i>" move a function's
    parameters under the call schema's $defs (`call_schema`) and back (`function_schema`). `document`: the URI the
    parameters named themselves with (their root `$id`, which the call schema leaves out): references to it read
    as local ones, others and the `$id`s of subschemas inside as the URIs they resolve to. `anchors`: a prefix for
    the names of their anchors (`$anchor`, `$dynamicAnchor`, a plain-name `$id` `#name`, which becomes an
    `$anchor`: the calls' schema is 2020-12) and the references to them, which the calls' schema holds side by
    side (two functions' `s` made one: review2 F2). Not inside a subschema with an `$id` of its own, whose `#` is
    itself wherever it sits: its references moved to the call schema's place named another subschema, or none (a
    `$ref` under a nested `$id` was held to the parameters' root definition of the same name). Values (`const`,
    `enum`, ...) are left as they are. `names`: `node` maps names to subschemas (`properties`' value: a property
    named `default` is a subschema, review4 F1)."""
    if names and isinstance(node, dict):
        return {k: _rebase_refs(v, old, new, id_key, document, anchors) for k, v in node.items()}
    if _own_base(node, id_key) is not None:
        inside = copy.deepcopy(node)
        if document is not None:
            inside[id_key] = urljoin(document, inside[id_key])
        return inside
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k in ("$ref", "$dynamicRef") and isinstance(v, str):
                if document is not None and not v.startswith("#"):
                    whole, fragment = urldefrag(urljoin(document, v))
                    v = "#" + fragment if whole == document else urljoin(document, v)
                if v == old or v.startswith(old + "/"):
                    v = new + v[len(old):]
                elif v.startswith("#") and not v.startswith("#/"):
                    v = "#" + anchors + v[1:]
                out[k] = v
            elif k in VALUE_KEYWORDS:
                out[k] = copy.deepcopy(v)
            elif k in ("$anchor", "$dynamicAnchor") and isinstance(v, str):
                out[k] = anchors + v
            elif isinstance(v, str) and k == id_key and v.startswith("#") and len(v) > 1 and "$anchor" not in node:
                out["$anchor"] = anchors + v[1:]
            else:
                out[k] = _rebase_refs(v, old, new, id_key, document, anchors, names=k in NAMED_SUBSCHEMAS)
        return out
    if isinstance(node, list):
        return [_rebase_refs(v, old, new, id_key, document, anchors) for v in node]
    return node


def _resources(node: Any, id_key: str, base: str | None = None, found: dict[str, Any] | None = None,
               names: bool = False) -> dict[str, Any]:
    """The subschemas in `node` that name themselves (an `$id`), by the URI they name (resolved against `base` and
    the `$id`s around them: `item.json` under `http://x/a/root.json` is `http://x/a/item.json`, review3 F3).
    `names` as in `_rebase_refs`."""
    found = {} if found is None else found
    if names and isinstance(node, dict):
        for value in node.values():
            _resources(value, id_key, base, found)
    elif isinstance(node, dict):
        own = _own_base(node, id_key)
        if own is not None:
            base = urldefrag(urljoin(base or "", own)).url
            found.setdefault(base, node)
        for key, value in node.items():
            if key not in VALUE_KEYWORDS:
                _resources(value, id_key, base, found, names=key in NAMED_SUBSCHEMAS)
    elif isinstance(node, list):
        for value in node:
            _resources(value, id_key, base, found)
    return found


TOOL_DEF = re.compile(r"/\$defs/tool(\d+)(?=/|$)")  # where function i's parameters sit in the call schema


def call_schema(functions: list[dict], single: bool, args_key: str = "arguments") -> dict:
    """The JSON Schema of the tool-call array for these functions, each call's arguments under `args_key`. Each
    function's parameters go through the same exact rewrites as a response_format schema
    (constrain/spec.normalise_schema) before they move under $defs."""
    from constrain.spec import normalise_schema

    defs, variants = {}, []
    resources: dict[str, tuple[int, Any]] = {}
    every = []
    for i, fn in enumerate(functions):
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}, "additionalProperties": False}
        params = normalise_schema(params)
        if params is False:
            raise ConstraintError(f"tools[{i}].function.parameters: Unsatisfiable schema: it rewrites to `false` "
                                  "(such as {\"not\": {}}): no arguments satisfy it", param="tools")
        params = arguments_object_schema(params)
        every.append((params, id_keyword(params.get("$schema"))))
    names = [_own_base(params, id_key) for params, id_key in every]
    for i, (params, id_key) in enumerate(every):
        key = f"tool{i}"
        document = names[i]
        inner = {k: v for k, v in params.items() if k != id_key} if document is not None else params
        if document is not None and (names.count(document) > 1 or not _resources(inner, id_key, document)):
            # (several functions' parameters often share one boilerplate `$id`: left out, the parameters are part
            # of the calls' document; where no other function's shares it and subschemas inside name themselves,
            # which may refer back to it by that name, it stays, and the parameters remain a document of their own)
            params = inner
        for uri, resource in _resources(params, id_key, document).items():  # (a document holds each URI once)
            if resources.setdefault(uri, (i, resource))[1] != resource:
                raise ConstraintError(f"tools[{i}].function.parameters: the subschema named {uri!r} (its "
                                      f"`{id_key}`) differs from the one tools[{resources[uri][0]}] names so: "
                                      "the calls' schema holds both functions' parameters, where a name means one "
                                      "subschema; give them different names", param="tools")
        defs[key] = _rebase_refs(params, "#", f"#/$defs/{key}", id_key, document, anchors=f"{key}-")
        variants.append({"type": "object", "properties": {"name": {"const": functions[i]["name"]},
                                                          args_key: {"$ref": f"#/$defs/{key}"}},
                         "required": ["name", args_key], "additionalProperties": False})
    item = variants[0] if len(variants) == 1 else {"anyOf": variants}
    schema = {"type": "array", "items": item, "minItems": 1, "$defs": defs}
    if single:
        schema["maxItems"] = 1
    return schema


def arguments_object_schema(params: Any) -> Any:
    """`params` held to JSON objects: a call's arguments are an object (OpenAI reads `parameters: {}` as a function
    without arguments), so a schema that leaves the type open (`{}`, `{"properties": ...}` without `type`, an
    `anyOf` with other branches, a root `$ref` to any of these) takes objects only; anything else would be written
    as arguments no client can read, and the call dropped. (`_functions` refuses a `type` other than object.)"""
    if params is True:
        return {"type": "object"}
    if isinstance(params, dict) and "type" not in params:
        return {**params, "type": "object"}
    return params


def _functions(tools: Any) -> list[dict]:
    from constrain.spec import referenced_types, validate_schema

    if not isinstance(tools, list) or not tools:
        raise ConstraintError("tools must be a non-empty list", param="tools")
    out, names = [], set()
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ConstraintError(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}", param="tools")
        name = fn.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise ConstraintError(f"tools[{i}].function.name must be a non-empty string", param="tools")
        if name in names:
            raise ConstraintError(f"tools[{i}]: duplicate function name {name!r}", param="tools")
        names.add(name)
        params = fn.get("parameters")
        if params is not None:
            validate_schema(params, "tools", f"/{i}/function/parameters")
            named = referenced_types(params, params["$ref"]) if isinstance(params, dict) and "type" not in params \
                and isinstance(params.get("$ref"), str) else None  # (a root `$ref`: its target's type)
            if isinstance(params, dict) and (params.get("type", "object") != "object"
                                             or named is not None and "object" not in named):
                key = "type" if "type" in params else "$ref"
                found = (f"type {params['type']!r}" if key == "type" else
                         f"a schema of type {' or '.join(sorted(named))}")
                raise ConstraintError(f"tools[{i}].function.parameters must describe an object (a function's "
                                      f"arguments are a JSON object): its {key} at /{i}/function/parameters/{key} "
                                      f"names {found}", param="tools", pointer=f"/{i}/function/parameters/{key}")
        out.append(fn)
    return out


def _named(functions: list[dict], name: Any, where: str) -> dict:
    if not isinstance(name, str):
        raise ConstraintError(f"{where} must be the name of a function, as tool_choice {{\"type\": \"function\", "
                              f"\"function\": {{\"name\": ...}}}} writes it", param="tool_choice")
    for fn in functions:
        if fn["name"] == name:
            return fn
    raise ConstraintError(f"{where} names an unknown function {name!r}", param="tool_choice")


_FUNCTION_FIELDS = ("name", "description", "parameters", "strict")  # (OpenAI's function definition)


def _allowed_functions(functions: list[dict], allowed: Any) -> tuple[list[dict], str]:
    """tool_choice `allowed_tools`: the functions it lets the model call, in `tools` order, and its mode. Every
    tool stays in the prompt (the point of allowed_tools is a prompt that does not change); only the constraint
    narrows."""
    if not isinstance(allowed, dict) or allowed.get("mode") not in ("auto", "required"):
        raise ConstraintError("tool_choice.allowed_tools must be {'mode': 'auto' | 'required', 'tools': [...]}",
                              param="tool_choice")
    entries = allowed.get("tools")
    if not isinstance(entries, list) or not entries:
        raise ConstraintError("tool_choice.allowed_tools.tools must be a non-empty list", param="tool_choice")
    names = set()
    for i, entry in enumerate(entries):
        fn = entry.get("function") if isinstance(entry, dict) and entry.get("type") == "function" else None
        if not isinstance(fn, dict):
            raise ConstraintError(f"tool_choice.allowed_tools.tools[{i}] must be "
                                  "{'type': 'function', 'function': {'name': ...}}", param="tool_choice")
        names.add(_named(functions, fn.get("name"), f"tool_choice.allowed_tools.tools[{i}]")["name"])
        # (an entry may be the tool's whole definition, as a client passing its `tools` on sends it: the function
        # is the one of `tools` so named)
        refuse_unread_fields(entry, ("type", "function"), f"tool_choice.allowed_tools.tools[{i}]")
        refuse_unread_fields(fn, _FUNCTION_FIELDS, f"tool_choice.allowed_tools.tools[{i}].function")
    refuse_unread_fields(allowed, ("mode", "tools"), "tool_choice.allowed_tools")
    return [fn for fn in functions if fn["name"] in names], allowed["mode"]


def tools_spec(tools: Any, tool_choice: Any, parallel_tool_calls: Any,
               tool_format: str = "json_array") -> ConstraintSpec | None:
    """The constraint for a tools request; None when the model may not call tools (tool_choice "none").
    `tool_format` is how the model writes calls (`TOOL_FORMATS`): the server picks it from the chat template."""
    if tool_format not in TOOL_FORMATS:
        raise ValueError(f"tool_format must be one of {TOOL_FORMATS}")
    if parallel_tool_calls is None:
        parallel_tool_calls = True
    if not isinstance(parallel_tool_calls, bool):
        raise ConstraintError("parallel_tool_calls must be a boolean", param="parallel_tool_calls")
    if tool_choice == "none":  # (the tools are checked all the same: a broken one is a 400 whatever tool_choice says)
        if tools is not None:
            _functions(tools)
        return None
    if tools is None:
        raise ConstraintError("tool_choice needs tools", param="tool_choice")
    functions = _functions(tools)
    position = {f["name"]: i for i, f in enumerate(functions)}  # (names are unique)
    mode = "auto" if tool_choice is None else tool_choice
    if isinstance(mode, dict) and mode.get("type") == "allowed_tools":
        functions, mode = _allowed_functions(functions, tool_choice.get("allowed_tools"))
        refuse_unread_fields(tool_choice, ("type", "allowed_tools"), "tool_choice")
    if isinstance(mode, dict) and mode.get("type") == "function":
        fn = mode.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        named = _named(functions, name, "tool_choice.function.name")
        # (a field tool_choice does not have is refused, as response_format's are: `function_call`'s are too)
        refuse_unread_fields(mode, ("type", "function"), "tool_choice")
        refuse_unread_fields(fn, ("name",), "tool_choice.function")
        functions, mode, single = [named], "named", True
    elif mode in ("auto", "required"):
        single = not parallel_tool_calls
    elif isinstance(mode, dict) and mode.get("type") == "custom":  # (as a custom tool is: service/protocol.py)
        raise ConstraintError("custom tools (free-form text input) are not supported by this server: name a "
                              "`function` tool", param="tool_choice", code="unsupported_parameter")
    else:
        raise ConstraintError("tool_choice must be 'none', 'auto', 'required', "
                              "{'type': 'function', 'function': {'name': ...}} or "
                              "{'type': 'allowed_tools', 'allowed_tools': {'mode': ..., 'tools': [...]}}",
                              param="tool_choice")
    strict_tools = tuple(i for i, f in enumerate(functions) if f.get("strict") is True)
    sources = tuple((position[f["name"]], f.get("parameters")) for f in functions)
    schema = call_schema(functions, single, arguments_key(tool_format))
    if tool_format == "llama3_json":
        schema = call_item_schema(schema)  # one bare call object
    return ConstraintSpec(kind="tools", schema=schema, strict=bool(strict_tools),
                          strict_tools=strict_tools,
                          tool_names=tuple(f["name"] for f in functions), tool_choice=mode,
                          parallel_tool_calls=bool(parallel_tool_calls) and mode != "named"
                          and tool_format != "llama3_json",
                          tool_format=tool_format, extra={"tool_sources": sources})


def function_schema(spec: ConstraintSpec, i: int) -> dict:
    """The parameters of the call schema's function `i` (in `spec.tool_names` order) as a schema of their own,
    their exact rewrites done; its pointers `p` are the call schema's `/$defs/tool<i>p`."""
    params = spec.schema["$defs"][f"tool{i}"]
    return _rebase_refs(params, f"#/$defs/tool{i}", "#", id_keyword(params.get("$schema")))


def client_pointer_of_call(spec: ConstraintSpec, pointer: str) -> tuple[str, bool]:
    """A pointer into the call schema, told in terms of the request's `tools` (the `param` of tools errors):
    `/$defs/tool<i>/...` names `/<index in tools>/function/parameters/...`, itself told in terms of the client's
    parameters (constrain.support.client_pointer). Also whether that named a rewritten subschema."""
    from constrain.support import client_pointer

    m = TOOL_DEF.match(pointer)
    sources = spec.extra.get("tool_sources", ())
    if m is None or int(m.group(1)) >= len(sources):
        return pointer, False
    index, params = sources[int(m.group(1))]
    rest = pointer[m.end():]
    inner = client_pointer(params, rest) if rest and params is not None else rest
    return f"/{index}/function/parameters" + ("" if inner == "/" else inner), inner != rest


_JSON_SPACE = " \t\r\n"  # JSON's whitespace, which the grammars allow before calls


def parse_tool_calls(text: str, spec: ConstraintSpec) -> ParsedCalls | None:
    """The calls in a model's output, or None when the output is free text (not tool calls, or calls cut short by
    `max_tokens`: then the whole text is the answer's content)."""
    if spec.tool_format == "hermes":
        return _parse_hermes(text, spec)
    if spec.tool_format in NAME_THEN_ARGS:
        return _parse_args_calls(text, spec)
    if spec.tool_format in XML_FORMATS:
        return _parse_xml_calls(text, spec)
    body = text.strip(_JSON_SPACE)  # (what the grammars let stand before calls: Python's own `strip` also took
    # `\x0c` and U+2028, which free text may begin with, and read such text as calls, QA review7 F1)
    if spec.tool_format in LEAD_TAGS:  # (decoded with skip_special_tokens: false)
        body = body.removeprefix(LEAD_TAGS[spec.tool_format]).lstrip(_JSON_SPACE)
    # (with a response_format's answer beside them, calls are an array: an object is the answer)
    openers = "[" if spec.answer is not None else text_may_not_start(spec.tool_format)
    if not body.startswith(tuple(openers)):
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, list):
        value, starts = [value], [0]
    else:
        starts = [start for _, start, _ in _members(body, 0)]
    calls = _calls(value, spec, [_arguments_text(body, start, spec) for start in starts])
    return ParsedCalls(calls) if calls else None


_SPACE = re.compile(r"\s*")
_DECODER = json.JSONDecoder()


def _parse_hermes(text: str, spec: ConstraintSpec) -> ParsedCalls | None:
    """Each call's JSON is read as JSON (an argument may hold "</tool_call>"), then its closing tag."""
    start = text.find(HERMES_OPEN)
    if start < 0:
        return None
    values, texts, pos = [], [], start
    while pos < len(text):
        if not text.startswith(HERMES_OPEN, pos):
            return None  # text after the calls
        try:
            at = _SPACE.match(text, pos + len(HERMES_OPEN)).end()
            value, pos = _DECODER.raw_decode(text, at)
        except ValueError:
            return None  # a call cut short
        pos = _SPACE.match(text, pos).end()
        if not text.startswith(HERMES_CLOSE, pos):
            return None
        values.append(value)
        texts.append(_arguments_text(text, at, spec))
        pos = _SPACE.match(text, pos + len(HERMES_CLOSE)).end()
    calls = _calls(values, spec, texts)
    return ParsedCalls(calls, text[:start].rstrip() or None) if calls else None


def _parse_args_calls(text: str, spec: ConstraintSpec) -> ParsedCalls | None:
    """`[TOOL_CALLS]name[ARGS]{...}` per call (or the tags of another NAME_THEN_ARGS format), after any text; the
    arguments are read as JSON."""
    call_tag, args_tag = NAME_THEN_ARGS[spec.tool_format]
    start = text.find(call_tag)
    if start < 0:
        return None
    values, texts, pos = [], [], start
    while pos < len(text):
        if not text.startswith(call_tag, pos):
            return None  # text after the calls
        args = text.find(args_tag, pos)
        if args < 0:
            return None  # a call cut short
        name = text[pos + len(call_tag):args]
        try:
            value, pos = _DECODER.raw_decode(text, args + len(args_tag))
        except ValueError:
            return None
        values.append({"name": name, "arguments": value})
        texts.append(text[args + len(args_tag):pos])
        pos = _SPACE.match(text, pos).end()
    calls = _calls(values, spec, texts)
    return ParsedCalls(calls, text[:start].rstrip() or None) if calls else None


def _parse_xml_calls(text: str, spec: ConstraintSpec) -> ParsedCalls | None:
    """Calls in the qwen3_coder or GLM formats after any text, each value read in its form
    (constrain/xml_calls.py)."""
    from constrain.xml_calls import SHAPES, function_forms, parse_xml_calls

    found = parse_xml_calls(text, function_forms(spec), SHAPES[spec.tool_format])
    if found is None:
        return None
    calls = _calls(found[0], spec, [call.pop("arguments_text") for call in found[0]])
    return ParsedCalls(calls, found[1]) if calls else None


def _calls(values: list, spec: ConstraintSpec, texts: list[str | None]) -> list[ToolCall] | None:
    """`texts`: each call's arguments as the model wrote them (what a stream of the same answer sends), else None."""
    key = arguments_key(spec.tool_format)
    calls = []
    for item, text in zip(values, texts):
        if not isinstance(item, dict) or item.get("name") not in spec.tool_names or not isinstance(item.get(key), dict):
            return None
        calls.append(ToolCall(name=item["name"], arguments=text or json.dumps(item[key], ensure_ascii=False)))
    return calls or None


def _members(text: str, pos: int) -> list[tuple[str | None, int, int]]:
    """(key, or None in an array; start; end) of each member of the JSON object or array at `pos` (valid JSON)."""
    out, close = [], "}" if text[pos] == "{" else "]"
    pos = _SPACE.match(text, pos + 1).end()
    while text[pos] != close:
        key = None
        if close == "}":
            key, pos = _DECODER.raw_decode(text, pos)
            pos = _SPACE.match(text, _SPACE.match(text, pos).end() + 1).end()  # (past the colon)
        _, end = _DECODER.raw_decode(text, pos)
        out.append((key, pos, end))
        pos = _SPACE.match(text, end).end()
        pos = _SPACE.match(text, pos + 1).end() if text[pos] == "," else pos
    return out


def _arguments_text(text: str, pos: int, spec: ConstraintSpec) -> str | None:
    """The arguments of the call object at `pos` as the model wrote them, or None where it has none."""
    if text[pos] != "{":
        return None
    spans = {key: (start, end) for key, start, end in _members(text, pos)}
    key = arguments_key(spec.tool_format)
    return text[slice(*spans[key])] if key in spans else None


def call_token_id(tokenizer, token: str = MISTRAL_CALLS) -> int | None:
    """The id of `token` where the tokenizer has it as one token of its own (Mistral's `[TOOL_CALLS]`), else
    None: spelled in pieces, it could not be told from the same text written as an answer."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1 or tokenizer.convert_ids_to_tokens(ids[0]) != token:
        return None
    return int(ids[0])


def call_item_schema(schema: dict) -> dict:
    """The schema of one call in the call schema (`call_schema`), its `$defs` kept at the root, so that pointers
    into them (`/$defs/tool<i>/...`) name the same subschemas."""
    return {**schema["items"], "$defs": schema.get("$defs", {})}


def hermes_regex(item_regex: str) -> str:
    """One call in the hermes format, as a regex around the call's (for DFA backends, which serve one call: see
    constrain/compiler.py `_many_tagged_calls`)."""
    return f"{re.escape(HERMES_OPEN)}\\n({item_regex})\\n{re.escape(HERMES_CLOSE)}"


def tools_system_prompt(tools: list[dict]) -> str:
    """Instructions describing the functions and the output format, for templates without tool support."""
    lines = ["You can call the following functions:"]
    for tool in tools:
        fn = tool.get("function", tool)
        lines.append(f"- {fn['name']}: {fn.get('description', '').strip() or '(no description)'}")
        lines.append(f"  parameters (JSON Schema): {json.dumps(fn.get('parameters', {'type': 'object'}))}")
    lines += [
        "To call functions, answer with only a JSON array of calls and nothing else, for example:",
        '[{"name": "<function name>", "arguments": {<arguments as a JSON object>}}]',
        "Each element names one function and gives arguments valid against its parameters.",
        "If no function is needed, answer in plain text that does not start with \"[\" or \"{\".",
    ]
    return "\n".join(lines)
