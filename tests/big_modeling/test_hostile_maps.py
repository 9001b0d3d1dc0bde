"""Hostile device maps and devices: each ends in a named error, never a crash or a hang."""

from __future__ import annotations

import json
from pathlib import Path

import checkpoint_fixtures as fx
import pytest
import torch
from checkpoint_fixtures import empty_model
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from workbench.big_modeling.device_map.files import (
    MAX_KEY_CHARS,
    _contradictions,
    check_model_record,
    load_device_map,
    read_device_map,
    save_device_map,
)
from workbench.big_modeling.devices import check_devices_available, normalize_device
from workbench.big_modeling.dispatch import dispatch_model
from workbench.big_modeling.errors import DeviceMapError
from workbench.big_modeling.loading.api import load_checkpoint_in_model

reference_model = fx.reference_model
single_ckpt = fx.single_ckpt

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has CUDA")


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "m.json"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("value", ["\u00b2", "\u0661", "cuda:\u0661", "cuda:\u00b2", "9" * 5000])
def test_devices_accept_ascii_digits_only(value: str) -> None:
    # "\u0661" (Arabic one) was read as GPU 1; "\u00b2" escaped as a bare ValueError from int()
    with pytest.raises(DeviceMapError, match="is not a device"):
        normalize_device(value)


def test_non_ascii_digit_in_a_map_file_is_a_listed_bad_device(tmp_path: Path) -> None:
    path = _write(tmp_path, json.dumps({"a": "\u00b2", "b": "\u0661", "c": "cpu"}))
    reading = read_device_map(path)
    assert reading.bad_devices == {"a": "\u00b2", "b": "\u0661"}
    assert reading.device_map == {"c": "cpu"}


def test_deep_json_is_a_named_error_not_recursion(tmp_path: Path) -> None:
    path = _write(tmp_path, "[" * 100_000 + "]" * 100_000)
    with pytest.raises(DeviceMapError, match=r"m\.json: nested more than 64 levels deep"):
        load_device_map(path)


def test_huge_integer_literal_is_a_named_error(tmp_path: Path) -> None:
    path = _write(tmp_path, '{"": ' + "1" * 5000 + "}")
    with pytest.raises(DeviceMapError, match=r"m\.json: not usable JSON"):
        load_device_map(path)


def test_one_megabyte_dotted_key_is_refused_by_length(tmp_path: Path) -> None:
    key = ".".join(["a"] * 500_000)  # ~1 MB, 500,000 parts: the old ancestor walk ran > 30 s
    path = _write(tmp_path, json.dumps({"a": 0, key: "cpu"}))
    with pytest.raises(DeviceMapError, match=f"longer than {MAX_KEY_CHARS} characters"):
        load_device_map(path)


def test_contradictions_found_through_many_levels(tmp_path: Path) -> None:
    deep = ".".join(["a"] * 2000)  # 3999 characters, under the cap
    path = _write(tmp_path, json.dumps({"a": 0, "a.a": 0, deep: "cpu"}))
    with pytest.raises(DeviceMapError, match=r"'a\.a' -> 0 vs 'a\.a\.a"):
        load_device_map(path)
    agreeing = _write(tmp_path, json.dumps({"": 0, "a": 0, deep: 0}))
    assert len(load_device_map(agreeing)) == 3


def test_wrapped_map_for_another_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gpt2.json"
    save_device_map(path, {"": "cpu"}, **{"class": "GPT2LMHeadModel", "param_count": 124439808})
    model = nn.Linear(2, 2)
    with pytest.raises(DeviceMapError) as caught:
        load_device_map(path, model)
    message = str(caught.value)
    assert message.startswith(f"{path}: made for another model")
    assert "class: the map was made for GPT2LMHeadModel, this model is Linear" in message
    assert "124,439,808 parameters, this model has 6" in message
    assert "plain 'device_map' object" in message
    assert load_device_map(path) == {"": "cpu"}  # without a model nothing is compared


def test_wrapped_map_for_this_model_loads(tmp_path: Path) -> None:
    path = tmp_path / "lin.json"
    save_device_map(path, {"": "cpu"}, **{"class": "Linear", "param_count": 6, "source": "x"})
    assert load_device_map(path, nn.Linear(2, 2)) == {"": "cpu"}
    check_model_record({"source": "elsewhere"}, nn.Linear(2, 2))  # nothing to compare


def test_model_record_that_is_not_an_object(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        json.dumps(
            {"format": "workbench-device-map", "version": 1, "model": [1], "device_map": {}}
        ),
    )
    with pytest.raises(DeviceMapError, match="'model' must be an object"):
        read_device_map(path)


@needs_no_cuda
def test_missing_devices_are_named_with_what_the_machine_has() -> None:
    with pytest.raises(DeviceMapError) as caught:
        check_devices_available({"": "cuda:99", "lm_head": 0, "x": "meta", "y": "disk"})
    message = str(caught.value)
    assert (
        "puts 3 module(s) on cuda:0, cuda:99, meta, which this machine does not have: " in message
    )
    assert "'' -> cuda:99, 'lm_head' -> cuda:0, " in message
    assert "'x' -> meta" in message
    assert "This machine has cpu, disk (no CUDA GPU is visible to torch)" in message
    check_devices_available({"": "cpu", "a": "disk", "b": "meta"}, allow_meta=True)


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="the machine has mps")
def test_mps_is_named_where_absent() -> None:
    with pytest.raises(DeviceMapError, match="'head' -> mps"):
        check_devices_available({"head": "mps"})


@needs_no_cuda
def test_loader_names_the_missing_device_before_reading(single_ckpt: Path) -> None:
    model = empty_model()
    with pytest.raises(DeviceMapError, match=r"'blocks\.1' -> cuda:99"):
        load_checkpoint_in_model(model, single_ckpt, device_map={"": "cpu", "blocks.1": 99})
    assert all(p.device.type == "meta" for p in model.parameters())  # nothing was loaded


def test_non_string_keys_are_a_named_error_not_type_error() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    with pytest.raises(DeviceMapError, match=r"1 keys that are not module names: 0 \(int\)"):
        dispatch_model(model, {0: "cpu", "1": "cpu"})


@needs_no_cuda
def test_dispatch_names_the_missing_device() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    with pytest.raises(DeviceMapError, match=r"'1' -> cuda:99"):
        dispatch_model(model, {"0": "cpu", "1": "cuda:99"})


@pytest.mark.gpu
def test_a_gpu_index_past_the_count_is_named_on_a_gpu_machine() -> None:
    count = torch.cuda.device_count()
    check_devices_available({"": 0, "head": f"cuda:{count - 1}", "x": "cpu"})
    with pytest.raises(DeviceMapError) as caught:
        check_devices_available({"": 0, "head": f"cuda:{count}"})
    message = str(caught.value)
    assert f"'head' -> cuda:{count}" in message and "This machine has cuda:0" in message


def _naive_contradiction(device_map: dict) -> bool:
    for key, device in device_map.items():
        parts = key.split(".") if key else []
        ancestors = [""] + [".".join(parts[:i]) for i in range(1, len(parts))]
        if key and any(a in device_map and device_map[a] != device for a in ancestors):
            return True
    return False


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.lists(st.sampled_from(["a", "b", "ab"]), max_size=4).map(".".join),
        st.sampled_from([0, 1, "cpu"]),
        max_size=12,
    )
)
def test_the_linear_walk_finds_exactly_the_maps_with_contradictions(device_map: dict) -> None:
    assert bool(_contradictions(device_map)) == _naive_contradiction(device_map)
