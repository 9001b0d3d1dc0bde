"""Child process for the offload kill tests: commit a second load, SIGKILL itself midway.

Usage: ``python offload_kill_child.py FOLDER WRITER CALL N`` offloads the "new" weights into
FOLDER (which holds the "old" ones) with WRITER (``state_dict`` or ``stager``) and sends itself
a real SIGKILL just before the N-th (0-based) call of ``os.CALL`` (``replace``, ``link`` or
``unlink``), so the kill lands at an exact step of the commit. Exits 0 if N is never reached.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch

from workbench.big_modeling.loading.offload_staging import OffloadStager
from workbench.big_modeling.offload.folder import offload_state_dict

NAMES = [f"layer{i}.weight" for i in range(5)]


def weights(value: float) -> dict[str, torch.Tensor]:
    """Same names, shapes and dtypes for both loads: only the bytes differ (sizes cannot tell)."""
    return {
        name: torch.full((16, 16), value + i, dtype=torch.float16) for i, name in enumerate(NAMES)
    }


def kill_before(call: str, n: int) -> None:
    real = getattr(os, call)
    count = 0

    def counted(*args, **kwargs):
        nonlocal count
        if count == n:
            os.kill(os.getpid(), signal.SIGKILL)
        count += 1
        return real(*args, **kwargs)

    setattr(os, call, counted)


def main() -> None:
    folder, writer, call, n = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    new = weights(100.0)
    if writer == "stager":
        stager = OffloadStager.open(folder)
        for name, tensor in new.items():
            with stager.stage([name], tensor.dtype, tensor.shape) as out:
                out.write(tensor)
        kill_before(call, n)
        stager.commit()
    else:
        kill_before(call, n)
        offload_state_dict(folder, new)


if __name__ == "__main__":
    main()
