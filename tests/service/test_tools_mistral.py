"""A conversation with tool calls, round trip, on a model whose chat template refuses tool call ids other than 9
letters and digits (as Mistral's do): the ids the server hands out go back in history and render."""

from __future__ import annotations

import json

import pytest

from tests.conftest import MISTRAL_TOOLS_TEMPLATE, build_template_tokenizer, build_tiny_model_dir
from tests.serverproc import ServerProcess

MODEL = "mistral-tools-tiny"
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": TIME}}]


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from openai import OpenAI

    base = tmp_path_factory.mktemp("mistral-tools")
    model = build_tiny_model_dir(base / "model", build_template_tokenizer(base / "tokenizer", MISTRAL_TOOLS_TEMPLATE))
    with ServerProcess("--model", str(model), "--served-model-name", MODEL) as proc:
        yield OpenAI(base_url=proc.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_calls_ids_go_back_in_history(client):
    messages = [{"role": "user", "content": "What time is it in Paris?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="required",
                                           max_tokens=60, seed=1).choices[0].message
    [call] = first.tool_calls
    assert call.id.startswith("call_") and len(call.id) > 9
    messages += [first.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"time": "12:00"})}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="required",
                                            max_tokens=60, seed=2)
    assert second.choices[0].finish_reason == "tool_calls"
    assert json.loads(second.choices[0].message.tool_calls[0].function.arguments)["zone"] is not None
