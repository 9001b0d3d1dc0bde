"""Work around PySide6 6.12 on CPython < 3.12: keep ``None``/``True``/``False`` alive.

PySide6 6.12 changes the reference counts of those singletons without holding the GIL (it
assumes 3.12's immortal objects), so a race with another Python thread can drive one to zero and
abort the interpreter ("Fatal Python error: bool_dealloc"). ``workbench.gui`` applies the fix on
import, before any Qt object exists; tests/gui/test_bridge.py reproduces the crash in a
subprocess.
"""

from __future__ import annotations

import ctypes
import sys

_IMMORTAL_REFCOUNT = 1 << 40


def make_singletons_immortal() -> bool:
    """On CPython < 3.12, give ``None``/``True``/``False`` a huge reference count.

    PySide6 6.12 changes their counts without the GIL (it assumes 3.12's immortal objects), so
    a race with another Python thread can drive one to zero and abort the interpreter. From
    2**40 no drift can reach zero, which is what 3.12 does by design. Idempotent; returns
    whether anything was changed.
    """
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    changed = False
    for obj in (None, True, False, Ellipsis, NotImplemented):
        refcount = ctypes.c_ssize_t.from_address(id(obj))
        if refcount.value < _IMMORTAL_REFCOUNT // 2:
            refcount.value += _IMMORTAL_REFCOUNT
            changed = True
    return changed
