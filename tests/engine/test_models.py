"""Other models and vocabularies: tiny random models saved with the Qwen2 and Phi-3 tokenizers (different
vocabulary sizes, byte-level BPE vs SentencePiece) decode in mixed batches; incremental text never splits a
UTF-8 character and equals a one-shot decode."""

from __future__ import annotations

import re

import pytest

from constrain import ConstraintSpec, GrammarCompiler, Vocabulary
from engine import Engine
from engine.detokenizer import IncrementalDetokenizer, TokenTexts
from engine.model_loader import load_model
from tests.conftest import TEST_DEVICE, TEST_DTYPE
from tests.engine.driver import request, run_all

TEXT = "Grüße, 世界! 🙂🚀 naïve café — ok"


@pytest.fixture(scope="module", params=["qwen2", "phi3"])
def tiny_model(request, tiny_model_dirs):
    return load_model(str(tiny_model_dirs[request.param]), device=TEST_DEVICE, dtype=TEST_DTYPE)


def test_tiny_models_decode_a_mixed_batch_with_their_own_vocabulary(tiny_model):
    tok = tiny_model.tokenizer
    assert tiny_model.logits_width == len(tok)
    vocab = Vocabulary.from_tokenizer(tok, tiny_model.logits_width, tiny_model.eos_token_ids)
    compiler = GrammarCompiler(vocab, tok, backend="llguidance")
    grammar = compiler.compile(ConstraintSpec(kind="regex", pattern=r"(red|green|blue) [0-9]{2}"))
    prompt = tok(TEXT)["input_ids"]
    eng = Engine(tiny_model, max_batch_size=4)
    eng.start()
    try:
        (greedy,) = run_all(eng, request("g", prompt, temperature=0.0, repetition_penalty=1.3, max_tokens=12))
        batched, seeded, constrained = run_all(
            eng, request("g", prompt, temperature=0.0, repetition_penalty=1.3, max_tokens=12),
            request("s", prompt, temperature=1.0, seed=3, max_tokens=12, logprobs=True, top_logprobs=2),
            request("c", prompt, grammar=grammar, temperature=1.0, seed=4, max_tokens=12))
    finally:
        eng.shutdown()
        compiler.close()
    assert batched[0].tokens == greedy[0].tokens
    for choice in (greedy[0], seeded[0]):
        full = tok.decode(prompt + choice.tokens, skip_special_tokens=True)
        assert choice.text == full[len(tok.decode(prompt, skip_special_tokens=True)):]
    assert all(len(ev.logprobs) == len(ev.token_ids) for ev in seeded[0].events)
    assert re.fullmatch(r"(red|green|blue) [0-9]{2}", constrained[0].text)
    assert constrained[0].last.finish_reason == "stop"


def test_a_text_first_sentencepiece_space_is_kept_where_the_output_must_spell_its_tokens():
    """Phi-3's decode drops the `▁` of a text's first piece (its dummy prefix): where the prompt's window writes no
    text, an output's first `▁x` is "x", as the tokenizer reads it, or, for a constrained output (whose grammar
    wrote the space), " x" (`spelled_start`); a lone `▁` likewise. Mid-text nothing changes."""
    from transformers import AutoTokenizer

    from tests.conftest import TOKENIZERS

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS["phi3"]))
    x, space, bare_x, y = tok.convert_tokens_to_ids(["\u2581x", "\u2581", "x", "\u2581y"])
    for spelled, outputs in ((True, [[x, y], [space, bare_x, y]]), (False, [[x, y], [space, bare_x, y]])):
        for ids in outputs:
            detok = IncrementalDetokenizer(tok, [1], spelled_start=spelled)
            text = "".join(detok.push(i) for i in ids) + detok.flush()
            assert text == (" x y" if spelled else "x y"), (spelled, ids, text)
    detok = IncrementalDetokenizer(tok, tok.encode("Hello", add_special_tokens=True), spelled_start=True)
    assert detok.push(x) == " x"  # (after text: the space as the tokenizer reads it)


@pytest.mark.parametrize("name", ["qwen2", "phi3"])
def test_incremental_detokenization_never_splits_a_utf8_character(name):
    from transformers import AutoTokenizer

    from tests.conftest import TOKENIZERS

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS[name]))
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    deltas = [detok.push(i) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True)
    texts = TokenTexts(tok)
    assert b"".join(texts.get(i)[1] for i in ids).decode("utf-8").strip() == TEXT

    # A 4-byte character spelled by four single-byte tokens: held back until its last byte arrives.
    single = {}
    for i in range(len(tok)):
        data = texts.get(i)[1]
        if len(data) == 1 and i not in single.values():
            single.setdefault(data, i)
    emoji = [single[bytes([b])] for b in "🙂".encode()]
    words = tok(["ok ", " done"], add_special_tokens=False)["input_ids"]
    ids = words[0] + emoji + words[1]
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    deltas = [detok.push(i) for i in ids] + [detok.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "🙂" in deltas
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("name", ["gpt2", "qwen2", "phi3"])
def test_incremental_text_is_the_tokenizers_own_decode_with_special_tokens_among_the_words(name):
    """Special tokens skipped mid-output, byte tokens and words, at random: the deltas join to what the tokenizer
    decodes. On SentencePiece the word after a skipped special token lost its space (71 of 400 sequences)."""
    import random

    from transformers import AutoTokenizer

    from tests.conftest import TOKENIZERS

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS[name]))
    texts = TokenTexts(tok)  # (as the engine shares one: each detokenizer's own reads the tokenizer's JSON, ~0.5 s)
    rng = random.Random(0)
    words = tok.encode(" Hello world, it's a test. 中文 🫠 naïve ñ̃  x\n y", add_special_tokens=False)
    specials = sorted(tok.all_special_ids)
    mismatches = []
    for _ in range(200):
        prompt = tok.encode(rng.choice(["Hi", "Hello there", " x"]), add_special_tokens=False)
        out = [rng.choice(specials) if r < 0.2 else rng.choice(words) if r < 0.7 else rng.randrange(32000)
               for r in (rng.random() for _ in range(rng.randint(1, 12)))]
        detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=True, texts=texts)
        text = "".join(detok.push(i) for i in out) + detok.flush()
        whole, before = tok.decode(prompt + out, skip_special_tokens=True), tok.decode(prompt, skip_special_tokens=True)
        if whole.startswith(before) and text != whole[len(before):] and "\ufffd" not in whole:
            mismatches.append((tok.convert_ids_to_tokens(out), text, whole[len(before):]))
    assert not mismatches, mismatches[:3]


def test_a_run_of_bytes_that_spell_no_character_comes_out_as_it_goes_not_at_the_end():
    """A continuation byte repeated (Phi-3's `<0x80>`) never completes a character: the detokenizer held it all
    to the end, re-decoding the whole held run at every token (4,000 tokens: 2.45 s on the engine thread, and a
    stream said nothing until then). Past a few tokens its U+FFFD goes out."""
    from transformers import AutoTokenizer

    from tests.conftest import TOKENIZERS

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS["phi3"]))
    byte = tok.convert_tokens_to_ids("<0x80>")
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    deltas = [detok.push(byte) for _ in range(200)]
    assert sum(1 for d in deltas if d) > 10 and len(detok.ids) - detok.read <= 10
    assert "".join(deltas) + detok.flush() == tok.decode([byte] * 200)


@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
def test_a_long_run_of_tokens_each_ending_inside_a_character_loses_none(name):
    """Byte-level tokens that each end part way through a character (valid text, spelled unusually): the bound on
    held bytes sent the ninth token's unfinished character out as U+FFFD, and its end never came. Only bytes that
    spell no character go out unfinished."""
    import random

    from transformers import AutoTokenizer

    from constrain.vocabulary import is_byte_level, piece_bytes
    from tests.conftest import TOKENIZERS

    def ends_inside_a_character(data: bytes) -> bool:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return exc.reason == "unexpected end of data"
        return False

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS[name]))
    byte_level = is_byte_level(tok)
    pieces = sorted((i, data) for piece, i in tok.get_vocab().items() if i not in tok.all_special_ids
                    and (data := piece_bytes(piece, byte_level)))
    rng = random.Random(0)
    ids, data = [], b" "
    ids.append(tok.convert_tokens_to_ids(tok.tokenize(" ")[0]))
    continuing = [(i, d) for i, d in pieces if d[0] >= 0x80]
    while len(ids) < 15:
        rng.shuffle(continuing)
        i, d = next((i, d) for i, d in continuing if ends_inside_a_character(data + d))
        ids.append(i)
        data += d
    def whole(data: bytes) -> bool:
        try:
            return data.decode("utf-8").isprintable()
        except UnicodeDecodeError:
            return False

    ids.append(next(i for i, d in pieces if whole(data + d)))
    ids += tok.encode(" end", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    text = "".join(detok.push(i) for i in ids) + detok.flush()
    assert "\ufffd" not in text and text == tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("name", ["gpt2", "qwen2"])
def test_tokens_each_ending_in_a_lead_byte_come_out_as_they_go(name):
    """A token of a space and a lead byte (Qwen2's b' \\xe9') repeated: each lead byte meets the next space and is
    never a character, yet the decode ended in one U+FFFD, not the four the hold's bound looked for; the whole run
    was held to the end (a stream said nothing; 4,000 tokens: 4.8 s of re-decoding on the engine thread)."""
    from transformers import AutoTokenizer

    from constrain.vocabulary import is_byte_level, piece_bytes
    from tests.conftest import TOKENIZERS

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS[name]))
    byte_level = is_byte_level(tok)
    token = min(i for piece, i in tok.get_vocab().items()
                if (data := piece_bytes(piece, byte_level)) and len(data) == 2 and data[0] == 0x20 and data[1] >= 0xe0)
    detok = IncrementalDetokenizer(tok, [], skip_special_tokens=True)
    deltas = [detok.push(token) for _ in range(300)]
    assert all(deltas[1:]) and len(detok.ids) - detok.read == 1
    assert "".join(deltas) + detok.flush() == tok.decode([token] * 300)


@pytest.mark.parametrize("name", ["gpt2", "qwen2", "phi3"])
def test_a_character_after_bytes_that_spell_none_is_kept_whole(name):
    """Seven or eight continuation bytes, then the byte tokens of 你: the bound on held tokens sent the held run
    out with 你's first byte in it, and 你 came out as U+FFFD. Only what is known to spell no character goes out.
    (SentencePiece's byte fallback decodes a run of byte tokens that is not UTF-8 as one U+FFFD per byte, 你's
    too: the stream says what the bytes say, as UTF-8 decodes them.)"""
    from transformers import AutoTokenizer

    from constrain.vocabulary import is_byte_level, piece_bytes
    from tests.conftest import TOKENIZERS

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS[name]))
    byte_level = is_byte_level(tok)
    by_bytes = {}
    for piece, i in sorted(tok.get_vocab().items(), key=lambda item: item[1]):
        by_bytes.setdefault(piece_bytes(piece, byte_level), i)
    character = [by_bytes[bytes([b])] for b in "你".encode()]
    texts = TokenTexts(tok)
    for run in range(12):
        ids = [by_bytes[b"\x80"]] * run + character + tok.encode(" end", add_special_tokens=False)
        detok = IncrementalDetokenizer(tok, [], skip_special_tokens=True, texts=texts)
        text = "".join(detok.push(i) for i in ids) + detok.flush()
        assert "你" in text and text.endswith(" end") and "\ufffd" * run + "你" in text, (run, text)


def _byte_tokens(tok, texts: TokenTexts) -> dict[bytes, int]:
    """The first token of each one-byte spelling (a byte-level BPE's byte, SentencePiece's `<0xXX>`)."""
    out: dict[bytes, int] = {}
    for i in range(len(tok)):
        data = texts.get(i)[1]
        if len(data) == 1:
            out.setdefault(data, i)
    return out


@pytest.mark.parametrize("name", ["gpt2", "qwen2", "phi3"])
def test_a_stray_byte_after_a_written_character_writes_it_no_second_time(name):
    """Phi-3's byte tokens: 😀 spelled in four, then a stray byte (or the first bytes of a character max_tokens
    cut): SentencePiece's byte fallback decodes the run as one, not UTF-8 throughout, so five U+FFFD, and the
    stream wrote 😀 and then five U+FFFD for one byte (QA round 27), and a character after the stray byte came
    out as U+FFFDs (review). Random runs of characters, stray bytes and words: the text is what the tokens'
    bytes spell, decoded as UTF-8 is."""
    import random

    from transformers import AutoTokenizer

    from tests.conftest import TOKENIZERS

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS[name]))
    texts = TokenTexts(tok)
    by_byte = _byte_tokens(tok, texts)
    byte_tokens = {data[0]: i for data, i in by_byte.items()}
    prompt = tok.encode("so far", add_special_tokens=False)

    def text_of(ids: list[int]) -> str:
        detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=True, texts=texts)
        return "".join(detok.push(i) for i in ids) + detok.flush()

    emoji = [byte_tokens[b] for b in "😀".encode()]
    if name == "phi3":
        assert text_of(emoji + [byte_tokens[0x80]]) == "😀\ufffd"
        assert text_of(emoji + [byte_tokens[0xF0], byte_tokens[0x9F]]) == "😀\ufffd"
        assert text_of(emoji + [byte_tokens[0x80]] + emoji) == "😀\ufffd😀"
        assert text_of([byte_tokens[0x80], byte_tokens[0x20], tok.convert_tokens_to_ids("▁x")]) == "\ufffd  x"
    rng = random.Random(3)
    wrong = []
    for _ in range(300):
        ids = []
        for _ in range(rng.randint(1, 6)):
            r = rng.random()
            if r < 0.5:
                ids += [byte_tokens[b] for b in rng.choice("é😀日𓀀").encode()]
            elif r < 0.75:
                ids.append(byte_tokens[rng.choice([0x80, 0x9F, 0xC3, 0xE6, 0xF0])])
            else:
                ids += tok.encode(rng.choice([" x", " word", "中"]), add_special_tokens=False)
        text = text_of(ids)
        if text != b"".join(texts.get(i)[1] for i in ids).decode("utf-8", errors="replace"):
            wrong.append((tok.convert_ids_to_tokens(ids), text))
    assert wrong == [], wrong[:3]


def test_a_skipped_special_token_after_a_byte_that_spells_nothing_keeps_the_next_words_space():
    """Phi-3: `▁Hello <0x80> <|system|> ▁world`, the special token skipped: the decode still ended in U+FFFD, so the
    skipped token was released as settled and the window began on it, where SentencePiece drops the next word's
    space ("Hello�world")."""
    from transformers import AutoTokenizer

    from tests.conftest import TOKENIZERS

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS["phi3"]))
    vocab = tok.get_vocab()
    prompt = [vocab["▁The"]]
    ids = [vocab[p] for p in ("▁Hello", "<0x80>", "<|system|>", "▁world")]
    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=True)
    text = "".join(detok.push(i) for i in ids) + detok.flush()
    whole, before = tok.decode(prompt + ids, skip_special_tokens=True), tok.decode(prompt, skip_special_tokens=True)
    assert text == whole[len(before):] and text.endswith("\ufffd world")


def test_forwards_run_without_cudnn_attention(tiny_model):
    """cuDNN attention builds a graph for every new key length, i.e. at every decode step (60 ms a step on an
    H100): the runner's forwards never use it, and leave the process's setting as they found it."""
    import torch

    from transformers import DynamicCache

    from engine.model_runner import ModelRunner

    runner = ModelRunner(tiny_model)
    seen = []
    hook = tiny_model.model.register_forward_pre_hook(lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    try:
        kv, logits = runner.prefill([[1, 2, 3], [4, 5]])
        runner.decode(kv, logits.argmax(dim=-1))
        runner.prefill_chunk(DynamicCache(), [1, 2, 3, 4], 0, 2, all_logits=True)
    finally:
        hook.remove()
    assert seen == [False] * 3
    assert torch.backends.cuda.cudnn_sdp_enabled()


def _tiny_gpt2_dir(out, positions: int):
    """A random GPT-2-architecture model (positions looked up in a table of `positions` rows) with the GPT-2
    tokenizer, saved as `--model DIR` reads it."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from tests.conftest import TOKENIZERS

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS["gpt2"]))
    config = GPT2Config(vocab_size=len(tok), n_positions=positions, n_embd=32, n_layer=1, n_head=2)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        GPT2LMHeadModel(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _tiny_dir(out, model_type: str, **config):
    """A random model of `model_type` (2 small layers; `config` on top) with the GPT-2 tokenizer, saved as
    `--model DIR` reads it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from tests.conftest import TOKENIZERS

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS["gpt2"]))
    small = dict(hidden_size=64, d_model=64, num_hidden_layers=2, n_layers=2, num_attention_heads=4, n_heads=4,
                 num_key_value_heads=2, intermediate_size=128, head_dim=16, n_routed_experts=4,
                 num_experts_per_tok=2, moe_intermediate_size=32)
    keys = set(AutoConfig.for_model(model_type).to_dict())
    settings = {k: v for k, v in small.items() if k in keys}
    settings.update(vocab_size=len(tok), bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.eos_token_id, **config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **settings)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_the_context_is_read_where_the_config_keeps_it(tmp_path):
    """MPT names its positions `max_seq_len`, and a multimodal checkpoint loaded as a causal LM keeps them in its
    `text_config`: both fell back to 4,096 (MPT's ALiBi bias then failed past its positions with a 500; a Gemma 3
    refused prompts past 4,096 of its 131,072; QA round 27)."""
    from transformers import Gemma3Config

    from engine.model_loader import _config_context_length

    path = _tiny_dir(tmp_path / "mpt", "mpt", max_seq_len=64)
    assert load_model(str(path), device=TEST_DEVICE, dtype=TEST_DTYPE).context_length == 64
    assert _config_context_length(Gemma3Config(text_config={"max_position_embeddings": 300})) == 300


def test_every_causal_lm_config_transformers_knows_is_read_without_an_error():
    """MusicGen's config holds two text configs, and `get_text_config()` raised: start-up ended in a traceback
    rather than a one-line reason (review)."""
    import warnings

    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from engine.model_loader import _config_context_length, _recurrent_layers

    read = 0
    for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                config = AutoConfig.for_model(model_type)
            except Exception:  # (a config that needs arguments or a package not installed)
                continue
            _config_context_length(config), _recurrent_layers(config)
        read += 1
    assert read > 100 and "musicgen" in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


@pytest.mark.parametrize("model_type, config, said", [
    ("mamba", {}, "keep a recurrent state"),
    ("lfm2", {"layer_types": ["conv", "full_attention"]}, "keep a recurrent state"),
    ("rwkv", {"attention_hidden_size": 64, "context_length": 64}, "differ from one pass over its tokens"),
])
def test_models_that_keep_a_recurrent_state_are_refused_at_start_up(tmp_path, model_type, config, said):
    """A recurrent state cannot be left-padded or merged into a running batch: such a model loaded, answered
    /health, and failed every request with a 500 IndexError (QA round 27). RWKV's cache layers look like
    attention's, but it ignores the cache it is given: served, each step saw its own token alone (review)."""
    from engine.model_loader import ModelLoadError

    path = _tiny_dir(tmp_path / model_type, model_type, **config)
    with pytest.raises(ModelLoadError, match=said):
        load_model(str(path), device=TEST_DEVICE, dtype=TEST_DTYPE)


def test_the_start_up_check_reads_a_vocabulary_smaller_than_its_prompts(tmp_path):
    """Its prompts are a few token ids, taken modulo the model's vocabulary: a model of 5 tokens was refused for an
    IndexError of the check's own making (review)."""
    import dataclasses

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from engine.model_runner import batching_failure

    loaded = load_model(str(_tiny_dir(tmp_path / "llama", "llama")), device=TEST_DEVICE, dtype=TEST_DTYPE)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        small = LlamaForCausalLM(LlamaConfig(vocab_size=5, hidden_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, intermediate_size=64))
    small = small.to(device=loaded.device, dtype=loaded.dtype).eval()
    assert batching_failure(dataclasses.replace(loaded, model=small, logits_width=5)) is None


_LATENT_ATTENTION = dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, head_dim=8)


def test_a_model_is_served_only_if_two_requests_in_one_batch_run(tmp_path):
    """transformers 5.24's multi-head latent attention (DeepSeek-V3) with fewer key/value heads than query heads
    fails on a padded batch of two rows: the model answered one request at a time and failed every two that
    overlapped with a 500 (QA round 27). A model is refused at start-up unless such a batch runs (should
    transformers mend it, it loads and its batches run)."""
    from engine.model_loader import ModelLoadError
    from engine.model_runner import ModelRunner

    path = _tiny_dir(tmp_path / "mla", "deepseek_v3", num_key_value_heads=2, q_lora_rank=16, first_k_dense_replace=1,
                     n_group=1, topk_group=1, **_LATENT_ATTENTION)
    try:
        loaded = load_model(str(path), device=TEST_DEVICE, dtype=TEST_DTYPE)
    except ModelLoadError as exc:
        assert "two requests in one batch, as the engine runs them, go wrong" in str(exc)
        return
    runner = ModelRunner(loaded)
    kv, logits = runner.prefill([[1, 2, 3], [4, 5]])
    runner.decode(kv, logits.argmax(dim=-1))


@pytest.mark.parametrize("model_type, config", [
    ("deepseek_v2", dict(q_lora_rank=None, first_k_dense_replace=1)),
    ("deepseek_v3", dict(q_lora_rank=16, first_k_dense_replace=1, n_group=1, topk_group=1)),
    ("minicpm3", dict(q_lora_rank=16)),
])
def test_latent_attention_with_as_many_key_value_heads_as_query_heads_is_served(tmp_path, model_type, config):
    """The released DeepSeek-V2/V3 and MiniCPM3 checkpoints have as many key/value heads as query heads: their
    batches run as one pass over each row does (`batching_failure`), so they load."""
    loaded = load_model(str(_tiny_dir(tmp_path / model_type, model_type, num_key_value_heads=4, **config,
                                      **_LATENT_ATTENTION)), device=TEST_DEVICE, dtype=TEST_DTYPE)
    assert loaded.model.config.model_type == model_type


def test_a_context_past_the_positions_a_model_learned_is_refused_at_start_up(tmp_path):
    """`--max-model-len` past a GPT-2's `n_positions` was a warning; a request past them was then a 500
    IndexError for every row of its step (on CUDA, a device-side assert). A model that computes its positions
    (rotary, as Llama's) may still run past its training length, with the warning."""
    from engine.model_loader import ModelLoadError

    path = _tiny_gpt2_dir(tmp_path / "gpt2arch", positions=64)
    assert load_model(str(path), device=TEST_DEVICE, dtype=TEST_DTYPE, max_model_len=64).context_length == 64
    with pytest.raises(ModelLoadError, match="64 positions"):
        load_model(str(path), device=TEST_DEVICE, dtype=TEST_DTYPE, max_model_len=65)


def test_a_model_directory_under_the_home_directory_is_found_as_written(tmp_path, monkeypatch, tiny_model_dirs):
    """`--model ~/models/x` (or STRUCTGEN_MODEL, which no shell expands) was "model directory not found"."""
    import shutil

    home = tmp_path / "home"
    shutil.copytree(tiny_model_dirs["qwen2"], home / "models" / "tiny")
    monkeypatch.setenv("HOME", str(home))
    loaded = load_model("~/models/tiny", device=TEST_DEVICE, dtype=TEST_DTYPE)
    assert loaded.name == "~/models/tiny" and loaded.logits_width > 0


def test_a_model_path_that_is_a_file_is_named_as_a_file(tmp_path):
    """`--model some/config.json` (the file, not its folder) said "model directory not found" of a path that is
    there (QA cli F5)."""
    from engine.model_loader import ModelLoadError

    config = tmp_path / "config.json"
    config.write_text("{}")
    with pytest.raises(ModelLoadError, match=r"not a model directory \(a file\): .*config\.json; name the folder"):
        load_model(str(config), device=TEST_DEVICE, dtype=TEST_DTYPE)


def test_a_device_torch_names_but_cannot_use_is_a_one_line_reason():
    from engine.model_loader import ModelLoadError

    for device in ("meta", "mps"):  # (a traceback from torch or the engine, where the other bad values say why)
        with pytest.raises(ModelLoadError, match=f"device '{device}' is not supported here"):
            load_model("structgen-builtin", device=device)


def test_an_eos_id_past_the_logits_is_left_out_not_a_traceback(tmp_path, tiny_model_dirs):
    """A generation_config.json that lists an EOS id past the model's logits ended start-up in llguidance's
    ValueError; such an id is never sampled, so it is left out (with a warning)."""
    import json
    import shutil

    path = tmp_path / "eos"
    shutil.copytree(tiny_model_dirs["qwen2"], path)
    config = json.loads((path / "generation_config.json").read_text())
    config["eos_token_id"] = [config["eos_token_id"], 10 ** 6]
    (path / "generation_config.json").write_text(json.dumps(config))
    loaded = load_model(str(path), device=TEST_DEVICE, dtype=TEST_DTYPE)
    assert 10 ** 6 not in loaded.eos_token_ids and max(loaded.eos_token_ids) < loaded.logits_width


@pytest.mark.parametrize("name", ["gpt2", "qwen2", "phi3"])
def test_output_that_finishes_a_character_the_prompt_began_writes_it(name):
    """A token-id prompt cut inside a character (the first bytes of 𓀀), and output tokens with the rest: the
    character's placeholder in the prompt's decode gave way to the character, the same length, so the tokens were
    taken to write nothing and the text was lost (`text` "" with 2 completion tokens; QA round 22)."""
    from transformers import AutoTokenizer

    from tests.conftest import TOKENIZERS

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS[name]))
    texts = TokenTexts(tok)
    byte_tokens = _byte_tokens(tok, texts)
    data = "𓀀".encode()
    spelled = [byte_tokens[data[k:k + 1]] for k in range(len(data))]
    words = tok.encode("so far", add_special_tokens=False)
    after = tok.encode(" and on", add_special_tokens=False)
    for cut in (1, 2, 3):
        detok = IncrementalDetokenizer(tok, words + spelled[:cut], skip_special_tokens=True)
        text = "".join(detok.push(i) for i in spelled[cut:] + after) + detok.flush()
        assert text.startswith("𓀀") and text.endswith(tok.decode(after).strip()), (cut, text)


@pytest.mark.parametrize("name", ["gpt2", "qwen2", "phi3"])
def test_output_after_a_prompt_cut_anywhere_is_the_rest_of_the_decoded_text(name):
    """Prompts of token ids cut at random points of mixed text (inside characters too; on Phi-3 with the
    characters spelled as byte tokens, whose unfinished run Phi-3 decodes as U+FFFD throughout): the output's text
    is what the whole decodes to past the prompt's finished characters, no character lost or written twice, and
    no delta ends in half a character (review of QA round 22: a token that finished the prompt's character and
    began the next wrote U+FFFD, then the character again; Phi-3 lost characters after such a run)."""
    import codecs
    import random

    from transformers import AutoTokenizer

    from tests.conftest import TOKENIZERS

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS[name]))
    texts = TokenTexts(tok)
    rng = random.Random(7)
    wrong = []
    for _ in range(150):
        tail = "".join(rng.choice("aé ö日本語𓀀😀中文 x\nß€") for _ in range(rng.randint(2, 12)))
        ids = tok.encode("so far " + tail, add_special_tokens=False)
        if name == "phi3" and rng.random() < 0.7:
            ids = tok.encode("so far ", add_special_tokens=False) + [tok.convert_tokens_to_ids(f"<0x{b:02X}>")
                                                                     for b in tail.encode()]
        cut = rng.randint(1, len(ids) - 1)
        detok = IncrementalDetokenizer(tok, ids[:cut], skip_special_tokens=True, texts=texts)
        deltas = [detok.push(i) for i in ids[cut:]] + [detok.flush()]
        whole = tok.decode(ids)
        prompt_bytes = b"".join(texts.get(i)[1] for i in ids[:cut])
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        decoder.decode(prompt_bytes)
        finished = prompt_bytes[:len(prompt_bytes) - len(decoder.getstate()[0])].decode().replace("\u2581", " ")
        if name == "phi3" and not whole.startswith(" "):
            finished = finished.lstrip(" ")
        if finished + "".join(deltas) != whole or any(d.endswith("\ufffd") for d in deltas):
            wrong.append((ids[:cut], ids[cut:], deltas, whole))
    assert wrong == [], wrong[:3]
    if name == "gpt2":  # a token that finishes the prompt's `ö` (`\xb6`) and begins `日` (`\xe6`)
        detok = IncrementalDetokenizer(tok, tok.encode("ok") + [127], skip_special_tokens=True, texts=texts)
        assert [detok.push(i) for i in (35050, 245, 98, 886)] + [detok.flush()] == ["", "", "ö日", " end", ""]


@pytest.mark.parametrize("model_type, rope", [
    ("phi3", {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [4.0] * 8,
              "original_max_position_embeddings": 64, "rope_theta": 10000.0}),
    ("llama", {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}),
    # (Gemma 3 keeps its frequencies per layer type: they were left to change, QA review7 F3)
    ("gemma3_text", {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}),
])
def test_a_requests_logits_do_not_depend_on_a_longer_request_in_its_batch(tmp_path, model_type, rope):
    """transformers chose Phi-3's long or short RoPE factors (and dynamic NTK's scaling) from the longest position
    in each forward: a short request's answer changed when a request past 64 positions shared its batch (QA
    archs F1, F2). The frequencies are fixed at load for the context served."""
    import torch

    from engine.model_runner import ModelRunner

    extra = {"max_position_embeddings": 512, "original_max_position_embeddings": 64} if model_type == "phi3" \
        else {"max_position_embeddings": 64}
    settings = {"rope_parameters": rope} if model_type != "gemma3_text" else {
        "rope_scaling": rope, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16}
    path = _tiny_dir(tmp_path / model_type, model_type, **settings, **extra)
    loaded = load_model(str(path), device=TEST_DEVICE, dtype=TEST_DTYPE, max_model_len=128)
    runner = ModelRunner(loaded)
    short, long = list(range(1000, 1004)), list(range(2000, 2090))
    _, alone = runner.prefill([short])
    _, beside = runner.prefill([short, long])
    tolerance = 1e-5 if TEST_DTYPE == "float32" else 5e-2  # (what padding changes; the factors moved 4e-4)
    assert torch.allclose(alone[0].float(), beside[0].float(), atol=tolerance), (alone[0] - beside[0]).abs().max()
