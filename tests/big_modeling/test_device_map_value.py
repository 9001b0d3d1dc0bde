"""``DeviceMap``: normalised once, immutable, one "longest covering key wins" lookup."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from torch import nn

from workbench.big_modeling.device_map.coverage import covering_devices, resolve_device_map
from workbench.big_modeling.device_map.files import load_device_map, save_device_map
from workbench.big_modeling.device_map.value import (
    DeviceMap,
    covering_key,
    device_for,
    normalize_device_map,
)
from workbench.big_modeling.errors import DeviceMapError


def test_devices_are_normalised_at_construction() -> None:
    device_map = DeviceMap(
        {"": "CPU ", "a": "cuda:1", "b": torch.device("cuda", 2), "c": 3, "d": "disk"}
    )
    assert dict(device_map) == {"": "cpu", "a": 1, "b": 2, "c": 3, "d": "disk"}
    assert list(device_map) == ["", "a", "b", "c", "d"]  # the given order is kept
    assert device_map.devices() == {"cpu", 1, 2, 3, "disk"}


def test_bad_values_are_all_listed_sorted_with_the_reason() -> None:
    with pytest.raises(DeviceMapError) as error:
        DeviceMap({"z": "gpu0", "a": -1, "ok": "cpu"})
    message = str(error.value)
    assert "2 values that are not devices: 'a': -1, 'z': 'gpu0'" in message
    assert "device index -1 is negative" in message


def test_keys_that_are_not_strings_are_refused_by_name() -> None:
    with pytest.raises(DeviceMapError, match=r"1 keys that are not module names: 0 \(int\)"):
        DeviceMap({0: "cpu", "a": "cpu"})  # type: ignore[dict-item]


def test_a_map_must_be_a_mapping() -> None:
    with pytest.raises(DeviceMapError, match="must be a dict of module name -> device, got str"):
        DeviceMap("auto")  # type: ignore[arg-type]


def test_longest_covering_key_wins() -> None:
    device_map = DeviceMap({"": "cpu", "layers": 0, "layers.1": 1, "layers.1.mlp": "disk"})
    assert device_map.device_for("layers.1.mlp.up.weight") == "disk"
    assert device_map.device_for("layers.1.attn") == 1
    assert device_map.device_for("layers.10") == 0  # "layers.1" is no dotted prefix of it
    assert device_map.device_for("lm_head.weight") == "cpu"
    assert device_map.covering_key("layers.10.mlp") == "layers"


def test_no_covering_key_gives_none() -> None:
    device_map = DeviceMap({"layers.0": 0})
    assert device_map.device_for("layers") is None
    assert device_map.device_for("layers.00") is None
    assert device_map.covering_key("head") is None


def test_the_functions_work_on_plain_mappings_and_sets() -> None:
    assert covering_key("model.layers.3.mlp", {"model.layers.3", "model"}) == "model.layers.3"
    assert covering_key("x", set()) is None
    assert device_for("a.b", {"a": "cpu"}) == "cpu"
    assert device_for("b", {"a": "cpu"}) is None


def test_a_device_map_is_immutable() -> None:
    device_map = DeviceMap({"": 0})
    with pytest.raises(AttributeError, match="immutable"):
        device_map._devices = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        device_map[""] = 1  # type: ignore[index]
    copy = device_map.to_dict()
    copy[""] = 1
    assert device_map[""] == 0


def test_equality_hash_and_of() -> None:
    first = DeviceMap({"a": "cuda:0", "b": "cpu"})
    second = DeviceMap({"b": "cpu", "a": 0})
    assert first == second == {"a": 0, "b": "cpu"}
    assert first != {"a": 1, "b": "cpu"}
    assert hash(first) == hash(second)
    assert DeviceMap.of(first) is first
    assert DeviceMap.of({"a": "cuda:0"}) == {"a": 0}
    assert normalize_device_map(first) == {"a": 0, "b": "cpu"}
    assert repr(DeviceMap({"": "cuda:1"})) == "DeviceMap({'': 1})"


def test_round_trip_through_a_file_and_pickle(tmp_path: Path) -> None:
    device_map = DeviceMap({"embed": "cuda:0", "layers": "cpu", "head": "disk"})
    path = tmp_path / "map.json"
    save_device_map(path, device_map)
    loaded = load_device_map(path)
    assert loaded == device_map
    assert DeviceMap(loaded) == device_map
    assert pickle.loads(pickle.dumps(device_map)) == device_map


def test_the_reference_functions_take_a_device_map() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    device_map = DeviceMap({"": "cpu", "1": "cuda:0"})
    expected = {"0.weight": "cpu", "0.bias": "cpu", "1.weight": 0, "1.bias": 0}
    assert resolve_device_map(model, device_map) == expected
    assert covering_devices(model, device_map) == expected
