"""Layerwise casting: storage stays small, the forward sees exact up-cast copies."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional

from workbench.big_modeling import cpu_offload
from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.hooks.base import (
    ModelHook,
    SequentialHook,
    add_hook_to_module,
    remove_hook_from_module,
)
from workbench.big_modeling.hooks.casting import (
    LayerwiseCastingHook,
    _upcast,
    attach_layerwise_casting_hooks,
)
from workbench.big_modeling.hooks.casting_kernels import (
    _fp8_upcast_kernel,
    fp8_upcast_triton,
    triton_failure,
)

FP8 = torch.float8_e4m3fn


def _mlp(width: int = 32, depth: int = 3, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def _reference_forward(model: nn.Sequential, x: torch.Tensor, storage, compute) -> torch.Tensor:
    """The same math done by hand: round each weight to storage, up-cast it, run functional.linear."""
    for layer in model:
        if isinstance(layer, nn.Linear):
            weight = layer.weight.detach().to(storage).to(compute)
            bias = layer.bias.detach().to(storage).to(compute)
            x = functional.linear(x, weight, bias)
        else:
            x = layer(x)
    return x


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).view(torch.uint8).clone()


@pytest.mark.parametrize(
    ("storage", "compute"),
    [(FP8, torch.bfloat16), (torch.bfloat16, torch.float32), (torch.float8_e5m2, torch.float32)],
    ids=str,
)
def test_output_equals_manual_upcast_reference(storage, compute) -> None:
    model = _mlp()
    reference_model = copy.deepcopy(model)
    x = torch.randn(4, 32).to(compute)

    attach_layerwise_casting_hooks(model, storage, compute)
    with torch.no_grad():
        output = model(x)
    expected = _reference_forward(reference_model, x, storage, compute)
    assert output.dtype == compute
    torch.testing.assert_close(output, expected, rtol=0, atol=0)


def test_storage_is_kept_untouched_across_forwards() -> None:
    model = _mlp()
    attach_layerwise_casting_hooks(model, FP8, torch.bfloat16)
    params_before = dict(model.named_parameters())
    bits_before = {name: _bits(p) for name, p in params_before.items()}
    pointers_before = {name: p.data_ptr() for name, p in params_before.items()}
    assert {p.dtype for p in params_before.values()} == {FP8}

    x = torch.randn(2, 32, dtype=torch.bfloat16)
    first = model(x)
    second = model(x)

    params_after = dict(model.named_parameters())
    for name, param in params_after.items():
        assert param is params_before[name], name  # the same Parameter objects, swapped back
        assert param.dtype == FP8
        assert torch.equal(_bits(param), bits_before[name]), name  # no lossy cast-back pass
        assert param.data_ptr() == pointers_before[name], name  # no cast-back, no new storage
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_string_pattern_is_one_regex_not_characters() -> None:
    model = nn.ModuleDict(
        {"norm_proj": nn.Linear(4, 4), "o": nn.Linear(4, 4), "m": nn.Linear(4, 4)}
    )
    attach_layerwise_casting_hooks(
        model, torch.bfloat16, torch.float32, skip_modules_pattern="norm"
    )
    dtypes = {name: layer.weight.dtype for name, layer in model.items()}
    # split into characters, "o" and "m" would be skipped too
    assert dtypes == {"norm_proj": torch.float32, "o": torch.bfloat16, "m": torch.bfloat16}


def test_pattern_tuple_anchors_and_nested_names() -> None:
    model = nn.Sequential()
    model.add_module("proj_in", nn.Linear(4, 4))
    block = nn.Sequential()
    block.add_module("proj_in", nn.Linear(4, 4))
    model.add_module("block", block)
    model.add_module("proj_out", nn.Linear(4, 4))
    attach_layerwise_casting_hooks(
        model, torch.bfloat16, torch.float32, skip_modules_pattern=("^proj_in$", r"^proj_out$")
    )
    assert model.proj_in.weight.dtype == torch.float32
    assert model.proj_out.weight.dtype == torch.float32
    assert (
        model.block.proj_in.weight.dtype == torch.bfloat16
    )  # "block.proj_in" is not anchored-equal
    assert model(torch.ones(1, 4)).dtype == torch.float32


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.norm = nn.LayerNorm(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.inner(x))


class _MyLinear(nn.Linear):
    pass


def test_skip_classes_skip_whole_subtrees_and_norms_stay() -> None:
    model = nn.Sequential(_Block(), _MyLinear(4, 4), nn.Linear(4, 4), nn.LayerNorm(4))
    attach_layerwise_casting_hooks(
        model, torch.bfloat16, torch.float32, skip_modules_classes=(_Block, _MyLinear)
    )
    assert model[0].inner.weight.dtype == torch.float32
    assert model[1].weight.dtype == torch.float32
    assert model[2].weight.dtype == torch.bfloat16
    assert model[3].weight.dtype == torch.float32  # norms are never hooked
    assert not hasattr(model[3], "_hf_hook")
    assert model(torch.ones(2, 4)).dtype == torch.float32


def test_exception_in_forward_restores_storage() -> None:
    layer = nn.Linear(8, 8)
    attach_layerwise_casting_hooks(layer, FP8, torch.bfloat16)
    weight = layer.weight
    with pytest.raises(RuntimeError):
        layer(torch.ones(2, 3, dtype=torch.bfloat16))  # wrong width: functional.linear raises
    assert layer._parameters["weight"] is weight
    assert layer.weight.dtype == FP8
    assert layer._hf_hook._active == []
    assert layer(torch.ones(2, 8, dtype=torch.bfloat16)).shape == (2, 8)  # still usable


def test_gradients_reach_the_stored_parameters() -> None:
    model = _mlp(depth=2)
    reference = copy.deepcopy(model).to(torch.bfloat16).float()
    attach_layerwise_casting_hooks(model, torch.bfloat16, torch.float32)
    x = torch.randn(3, 32)
    model(x).square().sum().backward()
    reference(x).square().sum().backward()
    for (name, param), ref_param in zip(
        model.named_parameters(), reference.parameters(), strict=True
    ):
        assert param.grad is not None and param.grad.dtype == torch.bfloat16, name
        torch.testing.assert_close(param.grad, ref_param.grad.to(torch.bfloat16), rtol=0, atol=0)


class _Counter(nn.Module):
    """A float weight beside an integer buffer; calls itself to test re-entrancy."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((4,), 1.5))
        self.register_buffer("steps", torch.tensor(3, dtype=torch.int64))

    def forward(self, x: torch.Tensor, depth: int = 0) -> torch.Tensor:
        assert self.weight.dtype == torch.float32, "the forward must see the compute dtype"
        if depth:
            x = self(x, depth - 1)
        return x * self.weight + self.steps


def test_manual_hook_reentrant_and_non_floating_untouched() -> None:
    module = _Counter()
    steps = module.steps
    add_hook_to_module(module, LayerwiseCastingHook(torch.bfloat16, torch.float32, False))
    assert module.weight.dtype == torch.bfloat16 and module.steps is steps
    output = module(torch.ones(4), depth=2)
    torch.testing.assert_close(output, torch.full((4,), ((1.5 + 3) * 1.5 + 3) * 1.5 + 3))
    assert module.weight.dtype == torch.bfloat16
    assert module.steps is steps and steps.dtype == torch.int64
    assert module._hf_hook._active == []


def test_appends_to_existing_hook_and_removes_cleanly() -> None:
    seen: list[torch.dtype] = []

    class Spy(ModelHook):
        def pre_forward(self, module, *args, **kwargs):
            seen.append(module.weight.dtype)
            return args, kwargs

    layer = nn.Linear(4, 4)
    spy = Spy()
    add_hook_to_module(layer, spy)
    attach_layerwise_casting_hooks(layer, torch.bfloat16, torch.float32)
    assert isinstance(layer._hf_hook, SequentialHook)
    assert layer._hf_hook.hooks[0] is spy
    assert "LayerwiseCastingHook(storage_dtype=torch.bfloat16" in repr(layer._hf_hook)
    layer(torch.ones(1, 4))
    assert seen == [torch.bfloat16]  # the earlier hook runs first, on the stored weights

    remove_hook_from_module(layer)
    assert not hasattr(layer, "_hf_hook")
    assert "forward" not in layer.__dict__ and "_old_forward" not in layer.__dict__
    assert layer.weight.dtype == torch.bfloat16  # storage stays as it is (as in the reference)


def test_hook_driven_by_hand_swaps_in_pre_and_restores_in_post() -> None:
    layer = nn.Linear(4, 4)
    hook = LayerwiseCastingHook(torch.bfloat16, torch.float32, False)
    hook.init_hook(layer)  # no add_hook_to_module: the caller runs the events itself
    stored = layer.weight
    hook.pre_forward(layer, torch.ones(1, 4))
    assert layer.weight.dtype == torch.float32
    hook.post_forward(layer, layer.forward(torch.ones(1, 4)))
    assert layer._parameters["weight"] is stored
    hook.pre_forward(layer)
    hook.forward_failed(layer, RuntimeError("boom"))
    assert layer._parameters["weight"] is stored


@pytest.mark.parametrize(
    "cast_first", [True, False], ids=["cast_then_offload", "offload_then_cast"]
)
def test_combined_with_cpu_offload_in_either_order(cast_first: bool) -> None:
    model = _mlp(width=16, depth=2)
    x = torch.randn(2, 16)
    exact = copy.deepcopy(model)(x)
    rounded = _reference_forward(copy.deepcopy(model), x, torch.bfloat16, torch.float32)
    if cast_first:
        attach_layerwise_casting_hooks(model, torch.bfloat16, torch.float32)
        cpu_offload(model, execution_device="cpu")
        expected = rounded  # the offloaded copy is already in bf16: storage is saved
    else:
        cpu_offload(model, execution_device="cpu")
        with pytest.warns(UserWarning, match="Attach layerwise casting before offloading"):
            attach_layerwise_casting_hooks(model, torch.bfloat16, torch.float32)
        expected = exact  # the offloaded copy stays fp32: computed exactly, nothing saved
    for _ in range(2):
        torch.testing.assert_close(model(x), expected, rtol=0, atol=0)
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_conv_layers_are_cast() -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3)
    expected = functional.conv2d(
        torch.ones(1, 3, 8, 8),
        conv.weight.detach().to(torch.bfloat16).float(),
        conv.bias.detach().to(torch.bfloat16).float(),
    )
    attach_layerwise_casting_hooks(conv, torch.bfloat16, torch.float32)
    torch.testing.assert_close(conv(torch.ones(1, 3, 8, 8)), expected, rtol=0, atol=0)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(BadInputError, match="storage_dtype must be a floating"):
        attach_layerwise_casting_hooks(nn.Linear(2, 2), torch.int8, torch.float32)
    with pytest.raises(BadInputError, match="compute_dtype must be a floating"):
        LayerwiseCastingHook(torch.bfloat16, "bfloat16", False)
    with pytest.raises(BadInputError, match=r"'\(' is not a valid regular expression"):
        attach_layerwise_casting_hooks(
            nn.Linear(2, 2), FP8, torch.float32, skip_modules_pattern="("
        )
    with pytest.raises(BadInputError, match="fp8_kernel must be one of auto, always, never"):
        attach_layerwise_casting_hooks(nn.Linear(2, 2), FP8, torch.float32, fp8_kernel="fast")
    with pytest.raises(BadInputError, match="not classes: 'norm'"):
        attach_layerwise_casting_hooks(
            nn.Linear(2, 2), FP8, torch.float32, skip_modules_classes=(nn.LayerNorm, "norm")
        )


@pytest.mark.gpu
def test_cuda_fp8_storage_bf16_compute_frees_copies() -> None:
    model = _mlp(width=256, depth=4).cuda()
    reference_model = copy.deepcopy(model)
    attach_layerwise_casting_hooks(model, FP8, torch.bfloat16, non_blocking=True)
    x = torch.randn(8, 256, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    with torch.no_grad():
        model(x)  # warm the caching allocator
        torch.cuda.synchronize()
        before_nbytes = torch.cuda.memory_allocated()
        output = model(x)
        torch.cuda.synchronize()
        after_nbytes = torch.cuda.memory_allocated()
    expected = _reference_forward(reference_model, x, FP8, torch.bfloat16)
    unrounded = _reference_forward(reference_model, x, torch.bfloat16, torch.bfloat16)
    # cuBLAS may pick another reduction order between two calls: allow 2 bf16 ulps. Weights
    # that skipped the fp8 rounding are off by several percent, far outside that.
    tolerance = {"rtol": 2**-7, "atol": 2**-9}
    torch.testing.assert_close(output, expected, **tolerance)
    assert not torch.allclose(output, unrounded, **tolerance)
    assert {p.dtype for p in model.parameters()} == {FP8}
    # only the (8, 256) bf16 output stays alive: 8*256*2 B = 4 KiB (rounded to a 512 B block)
    assert after_nbytes - before_nbytes <= 8 * 256 * 2 + 512


@pytest.mark.gpu
def test_cuda_hook_with_the_triton_upcast_matches_tensor_to() -> None:
    """A 2048x2048 fp8 weight (4M elements) takes the Triton kernel inside the hooked forward."""
    if _fp8_upcast_kernel() is None:
        pytest.skip("Triton is not installed: the hook uses Tensor.to")
    torch.manual_seed(0)
    layers = {choice: nn.Linear(2048, 2048).cuda() for choice in ("always", "never")}
    layers["never"].load_state_dict(layers["always"].state_dict())
    for choice, layer in layers.items():
        attach_layerwise_casting_hooks(layer, FP8, torch.bfloat16, fp8_kernel=choice)
    x = torch.randn(4, 2048, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        fast, slow = layers["always"](x), layers["never"](x)
    assert layers["always"].weight.dtype == FP8
    # the up-casts are bit-identical (see below); the two GEMMs may differ in reduction order
    torch.testing.assert_close(fast, slow, rtol=2**-7, atol=2**-9)


@pytest.mark.gpu
@pytest.mark.parametrize("compute", [torch.bfloat16, torch.float16], ids=str)
def test_cuda_fp8_upcast_kernel_is_bit_exact(compute) -> None:
    if _fp8_upcast_kernel() is None:
        pytest.skip("Triton is not installed: the hook uses Tensor.to")
    every_code = torch.arange(256, dtype=torch.uint8, device="cuda")
    # 1000*37 = 37,000 elements: not a multiple of the block, so the masked tail runs too
    random_codes = torch.randint(0, 256, (1000, 37), dtype=torch.uint8, device="cuda")
    for codes in (every_code, random_codes):
        stored = codes.view(torch.float8_e4m3fn)
        fast = fp8_upcast_triton(stored, compute)
        assert fast is not None, f"the Triton kernel did not run: {triton_failure}"
        slow = stored.to(compute)
        assert fast.dtype == compute and fast.shape == stored.shape
        nan = slow.isnan()
        assert torch.equal(fast.isnan(), nan)
        assert torch.equal(fast.view(torch.int16)[~nan], slow.view(torch.int16)[~nan])
    strided = torch.randn(64, 64, device="cuda").to(torch.float8_e4m3fn).t()  # not contiguous
    assert fp8_upcast_triton(strided, compute) is None
    assert torch.equal(_upcast(strided, compute, False, "always"), strided.to(compute))
    big = torch.randn(2048, 2048, device="cuda").to(torch.float8_e4m3fn)  # 4M: the fast path
    for choice in ("auto", "always", "never"):
        assert torch.equal(_upcast(big, compute, False, choice), big.to(compute)), choice
