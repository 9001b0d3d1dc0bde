"""Device maps: coverage checks, merging keys, and JSON files (plain and wrapped forms)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from workbench.big_modeling.device_map.coverage import check_device_map, resolve_device_map
from workbench.big_modeling.device_map.files import load_device_map, save_device_map
from workbench.big_modeling.device_map.value import clean_device_map
from workbench.big_modeling.errors import BadInputError, DeviceMapError


def test_check_device_map_accepts_full_cover(toy_model: nn.Module) -> None:
    check_device_map(toy_model, {"": "cpu"})
    check_device_map(toy_model, {"embed": 0, "blocks": "cuda:1", "head": "disk"})
    # the most specific key wins, as in transformers
    resolved = resolve_device_map(toy_model, {"": "cpu", "blocks.1": 0, "head.bias": "disk"})
    assert resolved["blocks.1.linear1.weight"] == 0
    assert resolved["blocks.0.linear1.weight"] == "cpu"
    assert resolved["head.bias"] == "disk"
    assert resolved["head.weight"] == "cpu"


def test_check_device_map_lists_uncovered_tensors_sorted(toy_model: nn.Module) -> None:
    with pytest.raises(DeviceMapError) as error:
        check_device_map(toy_model, {"embed": 0, "blocks": 0})
    assert str(error.value) == (
        "device_map gives no device for 2 tensors: 'head.bias', 'head.weight'. "
        "Add a covering key or a '' entry."
    )


def test_check_device_map_lists_unknown_names_and_devices(toy_model: nn.Module) -> None:
    with pytest.raises(DeviceMapError, match="2 keys that are not modules") as error:
        resolve_device_map(toy_model, {"": 0, "zeta": 0, "blocks.9": 0})
    assert "'blocks.9', 'zeta'" in str(error.value)
    # the reference API function only warns about them (and ignores them)
    with pytest.warns(UserWarning, match=r"keys do not match any submodules .*'zeta', 'blocks.9'"):
        check_device_map(toy_model, {"": 0, "zeta": 0, "blocks.9": 0})
    with pytest.raises(DeviceMapError, match="not devices: 'embed': 'gpu0', 'head': -1"):
        check_device_map(toy_model, {"head": -1, "embed": "gpu0", "blocks": 0})


def test_check_device_map_covers_tied_names(tiny_llama) -> None:
    check_device_map(tiny_llama, {"model": 0, "lm_head": 0})
    with pytest.raises(DeviceMapError, match=re.escape("'lm_head.weight'")):
        check_device_map(tiny_llama, {"model": 0})


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({"a.0": 0, "a.1": 0, "b": "cpu"}, {"a": 0, "b": "cpu"}),
        ({"a.0": 0, "a.1": 0, "b": 0}, {"": 0}),
        ({"a.x.0": 0, "a.x.1": 0, "a.y": 1}, {"a.x": 0, "a.y": 1}),
        ({"a": 0}, {"a": 0}),
        ({"b.1": "disk", "a": 0, "b.0": "disk"}, {"b": "disk", "a": 0}),
    ],
)
def test_clean_device_map(before: dict, after: dict) -> None:
    result = clean_device_map(dict(before))
    assert result == after


def test_clean_device_map_under_one_module_only() -> None:
    device_map = {"a.0": 0, "a.1": 0, "b.0": 1, "b.1": 1}
    assert clean_device_map(device_map, "a") == {"a": 0, "b.0": 1, "b.1": 1}


@settings(max_examples=50, deadline=None)
@given(
    st.dictionaries(
        st.lists(st.sampled_from("abc"), min_size=1, max_size=3).map(".".join),
        st.sampled_from([0, 1, "cpu"]),
        min_size=1,
        max_size=10,
    )
)
def test_clean_device_map_keeps_every_resolution(device_map: dict) -> None:
    """Merging never changes which device a name resolves to (keys inside keys excluded)."""
    keys = sorted(device_map)
    if any(other.startswith(key + ".") for key in keys for other in keys):
        return
    cleaned = clean_device_map(dict(device_map))

    def resolve(mapping: dict, name: str) -> object:
        while name not in mapping:
            name = name.rpartition(".")[0] if name else None
            if name is None:
                return None
        return mapping[name]

    for key, device in device_map.items():
        assert resolve(cleaned, key) == device
    assert len(cleaned) <= len(device_map)


def test_save_and_load_round_trip_plain(tmp_path: Path, toy_model: nn.Module) -> None:
    path = tmp_path / "map.json"
    save_device_map(path, {"embed": "cuda:0", "blocks": 1, "head": "disk"})
    assert json.loads(path.read_text()) == {"embed": 0, "blocks": 1, "head": "disk"}
    assert load_device_map(path, toy_model) == {"embed": 0, "blocks": 1, "head": "disk"}
    assert [p.name for p in tmp_path.iterdir()] == ["map.json"]  # no temp files left


def test_save_and_load_round_trip_wrapped(tmp_path: Path, toy_model: nn.Module) -> None:
    path = tmp_path / "map.json"
    save_device_map(path, {"": "mps"}, name="toy", num_parameters=150)
    document = json.loads(path.read_text())
    assert document == {
        "format": "workbench-device-map",
        "version": 1,
        "model": {"name": "toy", "num_parameters": 150},
        "device_map": {"": "mps"},
    }
    assert load_device_map(path, toy_model) == {"": "mps"}


def test_failed_save_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "map.json"
    save_device_map(path, {"": 0})
    with pytest.raises(BadInputError, match="metadata cannot be written as JSON"):
        save_device_map(path, {"": 1}, fingerprint=object())
    with pytest.raises(DeviceMapError, match="'a'"):
        save_device_map(path, {"a": "gpu"})
    assert json.loads(path.read_text()) == {"": 0}
    assert [p.name for p in tmp_path.iterdir()] == ["map.json"]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.json"
    path.write_text(text)
    return path


def test_invalid_json_names_file_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, '{\n  "embed": 0,\n  "head" "cpu"\n}')
    with pytest.raises(DeviceMapError, match=r"bad\.json: not valid JSON \(line 3, column 10"):
        load_device_map(path)


def test_duplicate_keys_are_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, '{"head": 0, "embed": 0, "head": "cpu"}')
    with pytest.raises(DeviceMapError, match="duplicate keys 'head'"):
        load_device_map(path)


def test_unknown_devices_are_listed_sorted(tmp_path: Path) -> None:
    path = write(tmp_path, '{"head": "gpu", "embed": true, "blocks": 0, "x": null}')
    with pytest.raises(DeviceMapError) as error:
        load_device_map(path)
    assert "3 entries do not name a device: 'embed': true, 'head': \"gpu\", 'x': null" in str(
        error.value
    )


def test_names_not_in_the_model(tmp_path: Path, toy_model: nn.Module) -> None:
    path = write(tmp_path, '{"embed": 0, "blocks.7": 1, "encoder": "cpu"}')
    assert load_device_map(path) == {"embed": 0, "blocks.7": 1, "encoder": "cpu"}  # no model
    with pytest.raises(DeviceMapError, match=r"bad\.json: .*'blocks\.7', 'encoder'"):
        load_device_map(path, toy_model)


def test_contradictory_overlaps_are_rejected_but_agreeing_ones_load(tmp_path: Path) -> None:
    path = write(tmp_path, '{"blocks": 0, "blocks.1": "cpu", "head": 0}')
    with pytest.raises(DeviceMapError, match=re.escape("'blocks' -> 0 vs 'blocks.1' -> 'cpu'")):
        load_device_map(path)
    agreeing = write(tmp_path, '{"blocks": 0, "blocks.1": "cuda:0"}')
    assert load_device_map(agreeing) == {"blocks": 0, "blocks.1": 0}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"format": "workbench-device-map", "version": 2, "device_map": {}}', "version 2"),
        ('{"format": "other", "version": 1, "device_map": {}}', "unknown format 'other'"),
        (
            '{"format": "workbench-device-map", "version": 1, "device_map": [1]}',
            "must be an object",
        ),
        ("[1, 2]", "expected a JSON object"),
        ('{"a..b": 0}', "malformed module names 'a..b'"),
    ],
)
def test_malformed_files(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(DeviceMapError, match=message):
        load_device_map(write(tmp_path, text))


def test_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_device_map(tmp_path / "nope.json")
