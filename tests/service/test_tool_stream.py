"""ToolCallStream: the tool-call output format turned into OpenAI tool_calls deltas, however the text is split."""

from __future__ import annotations

import json

import pytest

from constrain.xml_calls import ValueForm
from service.tool_stream import ToolCallStream

TEXT = ('[{"name": "get_weather", "arguments": {"city": "Pa\\"ris}", "x": [1, {"a": 2}]}}, '
        '{"arguments": {"zone": "UTC"}, "name": "get_time"}]')


def _assemble(deltas):
    calls = {}
    for d in deltas:
        for tc in d["tool_calls"]:
            slot = calls.setdefault(tc["index"], {"ids": [], "name": "", "arguments": ""})
            if "id" in tc:
                slot["ids"].append(tc["id"])
            slot["name"] += tc["function"].get("name", "")
            slot["arguments"] += tc["function"]["arguments"]
    return calls


@pytest.mark.parametrize("step", [1, 2, 7, len(TEXT)])
def test_calls_reassemble_to_the_same_names_and_arguments_for_any_split(step):
    stream = ToolCallStream()
    deltas = [d for i in range(0, len(TEXT), step) for d in stream.feed(TEXT[i:i + step])]
    calls = _assemble(deltas)
    assert stream.made_calls
    assert [calls[i]["name"] for i in (0, 1)] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["arguments"]) == {"city": 'Pa"ris}', "x": [1, {"a": 2}]}
    assert json.loads(calls[1]["arguments"]) == {"zone": "UTC"}
    assert all(len(c["ids"]) == 1 and c["ids"][0].startswith("call_") for c in calls.values())
    # the first delta of a call carries id, type and name; later ones only argument text
    first = next(d["tool_calls"][0] for d in deltas if d["tool_calls"][0]["index"] == 0)
    assert first["type"] == "function" and first["function"] == {"name": "get_weather", "arguments": ""}


def test_text_that_is_not_a_call_streams_as_content():
    stream = ToolCallStream()
    assert stream.feed("  Hel") == [{"content": "  Hel"}]
    assert stream.feed("lo [x]") == [{"content": "lo [x]"}]
    assert not stream.made_calls


def test_a_single_call_object_without_the_array_is_a_call():
    stream = ToolCallStream()
    calls = _assemble(stream.feed('{"name": "f", "arguments": {}}'))
    assert calls[0]["name"] == "f" and calls[0]["arguments"] == "{}"


HERMES = ('Let me check. <tool\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "</tool_call>"}}\n'
          '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>')


@pytest.mark.parametrize("step", [1, 3, 11, len(HERMES)])
def test_hermes_calls_and_the_text_before_them_for_any_split(step):
    """The text before the first tag is content, less its trailing whitespace (as `ParsedCalls.content`): what may
    begin a tag is held back until known not to, and a half tag that stays text is sent."""
    stream = ToolCallStream("hermes")
    deltas = [d for i in range(0, len(HERMES), step) for d in stream.feed(HERMES[i:i + step])]
    deltas += stream.finish()
    assert "".join(d.get("content", "") for d in deltas) == "Let me check. <tool"
    calls = _assemble([d for d in deltas if "tool_calls" in d])
    assert [calls[i]["name"] for i in (0, 1)] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["arguments"]) == {"city": "</tool_call>"}
    assert json.loads(calls[1]["arguments"]) == {"zone": "UTC"}
    assert stream.made_calls


def test_hermes_text_answer_is_sent_whole_by_the_end():
    stream = ToolCallStream("hermes")
    sent = stream.feed("Sunny, 20 C <") + stream.feed("tool")
    assert "".join(d["content"] for d in sent) == "Sunny, 20 C"  # (the rest may still begin a tag)
    assert stream.feed(" \n") == [{"content": " <tool"}]  # (it did not; trailing whitespace may precede one)
    assert stream.finish() == [{"content": " \n"}]
    assert not stream.made_calls


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
@pytest.mark.parametrize("cut", ["<", "<tool", "<tool_call"])
def test_a_call_tag_max_tokens_cut_is_no_content_where_the_answer_is_calls_only(tool_choice, cut):
    """Under tool_choice "required" (or a named function) with a tag of several tokens, an output cut inside the
    tag came back as `content: "<tool_call"`, streamed and not: the answer can only be calls."""
    from constrain import spec_from_request
    from service.tool_stream import as_streamed, tool_stream_for

    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    spec = spec_from_request(tools=tools, tool_choice=tool_choice, tool_format="hermes")
    stream = tool_stream_for(spec)
    assert stream.feed(cut) + stream.finish() == []
    parsed = as_streamed(cut, spec)
    assert parsed.content is None and parsed.calls == []
    auto = spec_from_request(tools=tools, tool_choice="auto", tool_format="hermes")
    assert as_streamed(cut, auto).content == cut  # (under "auto" it may be text)


LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Pa\\"ris}", "arguments": [1]}}'


@pytest.mark.parametrize("step", [1, 3, len(LLAMA_CALL)])
def test_llama3_call_streams_its_parameters_as_arguments(step):
    stream = ToolCallStream("llama3_json")
    deltas = [d for i in range(0, len(LLAMA_CALL), step) for d in stream.feed(LLAMA_CALL[i:i + step])]
    deltas += stream.finish()
    calls = _assemble(deltas)
    assert stream.made_calls and list(calls) == [0] and calls[0]["name"] == "get_weather"
    assert json.loads(calls[0]["arguments"]) == {"city": 'Pa"ris}', "arguments": [1]}


def test_llama3_text_may_start_with_a_bracket():
    stream = ToolCallStream("llama3_json")
    assert stream.feed(" [1] is") + stream.feed(" a list.") + stream.finish() == \
        [{"content": " [1] is"}, {"content": " a list."}]
    assert not stream.made_calls


ARGS_TEXT = ('Let me check [it].\n[TOOL_CALLS]get_weather[ARGS]{"city": "Pa\\"ris}", "x": [1, {"a": 2}]}'
             '[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}')


@pytest.mark.parametrize("step", [1, 2, 5, len(ARGS_TEXT)])
def test_mistral_args_calls_and_the_text_before_them_for_any_split(step):
    """`[TOOL_CALLS]name[ARGS]{...}` per call (the text keeps its special tokens): the text before the first tag
    is content, less the whitespace that ends it; each name is announced at its `[ARGS]`."""
    stream = ToolCallStream("mistral_args")
    deltas = [d for i in range(0, len(ARGS_TEXT), step) for d in stream.feed(ARGS_TEXT[i:i + step])]
    deltas += stream.finish()
    content = "".join(d.get("content", "") for d in deltas)
    calls = _assemble([d for d in deltas if "tool_calls" in d])
    assert content == "Let me check [it]." and stream.made_calls
    assert [calls[i]["name"] for i in (0, 1)] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["arguments"]) == {"city": 'Pa"ris}', "x": [1, {"a": 2}]}
    assert json.loads(calls[1]["arguments"]) == {"zone": "UTC"}
    text = ToolCallStream("mistral_args")
    assert text.feed("It is [TOOL") == [{"content": "It is"}] and text.finish() == [{"content": " [TOOL"}]


@pytest.mark.parametrize("step", [1, 3, 100])
def test_a_lead_tag_kept_in_the_text_is_dropped_and_text_that_only_looked_like_it_is_content(step):
    """Llama 3's `<|python_tag|>` before a call (in the text when special tokens are kept) opens no content."""
    call = '<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}}'
    stream = ToolCallStream("llama3_json")
    deltas = [d for i in range(0, len(call), step) for d in stream.feed(call[i:i + step])] + stream.finish()
    assert not any("content" in d for d in deltas) and stream.made_calls
    assert json.loads(_assemble(deltas)[0]["arguments"]) == {"zone": "UTC"}
    text = " <|b> is not a tag"
    stream = ToolCallStream("llama3_json")
    deltas = [d for i in range(0, len(text), step) for d in stream.feed(text[i:i + step])] + stream.finish()
    assert "".join(d["content"] for d in deltas) == text and not stream.made_calls


@pytest.mark.parametrize("space", ["\x0c", "\u2028", "\xa0"])
def test_a_lead_tag_after_whitespace_json_does_not_know_is_content(space):
    """Free text may begin with Python's whitespace that JSON's is not, then spell the tag: the parser reads that
    text as content (it strips JSON's whitespace only, as the grammars allow), and so does the stream."""
    text = space + '<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC"}}'
    stream = ToolCallStream("llama3_json")
    deltas = [d for ch in text for d in stream.feed(ch)] + stream.finish()
    assert "".join(d["content"] for d in deltas) == text and not stream.made_calls


XML_FORMS = {"write_file": {"path": ValueForm(raw=True), "mode": ValueForm(raw=True, nullable=True),
                            "lines": ValueForm(raw=False)},
             "get_time": {"zone": ValueForm(raw=True, nullable=True)}}
XML_TEXT = ('Writing it.\n\n<tool_call>\n<function=write_file>\n<parameter=path>\na "b"\n\\c\n</parameter\n'
            '</parameter>\n<parameter=mode>\nnul\n</parameter>\n<parameter=lines>\n[1, {"a": "</x>"}]\n</parameter>\n'
            '</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=zone>\nnull\n</parameter>\n'
            '</function>\n</tool_call>\n<tool_call>\n<function=write_file>\n</function>\n</tool_call>')
GLM45_TEXT = ('Writing it.\n<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>a "b"\n\\c\n</arg_value\n'
              '</arg_value>\n<arg_key>mode</arg_key>\n<arg_value>nul</arg_value>\n<arg_key>lines</arg_key>\n'
              '<arg_value>[1, {"a": "</arg_value>"}]</arg_value>\n</tool_call>\n<tool_call>get_time\n'
              '<arg_key>zone</arg_key>\n<arg_value>null</arg_value>\n</tool_call>\n<tool_call>write_file\n</tool_call>')
GLM47_TEXT = GLM45_TEXT.replace(">\n<", "><").replace("write_file\n", "write_file").replace("get_time\n", "get_time")
XML_ARGUMENTS = [{"path": 'a "b"\n\\c\n</parameter', "mode": "nul", "lines": [1, {"a": "</x>"}]}, {"zone": None}, {}]
GLM_ARGUMENTS = [{"path": 'a "b"\n\\c\n</arg_value\n', "mode": "nul", "lines": [1, {"a": "</arg_value>"}]},
                 {"zone": None}, {}]


@pytest.mark.parametrize("tool_format, text, arguments", [("qwen3_coder", XML_TEXT, XML_ARGUMENTS),
                                                           ("glm45", GLM45_TEXT, GLM_ARGUMENTS),
                                                           ("glm47", GLM47_TEXT, GLM_ARGUMENTS)])
@pytest.mark.parametrize("step", [1, 2, 5, 13, 1000])
def test_xml_calls_stream_as_json_arguments_for_any_split(tool_format, text, arguments, step):
    """Raw values stream as JSON strings (held while they may be null, or the beginning of their closing tag),
    JSON values as written, up to their closing tag outside their strings; the text before the first tag is
    content, as in the hermes format."""
    from constrain.xml_calls import SHAPES, parse_xml_calls

    stream = ToolCallStream(tool_format, XML_FORMS)
    deltas = [d for i in range(0, len(text), step) for d in stream.feed(text[i:i + step])]
    deltas += stream.finish()
    content = "".join(d.get("content", "") for d in deltas)
    calls = _assemble([d for d in deltas if "tool_calls" in d])
    parsed, before = parse_xml_calls(text, XML_FORMS, SHAPES[tool_format])
    assert content == before == "Writing it." and stream.made_calls
    assert [calls[i]["name"] for i in range(3)] == [c["name"] for c in parsed] == ["write_file", "get_time",
                                                                                      "write_file"]
    assert [json.loads(calls[i]["arguments"]) for i in range(3)] == [c["arguments"] for c in parsed] == arguments
