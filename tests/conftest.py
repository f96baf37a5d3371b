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


def build_tiny_model_dir(out: Path, tokenizer: str, *, layers: int = 2, hidden: int = 64,
                         logits_width: int | None = None, seed: int = 0) -> Path:
    """Save a random 2-layer Llama-architecture model with a real tokenizer into `out` (save_pretrained), so a
    test can load it through the real `--model DIR` path."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(TOKENIZERS[tokenizer]))
    chat_template = TOKENIZERS[tokenizer] / "chat_template.jinja"
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
