"""`system_fingerprint`: what decides a seeded output, as one short name (the model, the backend that served the
constraint, and the code and library versions that sample and mask). Reads the engine's source once."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
from pathlib import Path

import engine
from constrain.compiler import code_fingerprint


def system_fingerprint(model_name: str, constraint_backend: str | None = None) -> str:
    """OpenAI's promise: the same seed, parameters and fingerprint give mostly the same output. The backend that
    served the constraint is part of it: the backends' masks allow different spellings (tokenizations) of the same
    documents (llguidance only the tokenizer's own for bytes the grammar forces, outlines any), so a seeded request
    samples differently when the `auto` policy moves its schema from one to the other."""
    key = model_name if constraint_backend is None else f"{model_name}\0{constraint_backend}"
    return "fp_structgen_" + hashlib.sha256(f"{key}\0{code_identity()}".encode()).hexdigest()[:10]


@functools.cache
def code_identity() -> str:
    """The rest of what decides a seeded output: the code of the engine (its sampler) and of the constraint
    compiler (its masks), and the versions of the libraries they run on. Another version of any of them may sample
    other tokens from the same seed, so it gets another fingerprint."""
    h = hashlib.sha256(code_fingerprint().encode())  # (the compiler's code and outlines-core's version)
    for package in ("torch", "transformers", "llguidance"):
        h.update(f"{package}={importlib.metadata.version(package)}\0".encode())
    for path in sorted(Path(engine.__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()
