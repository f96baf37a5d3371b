"""Through the real server on a SentencePiece tokenizer (Phi-3's: spaces written as '▁', a BOS added to string
prompts, byte fallback): text a constraint forces, and completions' offsets over an echoed prompt."""

from __future__ import annotations

import pytest

from tests.service.conftest import serving

MODEL = "tiny-phi3"


@pytest.fixture(scope="module")
def phi3(tiny_model_dirs):
    with serving(tiny_model_dirs["phi3"], MODEL) as client:
        yield client


@pytest.mark.parametrize("constraint, answers", [
    ({"choice": ["\u2581"]}, {"\u2581"}),
    ({"regex": "[ab]\u2581x"}, {"a\u2581x", "b\u2581x"}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "k", "strict": True, "schema": {
        "type": "object", "properties": {"\u2581k": {"const": "\u2581v"}}, "required": ["\u2581k"],
        "additionalProperties": False}}}}, {'{"\u2581k":"\u2581v"}'}),
])
def test_a_forced_space_marker_is_answered_as_the_character(phi3, constraint, answers):
    """A '\u2581' the constraint forces was a 500 ("token 29871 was sampled but the grammar rejected it"): the
    tokenizer's piece for it spells a space."""
    for seed in range(3):
        r = phi3.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "go"}],
                                                    "max_tokens": 20, "seed": seed, **constraint})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["message"]["content"].replace(" ", "") in answers


def test_echoed_offsets_follow_the_prompt_text(phi3):
    """A string prompt's tokens are <s>, '▁hello', '▁world' while its text is "hello world": the offsets counted
    the BOS's 3 characters and the first piece's space ([0, 3, 9], the generated tokens past the text's end)."""
    body = {"model": MODEL, "prompt": "hello world", "max_tokens": 2, "echo": True, "logprobs": 0,
            "regex": "!!", "temperature": 0}
    choice = phi3.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["text"] == "hello world!!"
    offsets = choice["logprobs"]["text_offset"]
    assert offsets[:4] == [0, 0, 5, 11] and all(offset < len(choice["text"]) for offset in offsets)


@pytest.mark.parametrize("prompt", [" x", "  leading spaces", "   x  y", "hello world", "a  b ",
                                    " Hello world<|end|>", "<|user|> hi", " <|endoftext|> a", " x\u2581", "<s>x"])
def test_echoed_offsets_are_where_the_tokenizer_puts_each_token(phi3, tiny_model_dirs, prompt):
    """The tokenizer's own `offset_mapping` is the measure. Followed through the text token by token, a prompt
    starting with spaces (SentencePiece's dummy prefix: `" x"` is `▁`, `▁x`) or with a special token's text in it
    (the space it adds after one) had offsets a character late (QA tokenizers F1, review4)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dirs["phi3"]))
    starts = [start for start, _ in tokenizer(prompt, return_offsets_mapping=True)["offset_mapping"]]
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 0}
    choice = phi3.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["text"] == prompt and choice["logprobs"]["text_offset"] == starts


@pytest.mark.parametrize("prompt", ["", "<|endoftext|>", [1]])
def test_after_a_prompt_with_no_text_the_tokens_listed_spell_the_output(phi3, prompt):
    """The tokenizer's decode drops the `▁` of the output's first piece where nothing came before it (`alcuni`),
    while its offsets and bytes counted the space: every later offset was one character past its token (QA
    vocabularies F2). The first token is now listed as the text spells it."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "seed": 1, "logprobs": 0}
    choice = phi3.post("/v1/completions", json=body).json()["choices"][0]
    text, tokens, offsets = choice["text"], choice["logprobs"]["tokens"], choice["logprobs"]["text_offset"]
    assert "".join(tokens) == text
    start = offsets[0]
    assert [text[o - start:o - start + len(t)] for o, t in zip(offsets, tokens)] == tokens
    if isinstance(prompt, str) and prompt:  # (chat's raw `prompt` extension: a non-empty string)
        chat = phi3.post("/v1/chat/completions", json={**body, "logprobs": True}).json()["choices"][0]
        listed = chat["logprobs"]["content"]
        assert b"".join(bytes(t["bytes"]) for t in listed) == chat["message"]["content"].encode()


@pytest.mark.parametrize("prompt", ["", "<|endoftext|>", [1]])
def test_a_constrained_output_after_a_prompt_with_no_text_keeps_the_space_its_grammar_wrote(phi3, prompt):
    """The grammar reads a `▁` as the space it allows; the tokenizer's decode drops it where nothing came before
    (its dummy prefix): `regex: " x"` came out "x" and `choice: [" x", " y"]` "y", neither of which the
    constraint takes (QA review F4)."""
    for constraint, answers in (({"regex": " x"}, {" x"}), ({"choice": [" x", " y"]}, {" x", " y"})):
        for seed in range(3):
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "seed": seed, "logprobs": 0, **constraint}
            choice = phi3.post("/v1/completions", json=body).json()["choices"][0]
            assert choice["text"] in answers and "".join(choice["logprobs"]["tokens"]) == choice["text"], choice


@pytest.mark.parametrize("stream", [False, True])
def test_calls_opened_with_a_token_that_begins_with_a_space_are_calls(phi3, stream):
    """A model with no tool template gets calls as a JSON array; a SentencePiece model opens it as it opens a
    word, "▁[" (id 518 here, forced by logit_bias). Under tool_choice "auto" that token was masked, so such a model
    wrote text instead: now the answer is the call, whole or streamed, with no content."""
    import json

    tools = [{"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": False}}}]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "add"}], "tools": tools, "tool_choice": "auto",
            "max_tokens": 40, "seed": 1, "logit_bias": {"518": 100}, "stream": stream}
    r = phi3.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    if not stream:
        choice = r.json()["choices"][0]
        message, finish = choice["message"], choice["finish_reason"]
        calls, content = message["tool_calls"], message["content"]
    else:
        chunks = [json.loads(line[6:]) for line in r.text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
        content = "".join(d.get("content") or "" for d in deltas) or None
        pieces = [call for d in deltas for call in d.get("tool_calls") or [] if call["index"] == 0]
        calls = [{"function": {"name": pieces[0]["function"]["name"],
                               "arguments": "".join(c["function"].get("arguments") or "" for c in pieces)}}]
    assert finish == "tool_calls" and content is None, (finish, content)
    assert calls[0]["function"]["name"] == "add"
    assert isinstance(json.loads(calls[0]["function"]["arguments"])["x"], int)
