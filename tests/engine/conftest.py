"""Engine test fixtures: the built-in model loaded once, a running Engine per test, and a driver that collects
the events of concurrent requests from asyncio (tests/engine/driver.py)."""

from __future__ import annotations

import pytest

from engine import Engine
from engine.model_loader import BUILTIN_MODEL, load_model
from tests.conftest import TEST_DEVICE, TEST_DTYPE


@pytest.fixture(scope="session")
def builtin():
    return load_model(BUILTIN_MODEL, device=TEST_DEVICE, dtype=TEST_DTYPE)


@pytest.fixture
def engine(builtin):
    eng = Engine(builtin, max_batch_size=8)
    eng.start()
    yield eng
    eng.shutdown()
