"""Behaviours that match Accelerate's big-modeling reference (issue 15), each checked by hand.

The reference's own tests run in ``tests/conformance``; these are ours, one per behaviour, so a
regression shows here even where the reference's source distribution cannot be fetched.
"""

from __future__ import annotations

import copy
import inspect
import logging
import threading
import warnings
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

import workbench.big_modeling as engine
import workbench.big_modeling.utils as engine_utils
from workbench.big_modeling import (
    SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING,
    attach_layerwise_casting_hooks,
    check_device_map,
    cpu_offload,
    disk_offload,
    dispatch_model,
    dtype_byte_size,
    extract_submodules_state_dict,
    find_tied_parameters,
    get_module_size_with_ties,
    get_non_persistent_buffers,
    get_state_dict_offloaded_model,
    infer_auto_device_map,
    init_empty_weights,
    load_checkpoint_in_model,
    load_state_dict,
    named_module_tensors,
    retie_parameters,
    set_module_tensor_to_device,
)
from workbench.big_modeling.errors import DeviceMapError


class ModelForTest(nn.Module):
    """The reference tests' model: Linear(3, 4), BatchNorm1d(4), Linear(4, 5).

    Buffers: running_mean (4 x 4 B) + running_var (4 x 4 B) + num_batches_tracked (8 B) = 40 B.
    """

    def __init__(self) -> None:
        super().__init__()
        self.linear1 = nn.Linear(3, 4)
        self.batchnorm = nn.BatchNorm1d(4)
        self.linear2 = nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.batchnorm(self.linear1(x)))


def model_for_test() -> ModelForTest:
    torch.manual_seed(0)
    return ModelForTest().eval()


def test_all_disk_map_dispatches_on_the_cpu(tmp_path: Path) -> None:
    model = model_for_test()
    x = torch.randn(2, 3)
    expected = model(x)
    device_map = {"linear1": "disk", "batchnorm": "disk", "linear2": "disk"}
    dispatched = dispatch_model(copy.deepcopy(model), device_map, offload_dir=tmp_path)
    assert (tmp_path / "index.json").is_file()
    assert dispatched.linear1.weight.device.type == "meta"
    torch.testing.assert_close(dispatched(x), expected, rtol=0, atol=0)
    assert dispatched.hf_device_map == device_map


def test_whole_model_key_on_disk_dispatches_too(tmp_path: Path) -> None:
    model = model_for_test()
    x = torch.randn(2, 3)
    dispatched = dispatch_model(copy.deepcopy(model), {"": "disk"}, offload_dir=tmp_path)
    torch.testing.assert_close(dispatched(x), model(x), rtol=0, atol=0)


# -- init_empty_weights ----------------------------------------------------------------------


def test_include_buffers_patches_nothing_global() -> None:
    register_parameter = nn.Module.register_parameter
    register_buffer = nn.Module.register_buffer
    with init_empty_weights(include_buffers=True):
        module = nn.BatchNorm1d(4)
        assert nn.Module.register_parameter is register_parameter
        assert nn.Module.register_buffer is register_buffer
    assert module.weight.is_meta and module.running_mean.is_meta
    assert nn.BatchNorm1d(4).running_mean.device.type == "cpu"


@pytest.mark.parametrize("include_buffers", [False, True])
def test_another_thread_builds_real_weights_while_a_block_is_open(include_buffers: bool) -> None:
    built: dict[str, torch.device] = {}

    def build_elsewhere() -> None:  # e.g. a GUI thread making a real model meanwhile
        layer = nn.BatchNorm1d(4)
        built["weight"], built["buffer"] = layer.weight.device, layer.running_mean.device

    with init_empty_weights(include_buffers=include_buffers):
        here = nn.Linear(2, 2)
        other = threading.Thread(target=build_elsewhere)
        other.start()
        other.join()
    assert here.weight.is_meta
    assert built == {"weight": torch.device("cpu"), "buffer": torch.device("cpu")}


def test_blocks_open_in_two_threads_each_use_their_own_device() -> None:
    opened, release = threading.Event(), threading.Event()
    built: dict[str, torch.device] = {}

    def build_on_meta_in_a_block() -> None:
        with init_empty_weights():
            opened.set()
            release.wait()
            built["thread"] = nn.Linear(2, 2).weight.device

    other = threading.Thread(target=build_on_meta_in_a_block)
    other.start()
    opened.wait()
    try:
        with init_empty_weights():
            built["main"] = nn.Linear(2, 2).weight.device
        built["after"] = nn.Linear(2, 2).weight.device  # the other thread's block is still open
    finally:
        release.set()
        other.join()
    assert built == {"main": META, "after": torch.device("cpu"), "thread": META}
    assert nn.Linear(2, 2).weight.device.type == "cpu"


META = torch.device("meta")


# -- layerwise casting constants ---------------------------------------------------------------


def test_upcasting_layers_are_exposed_under_the_reference_names() -> None:
    from workbench.big_modeling import constants

    const = constants.SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING

    assert const is SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING
    assert engine_utils.SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING is const
    assert const == (
        nn.Conv1d,
        nn.Conv2d,
        nn.Conv3d,
        nn.ConvTranspose1d,
        nn.ConvTranspose2d,
        nn.ConvTranspose3d,
        nn.Linear,
    )


def test_casting_hooks_exactly_the_supported_layers() -> None:
    model = nn.Sequential(
        nn.Linear(4, 4), nn.Conv1d(1, 1, 1), nn.ConvTranspose2d(1, 1, 1), nn.LayerNorm(4)
    )
    model.add_module("embed", nn.Embedding(4, 4))
    attach_layerwise_casting_hooks(model, torch.float8_e4m3fn, torch.float32)
    for module in model:
        expected = (
            torch.float8_e4m3fn
            if isinstance(module, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING)
            else torch.float32
        )
        assert module.weight.dtype == expected, type(module).__name__


# -- check_device_map ---------------------------------------------------------------------------


def test_check_device_map_warns_about_keys_that_name_no_submodule() -> None:
    device_map = {"linear1": "cpu", "batchnorm": "cpu", "linear2": "cpu"}
    with pytest.warns(UserWarning, match="device_map keys do not match any submodules") as record:
        check_device_map(model_for_test(), {**device_map, "invalid_module": 0, "another": 1})
    message = str(record[0].message)
    assert "'invalid_module'" in message and "'another'" in message
    with pytest.raises(DeviceMapError, match="no device for 2 tensors"):  # still an error
        check_device_map(model_for_test(), {"linear1": 0, "batchnorm": 0})


# -- load_checkpoint_in_model -------------------------------------------------------------------


@pytest.mark.parametrize("device_map", [None, {"": "cpu"}])
def test_unused_checkpoint_keys_are_logged_and_the_rest_loads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, device_map: dict | None
) -> None:
    source = model_for_test()
    state = {**source.state_dict(), "foo": torch.rand(4, 5)}
    torch.save(state, tmp_path / "model.pt")
    model = ModelForTest()
    with caplog.at_level(logging.WARNING):
        load_checkpoint_in_model(model, tmp_path / "model.pt", device_map=device_map)
    assert any(
        "were not used when" in record.getMessage() and "foo" in record.getMessage()
        for record in caplog.records
    )
    for name, tensor in source.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0)
    with pytest.raises((ValueError, RuntimeError), match="foo"):
        load_checkpoint_in_model(
            ModelForTest(), tmp_path / "model.pt", device_map=device_map, strict=True
        )


# -- infer_auto_device_map's warnings and logs ----------------------------------------------------


def buffered_model() -> ModelForTest:
    """Buffers 440 B (80 + 160 + 120 + 80); modules 144, 192, 220, 180 B."""
    model = model_for_test()
    model.linear1.register_buffer("test_buffer1", torch.zeros(10, 2))  # 80 B
    model.batchnorm.register_buffer("test_buffer2", torch.zeros(10, 3))  # 120 B (+ 40 B)
    model.linear2.register_buffer("test_buffer3", torch.zeros(10, 3))  # 120 B
    model.linear3 = nn.Linear(4, 5)
    model.linear3.register_buffer("test_buffer4", torch.zeros(10, 2))  # 80 B
    return model


def test_planner_warns_when_offloaded_buffers_fit_no_gpu() -> None:
    expected = {"linear1": 0, "batchnorm": 1, "linear2": "cpu", "linear3": "cpu"}
    # Offloaded buffers: linear2 120 + linear3 80 = 200 B. GPU 0 holds 144 B + 220 B kept for
    # the largest offloaded layer: 400 - 364 < 200; GPU 1 holds 192 B: 200 - 192 < 200.
    with pytest.warns(UserWarning, match="offload_buffers=True"):
        assert infer_auto_device_map(buffered_model(), {0: 400, 1: 200, "cpu": "1GB"}) == expected
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # GPU 1 with 400 B: 400 - 192 >= 200, the buffers fit there
        assert infer_auto_device_map(buffered_model(), {0: 400, 1: 400, "cpu": "1GB"}) == expected
        planned = infer_auto_device_map(
            buffered_model(), {0: 400, 1: 200, "cpu": "1GB"}, offload_buffers=True
        )
        assert planned == expected


def test_planner_logs_devices_left_empty_for_insufficient_memory(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner = nn.Sequential(
        OrderedDict(
            [
                ("linear1", nn.Linear(10, 4)),
                ("linear2", nn.Linear(4, 4)),
                ("linear3", nn.Linear(4, 8)),
            ]
        )
    )
    model = nn.Sequential(OrderedDict([("module", inner)]))  # 176 + 80 + 160 B
    with caplog.at_level(logging.INFO, logger="workbench.big_modeling"):
        device_map = infer_auto_device_map(model, max_memory={0: 256})
    assert 0 not in device_map.values()
    assert any("insufficient memory" in record.getMessage() for record in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="workbench.big_modeling"):
        device_map = infer_auto_device_map(model, max_memory={0: 256}, fallback_allocation=True)
    assert device_map == {"module.linear1": "disk", "module.linear2": 0, "module.linear3": "disk"}
    assert not any("insufficient memory" in record.getMessage() for record in caplog.records)


# -- small utilities ----------------------------------------------------------------------------


def test_named_module_tensors_order_and_no_mutation() -> None:
    model = model_for_test()
    model.batchnorm.register_buffer("scratch", torch.zeros(1), persistent=False)
    names = [name for name, _ in named_module_tensors(model, recurse=True)]
    assert names == [
        "linear1.weight",
        "linear1.bias",
        "batchnorm.weight",
        "batchnorm.bias",
        "linear2.weight",
        "linear2.bias",
        "batchnorm.running_mean",
        "batchnorm.running_var",
        "batchnorm.num_batches_tracked",
        "batchnorm.scratch",
    ]
    kept = [n for n, _ in named_module_tensors(model, recurse=True, remove_non_persistent=True)]
    assert kept == names[:-1]
    assert [n for n, _ in named_module_tensors(model.batchnorm, include_buffers=False)] == [
        "weight",
        "bias",
    ]
    assert model._non_persistent_buffers_set == set()
    assert model.batchnorm._non_persistent_buffers_set == {"scratch"}


def test_get_non_persistent_buffers_returns_a_copy() -> None:
    model = model_for_test()
    model.batchnorm.register_buffer("scratch", torch.zeros(1), persistent=False)
    found = get_non_persistent_buffers(model, recurse=True)
    assert found == {"scratch"}
    assert get_non_persistent_buffers(model, recurse=True, fqns=True) == {"batchnorm.scratch"}
    assert get_non_persistent_buffers(model) == set()
    found.add("other")
    assert model.batchnorm._non_persistent_buffers_set == {"scratch"}
    assert model._non_persistent_buffers_set == set()


def test_dtype_byte_size_of_bool_is_one_bit() -> None:
    assert dtype_byte_size(torch.bool) == 1 / 8
    assert dtype_byte_size(torch.float8_e4m3fn) == 1
    assert dtype_byte_size(torch.float16) == 2


def test_set_module_tensor_to_device_moves_sets_and_checks() -> None:
    model = model_for_test()
    set_module_tensor_to_device(model, "linear1.weight", "meta")
    assert model.linear1.weight.is_meta and isinstance(model.linear1.weight, nn.Parameter)
    with pytest.raises(ValueError, match="meta device, we need a `value`"):
        set_module_tensor_to_device(model, "linear1.weight", "cpu")
    value = torch.randn(4, 3)
    set_module_tensor_to_device(model.linear1, "weight", "cpu", value=value)
    torch.testing.assert_close(model.linear1.weight.data, value, rtol=0, atol=0)
    set_module_tensor_to_device(model, "batchnorm.running_mean", "cpu", value=torch.ones(4))
    assert torch.equal(model.batchnorm.running_mean, torch.ones(4))
    set_module_tensor_to_device(model, "linear2.bias", "cpu", value=torch.ones(5), dtype="float16")
    assert model.linear2.bias.dtype == torch.float16
    with pytest.raises(ValueError) as error:
        set_module_tensor_to_device(model, "linear1.weight", "cpu", value=torch.zeros(2, 2))
    assert str(error.value) == (
        'Trying to set a tensor of shape torch.Size([2, 2]) in "weight" (which has shape '
        "torch.Size([4, 3])), this looks incorrect."
    )
    with pytest.raises(ValueError, match="no_such"):
        set_module_tensor_to_device(model, "linear1.no_such", "cpu")


def test_set_module_tensor_reuses_a_tied_copy_and_stores_statistics() -> None:
    model = model_for_test()
    shared = torch.randn(4, 3)
    tied_params_map: dict = {shared.data_ptr(): {}}
    set_module_tensor_to_device(
        model, "linear1.weight", "cpu", shared, tied_params_map=tied_params_map
    )
    placed = model.linear1.weight
    assert tied_params_map[shared.data_ptr()][torch.device("cpu")] is placed
    other = model_for_test()
    set_module_tensor_to_device(
        other, "linear1.weight", "cpu", shared, tied_params_map=tied_params_map
    )
    assert other.linear1.weight is placed  # reused, not copied
    stats = torch.ones(4, dtype=torch.float16)
    set_module_tensor_to_device(
        model, "linear2.weight", "cpu", torch.randn(5, 4), fp16_statistics=stats
    )
    assert torch.equal(model.linear2.weight.SCB, stats)


def test_find_and_retie_parameters() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2))
    assert find_tied_parameters(model) == []
    retie_parameters(model, [["0.weight", "2.weight"]])
    assert model[0].weight is model[2].weight
    assert find_tied_parameters(model) == [["0.weight", "2.weight"]]
    model[0].weight = nn.Parameter(torch.empty(2, 2, device="meta"))
    retie_parameters(model, [["0.weight", "2.weight"]])  # the first one not on meta wins
    assert model[0].weight is model[2].weight and not model[0].weight.is_meta


def test_module_size_with_ties_does_not_confuse_1_and_10() -> None:
    model = nn.ModuleList([nn.Linear(10, 10) for _ in range(12)])  # weight 400 B, bias 40 B
    for i in range(1, 12):
        model[i].weight = model[0].weight
    sizes = {f"{i}": 440 for i in range(12)} | {f"{i}.weight": 400 for i in range(12)}
    treat = list(model.named_children())[1:]
    tied = sorted(f"{i}.weight" for i in range(1, 12))  # 1, 10, 11, 2, ...
    nbytes, names, modules = get_module_size_with_ties(tied, 440, sizes, treat)
    assert nbytes == 440 + 11 * 40  # each tied module adds its bias only
    assert names == tied_names(tied)
    assert modules == [model[int(name)] for name in names]


def tied_names(params: list[str]) -> list[str]:
    return [param.rpartition(".")[0] for param in params]


def test_extract_submodules_state_dict_matches_whole_names() -> None:
    state = {name: torch.zeros(1) for name in ("a.1.weight", "a.10.weight", "a.1", "b.weight")}
    assert sorted(extract_submodules_state_dict(state, ["a.1"])) == ["a.1", "a.1.weight"]
    assert sorted(extract_submodules_state_dict(state, ["a.10", "b"])) == [
        "a.10.weight",
        "b.weight",
    ]


def test_load_state_dict_reads_safetensors_and_weights_only_pickles(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    state = {name: torch.randn(4, 5) for name in ("a.weight", "b.weight", "c.weight")}
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    torch.save(state, tmp_path / "model.bin")
    for file in (tmp_path / "model.safetensors", tmp_path / "model.bin"):
        loaded = load_state_dict(file, device_map={"a": "cpu", "b": "disk", "": "cpu"})
        assert list(loaded) == list(state)
        for name, tensor in state.items():
            assert loaded[name].device.type == "cpu"
            torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=0)
    assert list(load_state_dict(str(tmp_path / "model.safetensors"))) == list(state)


def test_state_dict_of_cpu_and_disk_offloaded_models_equals_the_original(tmp_path: Path) -> None:
    for offload in ("cpu", "disk", "dispatch"):
        model = model_for_test()
        original = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        if offload == "cpu":
            cpu_offload(model, execution_device="cpu")
        elif offload == "disk":
            disk_offload(model, tmp_path / offload, execution_device="cpu")
        else:
            device_map = {"linear1": "disk", "batchnorm": "cpu", "linear2": "disk"}
            dispatch_model(model, device_map, offload_dir=tmp_path / offload)
        assert model.linear1.weight.is_meta
        state = get_state_dict_offloaded_model(model)
        assert list(state) == list(original), offload
        for name, tensor in original.items():
            assert state[name].device.type == "cpu"
            torch.testing.assert_close(state[name], tensor, rtol=0, atol=0)
        assert model.linear1.weight.is_meta  # brought in one module at a time, then dropped


UTILITY_NAMES = [
    "set_module_tensor_to_device",
    "get_state_dict_offloaded_model",
    "retie_parameters",
    "find_tied_parameters",
    "get_module_size_with_ties",
    "get_non_persistent_buffers",
    "extract_submodules_state_dict",
    "load_state_dict",
    "compute_module_sizes",
    "get_balanced_memory",
    "get_max_memory",
    "get_max_layer_size",
    "clean_device_map",
    "named_module_tensors",
    "dtype_byte_size",
    "convert_file_size_to_int",
    "offload_weight",
    "offload_state_dict",
    "load_offloaded_weight",
    "OffloadedWeightsLoader",
    "PrefixedDataset",
]


@pytest.mark.parametrize("name", UTILITY_NAMES)
def test_utilities_are_one_object_in_both_namespaces(name: str) -> None:
    assert name in engine.__all__ and name in engine_utils.__all__
    assert getattr(engine, name) is getattr(engine_utils, name)  # a re-export, not a copy


def test_utility_signatures_follow_the_reference() -> None:
    expected = {
        "set_module_tensor_to_device": [
            "module", "tensor_name", "device", "value", "dtype", "fp16_statistics",
            "tied_params_map", "non_blocking", "clear_cache",
        ],
        "get_non_persistent_buffers": ["module", "recurse", "fqns"],
        "named_module_tensors": ["module", "include_buffers", "recurse", "remove_non_persistent"],
        "load_state_dict": ["checkpoint_file", "device_map"],
        "get_module_size_with_ties": [
            "tied_params", "module_size", "module_sizes", "modules_to_treat",
        ],
        "compute_module_sizes": ["model", "dtype", "special_dtypes", "buffers_only"],
        "extract_submodules_state_dict": ["state_dict", "submodule_names"],
        "retie_parameters": ["model", "tied_params"],
    }  # fmt: skip
    for name, parameters in expected.items():
        signature = inspect.signature(getattr(engine, name))
        positional = [p.name for p in signature.parameters.values() if p.kind != p.KEYWORD_ONLY]
        assert positional == parameters, name
