"""`encode_prompt`: a text far past the context is refused from the first pieces it is counted in, and a long text
within the context gets exactly the ids the tokenizer gives it whole; `completion_prompts` decodes no token-id prompt
past the context."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from service.errors import APIError
from service.prompts import completion_prompts, encode_prompt
from tests.conftest import TOKENIZERS


class _Recording:
    """The built-in tokenizer, noting the length of each text it is given."""

    def __init__(self):
        self.tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZERS["qwen2"]))
        self.lengths: list[int] = []

    def encode(self, text, **kwargs):
        self.lengths.append(len(text))
        return self.tokenizer.encode(text, **kwargs)

    def decode(self, ids, **kwargs):
        self.lengths.append(len(ids))
        return self.tokenizer.decode(ids, **kwargs)


def test_a_text_far_past_the_context_is_refused_without_tokenizing_it_whole():
    tok = _Recording()
    text = "word " * 400_000  # 2 MB: 400k tokens
    with pytest.raises(APIError) as exc:
        encode_prompt(tok, text, 4096, add_special_tokens=True, param="messages")
    assert exc.value.code == "context_length_exceeded" and exc.value.param == "messages"
    assert max(tok.lengths) <= 1 << 16 and sum(tok.lengths) < len(text) // 10
    assert "more than 4096 tokens (the prompt's first 65536 characters do)" in exc.value.message, exc.value.message


def test_a_text_refused_once_counted_whole_names_no_part_of_it():
    """25,000 characters, counted in one piece: the message names no count of characters past the text's own."""
    with pytest.raises(APIError) as exc:
        encode_prompt(_Recording(), "word " * 5000, 4096, add_special_tokens=True, param="messages")
    assert exc.value.message == ("This model's maximum context length is 4096 tokens. However, your messages "
                                 "resulted in more than 4096 tokens. Please reduce the length of the messages.")


@pytest.mark.parametrize("text", [" " * 200_000 + "end", "hello world " * 40_000])
def test_a_long_text_within_the_context_gets_the_ids_of_the_whole(text):
    tok = _Recording()
    whole = tok.tokenizer.encode(text, add_special_tokens=True)
    assert encode_prompt(tok, text, len(whole), add_special_tokens=True) == whole
    assert len(text) > 4 * len(whole)  # (so it was counted in pieces first)


def test_token_id_prompts_past_the_context_are_not_decoded():
    """Their text is never needed (the context refuses them), and decoding 2 million ids held the interpreter for
    2 s (QA loop F5). Those within it get their text."""
    tok = _Recording()
    long, short = [40] * 5000, tok.tokenizer.encode("hello")
    prompts = completion_prompts([long, short], tok, 151_000, 4096)
    assert [p.ids for p in prompts] == [long, short] and prompts[1].text == "hello"
    assert tok.lengths == [len(short)]
