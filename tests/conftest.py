"""Shared fixtures: paths to the tokenizers shipped in the project, and tiny models built from them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Where the engine tests load their models: float32 on the CPU in CI. `STRUCTGEN_TEST_DEVICE=cuda` runs the same tests
# on a GPU, and `STRUCTGEN_TEST_DTYPE=bfloat16` in the dtype a GPU host serves with (the servers the service tests
# start take `--device auto`: the GPU where there is one).
TEST_DEVICE = os.environ.get("STRUCTGEN_TEST_DEVICE", "cpu")
TEST_DTYPE = os.environ.get("STRUCTGEN_TEST_DTYPE", "float32")

ROOT = Path(__file__).resolve().parent.parent
TOKENIZERS = {
    "gpt2": ROOT / "tests" / "tokenizers" / "gpt2",
    "phi3": ROOT / "tests" / "tokenizers" / "phi3",
    "qwen2": ROOT / "engine" / "builtin_model",
}


# Qwen2.5's chat template for tool use (Apache-2.0), which tells the model to write calls between <tool_call> tags.
QWEN_TOOLS_TEMPLATE = ROOT / "tests" / "tokenizers" / "qwen2_tools" / "chat_template.jinja"
QWEN_TOOL_TAGS = {151657: "<tool_call>", 151658: "</tool_call>"}


def build_qwen_tools_tokenizer(out: Path) -> Path:
    """The Qwen2 tokenizer as Qwen2.5 ships it for tool use, saved into `out`: `<tool_call>` and `</tool_call>`
    as the added (not special) tokens 151657 and 151658, where the vocabulary-only copy has placeholders, and the
    template of QWEN_TOOLS_TEMPLATE."""
    return _build_qwen_tagged_tokenizer(out, QWEN_TOOL_TAGS, QWEN_TOOLS_TEMPLATE)


def build_special_tags_tokenizer(out: Path) -> Path:
    """As `build_qwen_tools_tokenizer`, but `<tool_call>` and `</tool_call>` are special tokens, as where a
    fine-tune renamed a base model's reserved special tokens to them."""
    return _build_tagged_tokenizer(out, "qwen2", QWEN_TOOL_TAGS, QWEN_TOOLS_TEMPLATE, special=True)


# A chat template written for these tests in the shape of Qwen3's: the model may open a <think> block before
# its answer (or a tool call); `enable_thinking: false` writes an empty block; `think_opened: true` opens the block
# in the prompt, as DeepSeek-R1's and QwQ's templates do.
QWEN3_THINKING_TEMPLATE = ROOT / "tests" / "tokenizers" / "qwen3_thinking" / "chat_template.jinja"
QWEN3_THINK_TAGS = {151667: "<think>", 151668: "</think>"}


def build_qwen3_thinking_tokenizer(out: Path) -> Path:
    """The Qwen2 tokenizer with Qwen3's added (not special) tokens: the tool call tags and `<think>` and
    `</think>` at 151667 and 151668, and the template of QWEN3_THINKING_TEMPLATE."""
    return _build_qwen_tagged_tokenizer(out, {**QWEN_TOOL_TAGS, **QWEN3_THINK_TAGS}, QWEN3_THINKING_TEMPLATE)


def _build_qwen_tagged_tokenizer(out: Path, tags: dict[int, str], template: Path) -> Path:
    """The Qwen2 tokenizer with the placeholders of `tags`' ids (id -> tag) renamed to the tags, saved into `out`
    with `template` for its chat template."""
    return _build_tagged_tokenizer(out, "qwen2", tags, template)


def _build_tagged_tokenizer(out: Path, source: str, tags: dict[int, str], template: Path,
                            special: bool | None = None) -> Path:
    """The tokenizer TOKENIZERS[source] with the added tokens of `tags`' ids (id -> tag) renamed to the tags (each
    keeps whether it is special, unless `special` says; an id that is no added token, a vocabulary placeholder,
    becomes a special one), saved into `out` with `template` for its chat template."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    src = TOKENIZERS[source]
    data = json.loads((src / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    added_ids = {added["id"] for added in data["added_tokens"]}
    data["added_tokens"] += [{"id": tid, "content": next(k for k, v in vocab.items() if v == tid), "special": True,
                              "single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
                             for tid in sorted(set(tags) - added_ids)]
    for added in data["added_tokens"]:
        if added["id"] in tags:
            del vocab[added["content"]]
            added["content"] = tags[added["id"]]
            vocab[added["content"]] = added["id"]
            if special is not None:
                added["special"] = special
    (out / "tokenizer.json").write_text(json.dumps(data))
    (out / "tokenizer_config.json").write_text((src / "tokenizer_config.json").read_text())
    (out / "chat_template.jinja").write_text(template.read_text())
    return out


# A chat template written for these tests in the shape of Qwen3-Coder's (and Qwen3.5's): each call as
# <tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>.
QWEN3_CODER_TEMPLATE = ROOT / "tests" / "tokenizers" / "qwen3_coder" / "chat_template.jinja"


def build_qwen3_coder_tokenizer(out: Path) -> Path:
    """The Qwen2 tokenizer with the tool call tags as added (not special) tokens, as Qwen3-Coder ships it, and the
    template of QWEN3_CODER_TEMPLATE."""
    return _build_qwen_tagged_tokenizer(out, QWEN_TOOL_TAGS, QWEN3_CODER_TEMPLATE)


# A chat template written for these tests in the shape of GLM-4.5's: each call as <tool_call>NAME, then
# <arg_key>KEY</arg_key> and <arg_value>VALUE</arg_value> per argument on lines of their own, then </tool_call>; the
# tags special tokens (where the Qwen2 tokenizer has added tokens), as in GLM's vocabulary.
GLM45_TEMPLATE = ROOT / "tests" / "tokenizers" / "glm45" / "chat_template.jinja"
GLM_TAGS = {**QWEN_TOOL_TAGS, 151660: "<arg_key>", 151661: "</arg_key>", 151662: "<arg_value>",
            151663: "</arg_value>"}


def build_glm45_tokenizer(out: Path) -> Path:
    """The Qwen2 tokenizer with GLM_TAGS as special tokens, and the template of GLM45_TEMPLATE."""
    return _build_tagged_tokenizer(out, "qwen2", GLM_TAGS, GLM45_TEMPLATE, special=True)


# Chat templates written for these tests in other models' tool-calling formats: Llama 3.1-3.3's (one {"name",
# "parameters"} call) and Mistral's (calls after [TOOL_CALLS], ids of 9 letters and digits).
LLAMA3_TOOLS_TEMPLATE = ROOT / "tests" / "tokenizers" / "llama3_tools" / "chat_template.jinja"
MISTRAL_TOOLS_TEMPLATE = ROOT / "tests" / "tokenizers" / "mistral_tools" / "chat_template.jinja"


# Mistral's control tokens (special: left out of decoded text) where the Phi-3 tokenizer, SentencePiece as
# Mistral's, has special placeholders; `[/TOOL_RESULTS]` stays text.
MISTRAL_TAGS = {32002: "[INST]", 32003: "[/INST]", 32004: "[TOOL_CALLS]", 32005: "[AVAILABLE_TOOLS]",
                32008: "[/AVAILABLE_TOOLS]", 32009: "[TOOL_RESULTS]"}


def build_mistral_tools_tokenizer(out: Path) -> Path:
    """A tokenizer shaped as Mistral 7B v0.3's for tool use: `[TOOL_CALLS]` and the other tags as special tokens
    (MISTRAL_TAGS), and the template of MISTRAL_TOOLS_TEMPLATE."""
    return _build_tagged_tokenizer(out, "phi3", MISTRAL_TAGS, MISTRAL_TOOLS_TEMPLATE)


# Mistral's later templates (Mistral Small 3.2, Magistral, Devstral, Ministral 3): each call as
# [TOOL_CALLS]name[ARGS]arguments, on the same Mistral-shaped tokenizer with [ARGS] and [SYSTEM_PROMPT] tokens too.
MISTRAL_ARGS_TEMPLATE = ROOT / "tests" / "tokenizers" / "mistral_args" / "chat_template.jinja"
MISTRAL_ARGS_TAGS = {**MISTRAL_TAGS, 32001: "[SYSTEM_PROMPT]", 32006: "[/SYSTEM_PROMPT]", 32010: "[ARGS]"}


def build_mistral_args_tokenizer(out: Path) -> Path:
    """A tokenizer shaped as Mistral Small 3.2's for tool use: MISTRAL_ARGS_TAGS as special tokens, and the template
    of MISTRAL_ARGS_TEMPLATE."""
    return _build_tagged_tokenizer(out, "phi3", MISTRAL_ARGS_TAGS, MISTRAL_ARGS_TEMPLATE)


# Magistral's shape: the later Mistral calls, and a [THINK] block the model may open before its answer.
MAGISTRAL_TEMPLATE = ROOT / "tests" / "tokenizers" / "magistral" / "chat_template.jinja"
MAGISTRAL_TAGS = {**MISTRAL_ARGS_TAGS, 32011: "[THINK]", 32012: "[/THINK]"}


def build_magistral_tokenizer(out: Path) -> Path:
    """A tokenizer shaped as Magistral's: MAGISTRAL_TAGS as special tokens, and the template of MAGISTRAL_TEMPLATE."""
    return _build_tagged_tokenizer(out, "phi3", MAGISTRAL_TAGS, MAGISTRAL_TEMPLATE)


# A chat template written for these tests in the shape of IBM Granite 3's: calls as `<|tool_call|>` and then a JSON
# list, that token a special one (at a Qwen2 placeholder), as in Granite's vocabulary.
GRANITE_TEMPLATE = ROOT / "tests" / "tokenizers" / "granite" / "chat_template.jinja"
GRANITE_TAGS = {151659: "<|tool_call|>"}


def build_granite_tokenizer(out: Path) -> Path:
    """The Qwen2 tokenizer with GRANITE_TAGS as special tokens, and the template of GRANITE_TEMPLATE."""
    return _build_tagged_tokenizer(out, "qwen2", GRANITE_TAGS, GRANITE_TEMPLATE, special=True)


# A chat template written for these tests in the shape of gpt-oss's harmony format (constrain/harmony.py), and its
# tags as special tokens at Qwen2 placeholders; `<|return|>` and `<|call|>` end the output, as gpt-oss's EOS ids.
HARMONY_TEMPLATE = ROOT / "tests" / "tokenizers" / "harmony" / "chat_template.jinja"
HARMONY_TAGS = {151657: "<|start|>", 151658: "<|end|>", 151659: "<|message|>", 151660: "<|channel|>",
                151661: "<|constrain|>", 151662: "<|return|>", 151663: "<|call|>"}


def build_harmony_model_dir(out: Path) -> Path:
    """A tiny random model with the Qwen2 tokenizer, HARMONY_TAGS as special tokens and the template of
    HARMONY_TEMPLATE; its generation config ends the output at `<|return|>` and `<|call|>` too."""
    import json

    model = build_tiny_model_dir(out / "model", _build_tagged_tokenizer(out / "tokenizer", "qwen2", HARMONY_TAGS,
                                                                        HARMONY_TEMPLATE, special=True))
    config = json.loads((model / "generation_config.json").read_text())
    ends = {tag: tid for tid, tag in HARMONY_TAGS.items()}
    config["eos_token_id"] = [ends["<|return|>"], ends["<|call|>"], config["eos_token_id"]]
    (model / "generation_config.json").write_text(json.dumps(config))
    return model


# Llama 3's `<|python_tag|>`, a special token its models sometimes write before a call, at a Qwen2 placeholder.
LLAMA3_PYTHON_TAG = {151659: "<|python_tag|>"}


def build_llama3_tagged_tokenizer(out: Path) -> Path:
    """The Qwen2 tokenizer with `<|python_tag|>` as a special token (LLAMA3_PYTHON_TAG), and the template of
    LLAMA3_TOOLS_TEMPLATE."""
    return _build_tagged_tokenizer(out, "qwen2", LLAMA3_PYTHON_TAG, LLAMA3_TOOLS_TEMPLATE, special=True)


# Real models' chat templates, as llama.cpp keeps copies of them (models/templates/, MIT): DeepSeek-R1-Distill-Qwen's
# (the last system message only; calls written only where the content is None), DeepSeek-V3.1's (every system
# message at the top), Gemma 2's (no system role, user and assistant alternating), Hermes 3's and Command R+'s
# `tool_use` (named templates; iterate `tools`, read each one's descriptions), gpt-oss's (less the built-in browser
# and python tools' prose; a tool result must answer a call), Mistral-Nemo's (the system message only where a user
# message ends the conversation), Seed-OSS's (walks each tool's properties), and llama.cpp's Phi-4-mini (calls
# closed by `<|/tool_call|>`); and vLLM's examples/ (Apache-2.0) hermes (a tool result must be named) and phi4_mini
# (an answer's text or its calls, not both).
REAL_TEMPLATES = {name: ROOT / "tests" / "tokenizers" / name / "chat_template.jinja"
                  for name in ("deepseek_r1_distill", "deepseek_v3_1", "gemma2", "hermes3_tool_use",
                               "command_r_plus_tool_use", "gpt_oss", "mistral_nemo", "seed_oss",
                               "phi4_mini_llamacpp", "vllm_hermes", "vllm_phi4_mini")}


def build_template_tokenizer(out: Path, template: Path) -> Path:
    """The Qwen2 tokenizer with `template` for its chat template, saved into `out` (these formats are in the
    template's text, not in the vocabulary)."""
    out.mkdir(parents=True, exist_ok=True)
    src = TOKENIZERS["qwen2"]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (out / name).write_text((src / name).read_text())
    (out / "chat_template.jinja").write_text(template.read_text())
    return out


def build_tiny_model_dir(out: Path, tokenizer: str | Path, *, layers: int = 2, hidden: int = 64,
                         logits_width: int | None = None, seed: int = 0) -> Path:
    """Save a random 2-layer Llama-architecture model with a real tokenizer (a name in TOKENIZERS, or a tokenizer
    directory) into `out` (save_pretrained), so a test can load it through the real `--model DIR` path."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    src = TOKENIZERS[tokenizer] if isinstance(tokenizer, str) else tokenizer
    tok = AutoTokenizer.from_pretrained(str(src))
    chat_template = src / "chat_template.jinja"
    if chat_template.exists() and not tok.chat_template:
        tok.chat_template = chat_template.read_text()
    width = logits_width or len(tok)
    eos = tok.eos_token_id if tok.eos_token_id is not None else 0
    config = LlamaConfig(vocab_size=width, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, tie_word_embeddings=True,
                         bos_token_id=tok.bos_token_id, eos_token_id=eos, pad_token_id=eos)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory) -> dict[str, Path]:
    """One saved tiny model per test tokenizer: {"gpt2": dir, "phi3": dir, "qwen2": dir}."""
    base = tmp_path_factory.mktemp("models")
    return {name: build_tiny_model_dir(base / name, name) for name in TOKENIZERS}
