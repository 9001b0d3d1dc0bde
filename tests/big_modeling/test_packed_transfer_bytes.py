"""Transfer events of quantized disk weights count the packed bytes the hook reads (issue 19).

A real two-layer model is saved as safetensors, loaded with its second layer on disk in int8
(torchao packs it once into a ``*.quantized-*.safetensors`` file of the offload folder), and run
under a transfer recorder: the disk transfer of that layer is the packed file's data bytes, not
the float32 placeholder's dtype x shape.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from workbench.big_modeling import load_checkpoint_and_dispatch
from workbench.big_modeling.hooks.tensor_slots import held_nbytes, stored_nbytes_in
from workbench.big_modeling.offload.folder import OffloadedWeightsLoader
from workbench.big_modeling.quantization.packed import stored_nbytes
from workbench.big_modeling.transfers import TransferEvent, recording_transfers


def safetensors_data_nbytes(path: Path) -> int:
    """Bytes of tensor data in a safetensors file (its size less the length and the header)."""
    raw = path.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    assert len(json.loads(raw[8 : 8 + header_len])) > 1  # qdata + scale (+ zero point)
    return len(raw) - 8 - header_len


def _two_layers() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 128, bias=False), nn.Linear(128, 64, bias=False))


def _load(tmp_path: Path, precision_map: dict[str, str] | None) -> nn.Module:
    checkpoint = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in _two_layers().state_dict().items()}, str(checkpoint))
    with torch.device("meta"):
        model = _two_layers()
    return load_checkpoint_and_dispatch(
        model,
        checkpoint,
        device_map={"0": "cpu", "1": "disk"},
        offload_folder=tmp_path / "offload",
        precision_map=precision_map,
    )


def _disk_events(model: nn.Module) -> list[TransferEvent]:
    events: list[TransferEvent] = []
    with recording_transfers(events.append), torch.no_grad():
        model(torch.randn(2, 256))
    return [e for e in events if e.kind == "transfer" and e.source == "disk"]


def test_a_disk_int8_layer_transfers_its_packed_file_bytes(tmp_path: Path) -> None:
    model = _load(tmp_path, {"1": "int8"})
    (packed_file,) = sorted((tmp_path / "offload").glob("*.quantized-*.safetensors"))
    packed = safetensors_data_nbytes(packed_file)
    placeholder = model[1].weight
    assert placeholder.device.type == "meta"
    (event,) = _disk_events(model)
    assert event.module == "1" and event.nbytes == packed
    assert packed < placeholder.numel() * placeholder.element_size() // 3  # int8 + fp32 scales
    # the rebuilt weight the hook brings in holds exactly those bytes
    loader = OffloadedWeightsLoader(save_folder=tmp_path / "offload")
    assert stored_nbytes(loader["1.weight"]) == packed == held_nbytes(loader["1.weight"])


def test_a_plain_disk_layer_still_counts_its_stored_bytes(tmp_path: Path) -> None:
    model = _load(tmp_path, None)
    (event,) = _disk_events(model)
    assert event.module == "1" and event.nbytes == 128 * 64 * 4  # float32 as stored


def test_stored_nbytes_of_an_index_entry_it_cannot_size_is_unknown() -> None:
    class Folder:  # an offload loader's shape: an in-memory part and an index
        state_dict = {"a": torch.zeros(3, dtype=torch.float16)}
        index = {"b": {"dtype": "float99", "shape": [2]}, "c": {"dtype": "int8", "shape": [5, 2]}}

    assert stored_nbytes_in(Folder(), "a") == 6
    assert stored_nbytes_in(Folder(), "b") is None
    assert stored_nbytes_in(Folder(), "c") == 10
    assert stored_nbytes_in({"x": torch.zeros(4)}, "x") == 16
