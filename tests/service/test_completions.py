"""Legacy completions: every prompt shape, echo, the legacy logprobs shape, refused fields."""

from __future__ import annotations

import json
from unittest.mock import ANY

import pytest

from tests.service.conftest import MODEL
from tests.service.test_chat import _stop_across_tokens


def test_string_prompt(client):
    r = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=5, temperature=0)
    assert r.object == "text_completion"
    assert r.id.startswith("cmpl-")
    assert len(r.choices) == 1 and r.choices[0].index == 0
    assert r.usage.prompt_tokens == 3


def test_default_max_tokens_is_16(http):
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "a", "temperature": 0, "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize("prompt, prompts", [
    (["The sky is", "Grass is"], 2),
    ([785, 12884, 374], 1),
    ([[785, 12884, 374], [38, 76, 374], [16]], 3),
])
def test_prompt_shapes_give_one_choice_per_prompt_times_n_in_order(client, prompt, prompts):
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, n=2, temperature=0)
    assert [c.index for c in r.choices] == list(range(2 * prompts))
    # greedy: the two choices of one prompt are identical, and each prompt is answered on its own
    for p in range(prompts):
        assert r.choices[2 * p].text == r.choices[2 * p + 1].text


def test_each_prompt_in_a_list_is_answered_as_if_alone(client):
    both = client.completions.create(model=MODEL, prompt=["The sky is", "Grass is"], max_tokens=4, temperature=0)
    alone = client.completions.create(model=MODEL, prompt="Grass is", max_tokens=4, temperature=0)
    assert both.choices[1].text == alone.choices[0].text
    assert both.usage.prompt_tokens == 3 + alone.usage.prompt_tokens


def test_an_empty_prompt_starts_a_document_as_openai_reads_it(http):
    """OpenAI reads an empty prompt as `<|endoftext|>`, the start of a document: the built-in model (Qwen2, no BOS)
    starts from its EOS. It was a 400, alone, in a list, or echoed."""
    body = {"model": MODEL, "prompt": "", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["usage"]["prompt_tokens"], out["usage"]["completion_tokens"]) == (1, 3)
    text = out["choices"][0]["text"]
    assert http.post("/v1/completions", json={**body, "prompt": [151643]}).json()["choices"][0]["text"] == text
    listed = http.post("/v1/completions", json={**body, "prompt": ["a", ""]}).json()["choices"]
    assert [c["index"] for c in listed] == [0, 1] and listed[1]["text"] == text
    assert http.post("/v1/completions", json={**body, "echo": True}).json()["choices"][0]["text"] == text


@pytest.mark.parametrize("prompt, param, says", [
    ([[785], [785, 10**9]], "prompt[1]", "out of range"), ([785, 10**9], "prompt", "out of range"),
    # past the context: as ids, and as a text long enough to be counted in pieces
    ([[785], [785] * 5000], "prompt[1]", "maximum context length"),
    (["a", "word " * 25_000], "prompt[1]", "maximum context length"),
    ("word " * 25_000, "prompt", "maximum context length"),
])
def test_an_error_about_one_prompt_of_a_list_names_it(http, prompt, param, says):
    """`param` names a list item in brackets, as OpenAI's errors do (it named `prompt`, whichever was at fault)."""
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1,
                                           "context_length_exceeded_behavior": "error"})
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert says in r.json()["error"]["message"]


def test_echo_returns_prompt_then_completion(client):
    plain = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4, temperature=0)
    echoed = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4, temperature=0, echo=True)
    assert echoed.choices[0].text == "The sky is" + plain.choices[0].text


def test_legacy_logprobs_shape(client):
    r = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset[0] == len("The sky is")  # (from the start of the prompt, as OpenAI counts them)
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0
        assert token in top and 1 <= len(top) <= 4  # the chosen token plus up to `logprobs` alternatives


def test_logprobs_end_with_the_text_a_stop_string_leaves(http):
    """Tokens after a stop string's cut were listed, with a text_offset past the end of the text."""
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 16, "temperature": 1, "seed": 11, "ignore_eos": True,
            "logprobs": 0}
    tokens = http.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]["tokens"]
    k, stop = _stop_across_tokens(tokens, 1)
    choice = http.post("/v1/completions", json={**body, "stop": stop}).json()["choices"][0]
    assert choice["logprobs"]["tokens"] == tokens[: k + 1]
    assert all(offset - len("hello") < len(choice["text"]) for offset in choice["logprobs"]["text_offset"])


def test_logprobs_leave_out_a_token_after_a_cut_at_a_character_that_never_ended(http):
    """A token that ends inside a character is held until a later one shows the character never ends: both their
    texts then come out at once (`选\ufffd[B`), and the later token counted as beginning where the held one did,
    so a stop string at the U+FFFD left it listed, past the end of the text (QA stops F1)."""
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 12, "temperature": 1, "ignore_eos": True, "logprobs": 1}
    cut = 0
    for seed in range(12):
        whole = http.post("/v1/completions", json={**body, "seed": seed}).json()["choices"][0]["text"]
        if "\ufffd" not in whole.rstrip("\ufffd"):
            continue
        choice = http.post("/v1/completions", json={**body, "seed": seed, "stop": ["\ufffd"]}).json()["choices"][0]
        assert whole.startswith(choice["text"]) and len(choice["text"]) < len(whole)
        assert all(offset - len("Hello") < len(choice["text"]) for offset in choice["logprobs"]["text_offset"])
        cut += 1
    assert cut  # (seeds whose answer holds an unfinished character before more text)


@pytest.mark.parametrize("logprobs", [0, 2])
def test_echo_with_logprobs_includes_the_prompt_tokens(client, logprobs):
    r = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=2, temperature=0,
                                  logprobs=logprobs, echo=True)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 3 + r.usage.completion_tokens
    assert lp.token_logprobs[0] is None
    assert all(x is not None for x in lp.token_logprobs[1:])
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(1 <= len(top) <= logprobs + 1 for top in lp.top_logprobs[1:])


def test_echo_with_max_tokens_0_scores_the_prompt_and_generates_nothing(http):
    """lm-evaluation-harness's loglikelihood requests (seed 002 allows `max_tokens: 0` with echo): batched prompts
    of text and of token ids, the logprob of each prompt token given those before it. They were a 400."""
    body = {"model": MODEL, "prompt": ["The sky is", "Grass is green"], "max_tokens": 0, "echo": True,
            "logprobs": 1, "temperature": 0, "seed": 1234}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["usage"]["completion_tokens"] == 0
    scored = http.post("/v1/completions", json={**body, "max_tokens": 2}).json()["choices"]
    for choice, prompt, longer in zip(out["choices"], body["prompt"], scored):
        assert choice["text"] == prompt and choice["finish_reason"] == "length"
        lp = choice["logprobs"]
        assert "".join(lp["tokens"]) == prompt and lp["token_logprobs"][0] is None
        n = len(lp["tokens"])
        assert lp["token_logprobs"][1:] == pytest.approx(longer["logprobs"]["token_logprobs"][1:n], abs=1e-4)
    ids = http.post("/v1/completions", json={**body, "prompt": [[785, 12884, 374]]}).json()["choices"][0]
    assert len(ids["logprobs"]["tokens"]) == 3 and ids["logprobs"]["token_logprobs"][0] is None
    refused = http.post("/v1/completions", json={**body, "echo": False})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"
    # `max_completion_tokens` (max_tokens' synonym in seed 003) likewise: it was refused as "less than 1"
    synonym = {k: v for k, v in body.items() if k != "max_tokens"} | {"max_completion_tokens": 0}
    assert http.post("/v1/completions", json=synonym).json() == {**out, "id": ANY, "created": ANY}
    refused = http.post("/v1/completions", json={**synonym, "echo": False})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_completion_tokens"


def test_vllms_stop_token_ids_and_min_tokens_are_honoured_and_its_token_constraints_refused(http):
    """They were accepted and only named as ignored: `min_tokens` gave a 1-token answer, and `allowed_token_ids`
    and `bad_words` (constraints) left the output free."""
    eos = "151643"
    body = {"model": MODEL, "prompt": "x", "max_tokens": 8, "logit_bias": {eos: 100}}
    r = http.post("/v1/completions", json={**body, "min_tokens": 3})
    assert r.status_code == 200 and "x-structgen-ignored-fields" not in r.headers
    assert r.json()["usage"]["completion_tokens"] == 4 and r.json()["choices"][0]["finish_reason"] == "stop"
    r = http.post("/v1/completions", json={**body, "logit_bias": {"64": 100}, "stop_token_ids": [64]})
    assert r.json()["usage"]["completion_tokens"] == 1 and r.json()["choices"][0]["finish_reason"] == "stop"
    r = http.post("/v1/completions", json={**body, "stop_token_ids": [151936]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop_token_ids"
    r = http.post("/v1/completions", json={**body, "min_tokens": 9})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens"
    # past the default max_tokens (16) it was taken, and the answer ended at 16 tokens (vLLM refuses it)
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "min_tokens": 17})
    assert r.status_code == 400 and r.json()["error"]["param"] == "min_tokens" and "default" in r.text
    r = http.post("/v1/completions", json={**body, "suffix": ""})  # (asks for nothing, as `suffix: null`)
    assert r.status_code == 200 and "x-structgen-ignored-fields" not in r.headers, r.text
    assert http.post("/v1/completions", json={**body, "suffix": "x"}).json()["error"]["code"] == "unsupported_parameter"
    for field in ("allowed_token_ids", "bad_words"):
        r = http.post("/v1/completions", json={**body, field: [64] if field == "allowed_token_ids" else ["a"]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_parameter"
        assert r.json()["error"]["param"] == field
        assert http.post("/v1/completions", json={**body, field: []}).status_code == 200


def test_return_tokens_as_token_ids(http):
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 3, "logprobs": 0,
                                          "return_tokens_as_token_ids": True})
    tokens = r.json()["choices"][0]["logprobs"]["tokens"]
    assert tokens and all(t.startswith("token_id:") and t[9:].isdigit() for t in tokens)


@pytest.mark.parametrize("prompt", ["hello world", [[14990, 1879]]])
def test_token_ids_with_echo_name_every_token_and_offsets_count_text_streamed_or_not(http, prompt):
    """The first echoed prompt token was its text ("hello"), and streamed offsets summed the lengths of the
    `token_id:N` strings (18 for the first generated token of "hello world", 11 unstreamed)."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 3, "echo": True, "logprobs": 0, "temperature": 0,
            "return_tokens_as_token_ids": True}
    whole = http.post("/v1/completions", json=body).json()["choices"][0]
    lp = whole["logprobs"]
    assert lp["tokens"][0] == "token_id:14990" and all(t.startswith("token_id:") for t in lp["tokens"])
    assert lp["text_offset"][:3] == [0, 5, 11]  # "hello", " world", then the first generated token
    plain = http.post("/v1/completions", json={**body, "return_tokens_as_token_ids": False}).json()["choices"][0]
    assert plain["logprobs"]["text_offset"] == lp["text_offset"]
    r = http.post("/v1/completions", json={**body, "stream": True})
    chunks = [json.loads(e[len(b"data: "):]) for e in r.content.split(b"\n\n") if e and e != b"data: [DONE]"]
    streamed = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    assert [t for s in streamed for t in s["tokens"]] == lp["tokens"]
    assert [o for s in streamed for o in s["text_offset"]] == lp["text_offset"]


def _logprobs_whole_and_streamed(http, body: dict) -> tuple[dict, dict, str]:
    """The legacy logprobs of `body` answered whole, the same of its stream joined, and the whole answer's text."""
    whole = http.post("/v1/completions", json=body).json()["choices"][0]
    r = http.post("/v1/completions", json={**body, "stream": True})
    chunks = [json.loads(e[len(b"data: "):]) for e in r.content.split(b"\n\n") if e and e != b"data: [DONE]"]
    parts = [c["choices"][0]["logprobs"] for c in chunks if c["choices"] and c["choices"][0]["logprobs"]]
    streamed = {key: [x for part in parts for x in part[key]] for key in ("tokens", "text_offset", "top_logprobs")}
    return whole["logprobs"], streamed, whole["text"]


def test_echoed_offsets_index_a_prompt_the_tokenizer_normalised(http):
    """Qwen2's tokenizer reads its text in NFC: `cafe\u0301` (decomposed, as macOS writes file names) is tokenised
    as `café`. The echo is the prompt as sent, and the offsets counted the tokens' characters, so each later
    offset fell one behind the echoed text (QA prompts 1)."""
    import unicodedata

    for prompt in ("cafe\u0301 au lait", unicodedata.normalize("NFD", "한국어 텍스트") + " end"):
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "echo": True, "logprobs": 0, "temperature": 0}
        whole, streamed, text = _logprobs_whole_and_streamed(http, body)
        assert text.startswith(prompt) and whole["text_offset"] == streamed["text_offset"]
        offsets, tokens = whole["text_offset"], whole["tokens"]
        spelled = b""
        for token, at in zip(tokens, offsets):
            # (the echoed text before each token's offset is, normalised, what the tokens before it spell: their
            # whole characters; a token named by its bytes is one that splits a character)
            written = spelled.decode("utf-8", "ignore")
            assert unicodedata.normalize("NFC", text[:at]) == written, (token, text[:at], written, offsets)
            spelled += (bytes.fromhex(token[len("bytes:"):].replace("\\x", "")) if token.startswith("bytes:")
                        else token.encode())
        assert offsets[-1] == len(prompt)  # (the generated token's, where the prompt ends)


def test_offsets_count_characters_where_tokens_split_them_and_such_tokens_are_named_by_bytes(http):
    """Tokens 127 and 102 are the two bytes of "\u00e9" (the built-in model's byte-level vocabulary). Each was
    counted as one character (its U+FFFD), so later offsets went past their tokens and the last past the end of
    the text; and both shown as U+FFFD, two such alternatives were one `top_logprobs` key."""
    echoed = {"model": MODEL, "prompt": [9707, 127, 102, 9707], "max_tokens": 0, "echo": True, "logprobs": 0}
    whole, streamed, text = _logprobs_whole_and_streamed(http, echoed)
    assert text == "Hello\u00e9Hello"
    assert whole["tokens"] == streamed["tokens"] == ["Hello", "bytes:\\xc3", "bytes:\\xa9", "Hello"]
    assert whole["text_offset"] == streamed["text_offset"] == [0, 5, 5, 6]
    # Token 172 is a lone 0xF0, which no byte completes: each is a U+FFFD of its own, before the next token's text.
    invalid = {**echoed, "prompt": [172, 64, 172, 172, 64]}
    whole, streamed, text = _logprobs_whole_and_streamed(http, invalid)
    assert text == "\ufffda\ufffd\ufffda" and whole["text_offset"] == streamed["text_offset"] == [0, 1, 2, 3, 4]
    forced = {"model": MODEL, "prompt": "x", "max_tokens": 3, "logprobs": 0, "logit_bias": {"172": 100}}
    whole, streamed, text = _logprobs_whole_and_streamed(http, forced)
    assert text == "\ufffd" * 3 and whole["text_offset"] == streamed["text_offset"] == [1, 2, 3]
    # Generated: "\u00e9" and "\u00e8" as whole tokens banned, each is written in its two bytes (C3, then A9 or A8).
    generated = {"model": MODEL, "prompt": "Hello", "max_tokens": 8, "logprobs": 5, "regex": "[\u00e9\u00e8]{2}",
                 "logit_bias": {"963": -100, "4458": -100}, "temperature": 1, "seed": 2}
    whole, streamed, text = _logprobs_whole_and_streamed(http, generated)
    assert len(text) == 2 and whole["tokens"][0] == whole["tokens"][2] == "bytes:\\xc3"
    assert whole["text_offset"] == streamed["text_offset"] == [5, 5, 6, 6]  # (after the prompt, "Hello")
    for top in (whole["top_logprobs"][1], whole["top_logprobs"][3]):
        assert set(top) == {"bytes:\\xa9", "bytes:\\xa8"}  # (the mask allows these two bytes only)
    assert streamed["top_logprobs"] == whole["top_logprobs"]


def test_offsets_of_an_answer_to_token_ids_that_end_inside_a_character(http):
    """Tokens 172 and 253 are the first two bytes (F0 9F) of a four-byte character: the prompt's text ends in a
    U+FFFD. An answer whose tokens complete the character starts with it; its tokens were counted from a decoder
    that did not have the prompt's bytes, one character each, the last offset past the end of the text (QA textapi
    F1). Where the answer shows the character never comes, the U+FFFD is the prompt's text's."""
    completed = {"model": MODEL, "prompt": [172, 253], "max_tokens": 3, "logprobs": 0, "temperature": 0,
                 "logit_bias": {"246": 50, "222": 60}}  # (0x98, then 0x80 0x80: "\U0001f600" and a lone 0x80)
    whole, streamed, text = _logprobs_whole_and_streamed(http, completed)
    assert text == "\U0001f000\ufffd" and whole["tokens"] == ["bytes:\\x80"] * 3
    assert whole["text_offset"] == streamed["text_offset"] == [1, 1, 2]  # (after the prompt's U+FFFD)
    whole, streamed, text = _logprobs_whole_and_streamed(http, {**completed, "echo": True})
    assert text == "\ufffd\U0001f000\ufffd" and whole["text_offset"] == streamed["text_offset"] == [0, 0, 1, 1, 2]
    never = {**completed, "logit_bias": {"64": 100}}  # "a": the prompt's bytes are no character's
    whole, streamed, text = _logprobs_whole_and_streamed(http, never)
    assert text == "aaa" and whole["text_offset"] == streamed["text_offset"] == [1, 2, 3]


def test_offsets_count_special_tokens_the_text_keeps(http):
    """With `skip_special_tokens: false` a special token's text is in the answer: it takes its room (every
    generated special token was given none, so `<|im_start|>` three times read [1, 1, 1])."""
    body = {"model": MODEL, "prompt": "x", "max_tokens": 3, "logprobs": 0, "logit_bias": {"151644": 100}}
    whole, streamed, text = _logprobs_whole_and_streamed(http, {**body, "skip_special_tokens": False})
    assert text == "<|im_start|>" * 3
    assert whole["text_offset"] == streamed["text_offset"] == [1, 13, 25]
    whole, streamed, text = _logprobs_whole_and_streamed(http, body)
    assert text == "" and whole["text_offset"] == streamed["text_offset"] == [1, 1, 1]


def test_streamed_completion_matches_the_whole_one(client):
    whole = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=8, temperature=0)
    chunks = list(client.completions.create(model=MODEL, prompt="The sky is", max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


@pytest.mark.parametrize("field, value, message", [
    ("suffix", "the end", "suffix"),
    ("images", ["data:image/png;base64,AAAA"], "this model does not accept images"),
])
def test_fields_we_cannot_honour_are_refused(http, field, value, message):
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", field: value})
    assert r.status_code == 400
    assert message in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == field


def test_token_ids_out_of_the_vocabulary_are_refused(http):
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": [1, 10_000_000]})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "prompt"


def test_a_request_holds_at_most_2048_prompts(http):
    """200,000 prompts took minutes and 1.2 GB, and held up every other request (QA hostile F7); a prompt of many
    token ids is one prompt."""
    for prompt in (["a"] * 2049, [[1]] * 2049):
        r = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
        assert "more than 2048 prompts" in r.json()["error"]["message"]
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": [1] * 3000, "max_tokens": 1})
    assert r.status_code == 200 and len(r.json()["choices"]) == 1, r.text


def _token_bytes(token: str) -> bytes:
    """A completions logprobs token as bytes: part of a character is listed as `bytes:\\xNN`."""
    if token.startswith("bytes:"):
        return bytes.fromhex(token[len("bytes:"):].replace("\\x", ""))
    return token.encode()


@pytest.mark.parametrize("seed", [0, 27])
def test_the_token_that_ends_the_output_is_not_among_the_logprobs(http, seed):
    """EOS (and a `stop_token_ids` token) is not in the text, and OpenAI lists no end token: `<|endoftext|>` was
    listed, and chat's `logprobs.content` joined to `...<|im_end|>`, not to the content. (Seed 27 ends both outputs
    in part of a character: the listed bytes then read as the text does, with U+FFFD.)"""
    eos = "151643"
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 8, "logprobs": 1, "seed": seed,
                                           "min_tokens": 2, "logit_bias": {eos: 100}}).json()
    lp = r["choices"][0]["logprobs"]
    assert r["choices"][0]["finish_reason"] == "stop" and r["usage"]["completion_tokens"] == 3
    listed = b"".join(_token_bytes(token) for token in lp["tokens"])
    assert listed.decode(errors="replace") == r["choices"][0]["text"]
    assert len(lp["tokens"]) == 2 == len(lp["text_offset"])
    chat = http.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                                   "max_tokens": 8, "logprobs": True, "min_tokens": 2,
                                                   "seed": seed, "logit_bias": {"151645": 100}}).json()
    content = chat["choices"][0]["logprobs"]["content"]
    listed = bytes(b for entry in content for b in entry["bytes"])
    assert listed.decode(errors="replace") == chat["choices"][0]["message"]["content"]
    assert len(content) == 2 and chat["choices"][0]["finish_reason"] == "stop"


def test_ids_that_are_no_token_are_never_listed_among_the_alternatives(http):
    """The built-in tokenizer's `[PADnnnn]` artefacts were banned after the logprobs were taken: one was listed
    as the second most likely alternative, and they counted in the distribution the logprobs are read from."""
    import random

    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "The sky is", "max_tokens": 40, "logprobs": 5,
                                           "temperature": 1.0, "seed": 3, "ignore_eos": True}).json()
    listed = [token for top in r["choices"][0]["logprobs"]["top_logprobs"] for token in top]
    assert len(listed) >= 40 * 5 and not [t for t in listed if t.startswith("[PAD")]
    rng = random.Random(0)
    words = ("the of and to in is you that it he was for on are as with his they at be this have from or one had by "
             "word but not what all were we when your can said there use an each which she do how their if").split()
    prompt = " ".join(rng.choice(words) for _ in range(1500))  # (the prompt's alternatives too: 3 were [PAD...])
    echoed = http.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 0, "echo": True,
                                                "logprobs": 5}).json()
    listed = [token for top in echoed["choices"][0]["logprobs"]["top_logprobs"][1:] for token in top]
    assert len(listed) >= 1400 * 5 and not [t for t in listed if t.startswith("[PAD")]
