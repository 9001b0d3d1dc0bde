"""Reloading into an offload folder that already holds a load: a failed commit loses nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import checkpoint_fixtures as fx
import pytest
import torch
from checkpoint_fixtures import TinyNet, empty_model

from workbench.big_modeling import OffloadedWeightsLoader, load_checkpoint_in_model

single_ckpt = fx.single_ckpt
reference_model = fx.reference_model

RELOAD_SCRIPT = textwrap.dedent(
    """
    import resource, signal, sys
    sys.path.insert(0, {tests!r})
    import torch
    from checkpoint_fixtures import empty_model
    from workbench.big_modeling.errors import OffloadError
    from workbench.big_modeling.loading.api import load_checkpoint_in_model
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    # every bf16 .dat fits (the largest, embed.weight, is 16*8*2 = 256 B); index.json does not
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
    try:
        load_checkpoint_in_model(empty_model(), {ckpt!r}, device_map={{"": "disk"}},
                                 offload_folder={folder!r}, dtype=torch.bfloat16)
    except OffloadError as exc:
        print("OffloadError:", exc)
        sys.exit(3)
    """
)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _disk_load(ckpt: Path, folder: Path, dtype: torch.dtype) -> None:
    load_checkpoint_in_model(
        empty_model(), ckpt, device_map={"": "disk"}, offload_folder=folder, dtype=dtype
    )


@pytest.mark.slow  # a fresh interpreter (torch import) with a file-size limit
def test_failed_index_write_keeps_the_previous_load(
    single_ckpt: Path, reference_model: TinyNet, tmp_path: Path
) -> None:
    folder = tmp_path / "off"
    _disk_load(single_ckpt, folder, torch.float16)
    before = _snapshot(folder)
    assert len(before) > 20 and len(json.loads(before["index.json"])) == len(before) - 1
    script = RELOAD_SCRIPT.format(
        tests=str(Path(__file__).parent), ckpt=str(single_ckpt), folder=str(folder)
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stdout + done.stderr
    # it failed at the index, after every new .dat had been renamed over an old one
    assert "index.json: File too large" in done.stdout, done.stdout
    assert _snapshot(folder) == before  # same names, same bytes, no leftovers
    index = json.loads((folder / "index.json").read_text())
    assert all((folder / f"{name}.dat").is_file() for name in index)
    weights = OffloadedWeightsLoader(save_folder=folder)
    expected = reference_model.state_dict()
    for name in index:
        value = expected[name]
        value = value.to(torch.float16) if value.is_floating_point() else value
        assert torch.equal(weights[name], value), name


def test_successful_reload_replaces_files_and_drops_set_aside_copies(
    single_ckpt: Path, reference_model: TinyNet, tmp_path: Path
) -> None:
    folder = tmp_path / "off"
    _disk_load(single_ckpt, folder, torch.float16)
    names_before = sorted(p.name for p in folder.iterdir())
    _disk_load(single_ckpt, folder, torch.bfloat16)
    assert sorted(p.name for p in folder.iterdir()) == names_before  # no .old / .tmp left
    weights = OffloadedWeightsLoader(save_folder=folder)
    assert weights["blocks.0.up.weight"].dtype == torch.bfloat16
    assert torch.equal(
        weights["blocks.0.up.weight"], reference_model.blocks[0].up.weight.to(torch.bfloat16)
    )
