"""Vocabulary: bytes per token on the three real tokenizer families, specials and padding excluded."""

from __future__ import annotations

import json
import re

import pytest

from constrain import Vocabulary

TEXT = "naïve café – 日本語 🎉👩‍💻 tab\tnewline\n"


@pytest.mark.parametrize("name", ["gpt2", "phi3", "qwen2"])
def test_token_bytes_concatenate_to_the_utf8_text(name, tokenizers, vocabs):
    tok, vocab = tokenizers[name], vocabs[name]
    ids = tok.encode(TEXT, add_special_tokens=False)
    data = b"".join(vocab.token_bytes[i] for i in ids)
    # SentencePiece prepends a space to the first word ("▁naïve"); the rest is byte-exact.
    assert data.lstrip(b" ") == TEXT.encode("utf-8")


@pytest.mark.parametrize("name", ["gpt2", "qwen2", "phi3"])
def test_emoji_split_across_tokens_is_rebuilt_from_partial_utf8_bytes(name, tokenizers, vocabs):
    tok, vocab = tokenizers[name], vocabs[name]
    ids = tok.encode("🦜", add_special_tokens=False)
    parts = [vocab.token_bytes[i] for i in ids]
    assert b"".join(parts).strip(b" ") == "🦜".encode("utf-8")
    if len(parts) > 1:  # a token holding an incomplete UTF-8 sequence is kept as raw bytes
        assert any(_not_utf8(p) for p in parts)


def _not_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_sentencepiece_space_marker_and_byte_fallback(tokenizers, vocabs):
    tok, vocab = tokenizers["phi3"], vocabs["phi3"]
    v = tok.get_vocab()
    assert vocab.token_bytes[v["<0x0A>"]] == b"\n"
    assert vocab.token_bytes[v["<0xE2>"]] == b"\xe2"
    assert vocab.token_bytes[v["▁the"]] == b" the"


def test_byte_level_space_and_newline(tokenizers, vocabs):
    v = tokenizers["gpt2"].get_vocab()
    assert vocabs["gpt2"].token_bytes[v["Ġthe"]] == b" the"
    assert vocabs["gpt2"].token_bytes[v["Ċ"]] == b"\n"


@pytest.mark.parametrize("name", ["gpt2", "phi3", "qwen2"])
def test_special_eos_and_padded_ids_are_never_allowed(name, tokenizers, vocabs):
    tok, vocab = tokenizers[name], vocabs[name]
    for tid, added in tok.added_tokens_decoder.items():
        if added.special:
            assert vocab.token_bytes[tid] is None, added.content
    assert all(vocab.token_bytes[e] is None for e in vocab.eos_token_ids)
    assert all(b is None for b in vocab.token_bytes[len(tok):])
    assert len(vocab.token_bytes) == vocab.logits_width
    allowed = vocab.allowed_words()
    assert allowed.shape == ((vocab.logits_width + 31) // 32,)


def test_qwen2_pad_artefacts_and_chat_tokens_excluded(tokenizers, vocabs):
    tok, vocab = tokenizers["qwen2"], vocabs["qwen2"]
    v = tok.get_vocab()
    assert vocab.token_bytes[v["[PAD151646]"]] is None
    assert vocab.token_bytes[v["<|im_end|>"]] is None
    assert vocab.token_bytes[v["<|im_start|>"]] is None
    assert sum(b is not None for b in vocab.token_bytes) == 151643


def test_phi3_pad_artefacts_of_the_vocabulary_itself_are_no_text(tokenizers, vocabs):
    """Phi-3's `[PAD32011]`..`[PAD32063]` are pieces of its vocabulary, not added tokens: they were written
    inside constrained JSON strings and sampled freely (QA loading D3), where the README says never."""
    from constrain.vocabulary import unsampled_ids

    tok, vocab = tokenizers["phi3"], vocabs["phi3"]
    pads = [i for piece, i in tok.get_vocab().items() if piece.startswith("[PAD")]
    assert len(pads) == 53 and all(vocab.token_bytes[i] is None for i in pads)
    assert set(pads) <= set(unsampled_ids(tok, vocab.logits_width))


def test_fingerprint_depends_on_eos_and_width(tokenizers, vocabs):
    tok = tokenizers["gpt2"]
    same = Vocabulary.from_tokenizer(tok, 50304, [50256])
    assert same.fingerprint == vocabs["gpt2"].fingerprint
    assert Vocabulary.from_tokenizer(tok, 50257, [50256]).fingerprint != same.fingerprint


def test_special_tokens_named_writable_write_their_content(tmp_path):
    """Where a fine-tune made `<tool_call>` a special token, calls are still written with it: named in
    `writable_special`, it writes its text (grammars may then write it); other special tokens stay never
    allowed."""
    from transformers import AutoTokenizer

    from tests.conftest import QWEN_TOOL_TAGS, build_special_tags_tokenizer

    tok = AutoTokenizer.from_pretrained(str(build_special_tags_tokenizer(tmp_path)))
    assert all(tok.added_tokens_decoder[tid].special for tid in QWEN_TOOL_TAGS)
    plain = Vocabulary.from_tokenizer(tok, 151936, [151643, 151645])
    tags = Vocabulary.from_tokenizer(tok, 151936, [151643, 151645], writable_special=QWEN_TOOL_TAGS.values())
    assert all(plain.token_bytes[tid] is None for tid in QWEN_TOOL_TAGS)
    assert [tags.token_bytes[tid] for tid in QWEN_TOOL_TAGS] == [b"<tool_call>", b"</tool_call>"]
    assert tags.token_bytes[tok.convert_tokens_to_ids("<|im_start|>")] is None
    assert tags.fingerprint != plain.fingerprint


@pytest.mark.parametrize("name, text", [("phi3", "<s>old</s> new"), ("qwen2", "x<|im_start|>y")])
def test_text_that_spells_a_special_token_is_written_with_ordinary_tokens(name, text, tokenizers, vocabs):
    """llguidance forces the bytes a grammar leaves no choice over as the tokens its tokenizer makes of them: `<s>`
    (Phi-3's BOS) became the special token, which the mask removes, and the answer failed with no token allowed
    (a 400, or an error event mid-stream), where outlines wrote the text. The grammar then runs without forcing.
    The budget rule spells such text with ordinary tokens too: it wrote Phi-3's `</s>` (an added token, not special
    to transformers, special to llguidance) as its token, which the mask refused (a 500 at max_tokens 6-12)."""
    from constrain import GrammarCompiler, spec_from_request
    from tests.constrain.conftest import offered_walk

    compiler = GrammarCompiler(vocabs[name], tokenizers[name], backend="llguidance", background_outlines=False)
    try:
        schema = {"type": "object", "properties": {"html": {"const": text}}, "required": ["html"],
                  "additionalProperties": False}
        for spec in (spec_from_request(choice=[text]), spec_from_request(regex=re.escape(text)),
                     spec_from_request(response_format={"type": "json_object", "schema": schema})):
            for budget in (*range(2, 20), 40):
                out = offered_walk(compiler.compile(spec), vocabs[name], [], [], budget, must_end=budget == 40)
                written = tokenizers[name].decode(out, skip_special_tokens=True)
                assert budget < 40 or written == text or json.loads(written) == {"html": text}, written
    finally:
        compiler.close()
