"""The worker's C heap: what it keeps of freed tensors, and how to make it keep none.

torch's CPU tensors come from ``malloc``. glibc serves a block above its mmap threshold with
its own ``mmap`` and unmaps it when it is freed, but the threshold is dynamic: freeing such a
block raises it to that block's size (up to 32 MiB on 64-bit), and from then on blocks up to
it come from the heap, where freed pages stay resident for reuse. A prefill's activations are
such blocks, so after a long prompt the worker's peak holds 2 to 45 MiB of freed activations
above its live tensors (``benchmarks/bench_memory_loads.py --prompt-repeat 22``: SmolLM2-135M
float32 with half its layers on disk peaked at 360 MiB where its tensors peaked at 320).

The worker keeps glibc's dynamic threshold. Fixed at 128 KiB, every freed block above it goes
back to the system and the measured memory is the live tensors (13 of those 16 rows within 5%,
SmolLM2's -11% became -2.4%), but every such block is mapped and faulted in afresh, each
decode step's KV cache concatenations and each prefill's activations: for a 60M Llama at 287
tokens, decode at 44.5 against 52.5 tok/s and a TTFT of 307 against 227 ms
(``benchmarks/bench_heap_threshold.py``). ``WORKBENCH_MMAP_THRESHOLD`` in the environment (in
bytes, such as ``131072``) fixes it for a user who wants that accounting at that cost; glibc's
own ``MALLOC_MMAP_THRESHOLD_`` is the user's choice and wins. A run's memory record says how
much more freed memory the heap held at its end than at its start (``heap_free_bytes``).
On C libraries without ``mallopt`` / ``mallinfo2`` (musl, macOS, Windows) nothing changes.

Example:
    >>> heap_policy({}), heap_policy({"WORKBENCH_MMAP_THRESHOLD": "131072"})
    (None, 131072)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Mapping

__all__ = ["apply_heap_policy", "heap_free_bytes", "heap_policy", "release_free_heap"]

logger = logging.getLogger(__name__)

_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
_POLICY_VARIABLE = "WORKBENCH_MMAP_THRESHOLD"
_GLIBC_VARIABLE = "MALLOC_MMAP_THRESHOLD_"


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _function(name: str, argtypes: list[type], restype: type) -> object | None:
    """glibc's ``name``, or ``None`` where the C library has no such function."""
    libc = _libc()
    function = getattr(libc, name, None) if libc is not None else None
    if function is None:
        return None
    function.argtypes, function.restype = argtypes, restype
    return function


def heap_policy(environ: Mapping[str, str] | None = None) -> int | None:
    """The mmap threshold the worker fixes, in bytes (``WORKBENCH_MMAP_THRESHOLD``); ``None``
    to leave glibc's dynamic one (unset, ``dynamic``, or the user set
    ``MALLOC_MMAP_THRESHOLD_``).

    Raises:
        ValueError: ``WORKBENCH_MMAP_THRESHOLD`` is neither ``dynamic`` nor a size in bytes.
    """
    environ = os.environ if environ is None else environ
    if _GLIBC_VARIABLE in environ:
        return None
    value = environ.get(_POLICY_VARIABLE, "").strip()
    if not value or value.lower() == "dynamic":
        return None
    try:
        nbytes = int(value)
    except ValueError:
        nbytes = -1
    if nbytes < 0:
        raise ValueError(
            f"{_POLICY_VARIABLE}={value!r}: expected a size in bytes (such as 131072) or "
            "'dynamic' (glibc's default)"
        )
    return nbytes


def apply_heap_policy() -> int | None:
    """Fix this process's mmap threshold as ``heap_policy`` says, and export it as
    ``MALLOC_MMAP_THRESHOLD_`` so the probe processes the worker starts share it. Returns the
    threshold set, or ``None`` when nothing changed (a bad setting is logged, not fatal)."""
    try:
        threshold = heap_policy()
    except ValueError as exc:
        logger.warning("%s; glibc's dynamic threshold kept", exc)
        return None
    mallopt = _function("mallopt", [ctypes.c_int, ctypes.c_int], ctypes.c_int)
    if threshold is None or mallopt is None or not mallopt(_M_MMAP_THRESHOLD, threshold):
        return None
    os.environ[_GLIBC_VARIABLE] = str(threshold)
    return threshold


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_free_bytes() -> int | None:
    """The bytes of freed blocks the C heap keeps for reuse (glibc ``mallinfo2().fordblks``,
    every arena), resident until reused or ``release_free_heap``; ``None`` without glibc 2.33+.

    Example:
        >>> nbytes = heap_free_bytes()
        >>> nbytes is None or nbytes >= 0
        True
    """
    mallinfo2 = _function("mallinfo2", [], _MallInfo2)
    return None if mallinfo2 is None else int(mallinfo2().fordblks)


def release_free_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc ``malloc_trim(0)``).

    A load frees what it converts as it goes (a dtype cast, a weight written to the offload
    folder), and the heap keeps freed blocks below the mmap threshold resident: 0.5 to 3.5 MiB
    on a 2M-parameter demo, between runs of the same load. Returns whether there was a
    ``malloc_trim`` to call; ``False`` elsewhere, a no-op.

    Example:
        >>> release_free_heap() in (True, False)
        True
    """
    trim = _function("malloc_trim", [ctypes.c_size_t], ctypes.c_int)
    if trim is None:
        return False
    trim(0)
    return True
