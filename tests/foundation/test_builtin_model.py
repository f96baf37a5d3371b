"""The built-in model: loads with no network, and is the same network on every load."""

from __future__ import annotations

import socket

import pytest
import torch

from engine.model_loader import BUILTIN_MODEL, load_model


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _sample(loaded, prompt: str, seed: int, steps: int = 12) -> list[int]:
    ids = loaded.tokenizer(prompt, return_tensors="pt")["input_ids"].to(loaded.device)
    generator = torch.Generator(device=loaded.device).manual_seed(seed)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(steps):
            logits = loaded.model(ids).logits[0, -1].float()
            token = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
            out.append(int(token))
            ids = torch.cat([ids, token.view(1, 1)], dim=1)
    return out


def test_builtin_model_loads_offline_and_repeats_tokens_for_a_seed(no_network):
    first = load_model(BUILTIN_MODEL, device="cpu")
    second = load_model(BUILTIN_MODEL, device="cpu")
    a = _sample(first, "The answer is", seed=1234)
    assert a == _sample(second, "The answer is", seed=1234)
    assert a != _sample(second, "The answer is", seed=4321)  # the seed matters: not a constant output


def test_builtin_model_has_chat_template_eos_ids_and_padded_logits(no_network):
    loaded = load_model(BUILTIN_MODEL, device="cpu")
    vocab = loaded.tokenizer.get_vocab()
    assert loaded.eos_token_ids == {vocab["<|im_end|>"], vocab["<|endoftext|>"]}
    assert loaded.logits_width == 151936 > len(loaded.tokenizer.get_vocab()) - 1
    prompt = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                                  add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    assert loaded.dtype == torch.float32 and loaded.context_length == 4096
