"""Size accounting: bytes per module, dtype sizes, memory strings and the memory on each device.

Everything here except ``get_max_memory`` is a pure function of shapes and dtypes, so it runs on
models built under ``init_empty_weights``. ``get_max_memory`` is the one function in the engine
that looks at real hardware.
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from workbench.big_modeling.devices import Device, DeviceValue, device_sort_key, normalize_device
from workbench.big_modeling.errors import BadInputError, MemoryBudgetError
from workbench.big_modeling.planning.dtype_sizes import as_dtype, dtype_byte_size
from workbench.big_modeling.planning.module_index import ModuleIndex

__all__ = [
    "MAX_SIZE_NBYTES",
    "SizeUnitWarning",
    "compute_module_sizes",
    "compute_module_total_buffer_size",
    "convert_file_size_to_int",
    "dtype_byte_size",
    "find_tied_parameters",
    "format_nbytes",
    "format_param_count",
    "get_max_layer_size",
    "get_max_memory",
]

logger = logging.getLogger(__name__)

DType = torch.dtype | str

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
# ASCII digits only (\d would take "\u0661"). A 400-digit number reads as float inf, which
# _checked_nbytes refuses by name (it was an OverflowError from int(inf)).
_SIZE_TEXT = re.compile(
    r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-z]*)\s*$", re.IGNORECASE | re.ASCII
)
MAX_SIZE_NBYTES = 2**60  # 1 EiB: far above any device, far below int64 and float precision
_warned_lower_b = False


class SizeUnitWarning(UserWarning):
    """A size unit that means something else in the reference (``"10gb"`` is bits there)."""


def _size_error(size: object, problem: str) -> BadInputError:
    shown = (
        repr(size) if len(repr(size)) <= 40 else f"{repr(size)[:30]}... ({len(repr(size))} chars)"
    )
    return BadInputError(
        f"{shown} is not a memory size: {problem}. Use bytes (an int) or a number with a unit: "
        "KB/MB/GB/TB (powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024), e.g. '24GiB', '1.5 GB'"
    )


def _checked_nbytes(size: object, nbytes: float) -> int:
    if math.isnan(nbytes):
        raise _size_error(size, "not a number (NaN)")
    if nbytes < 0:
        raise _size_error(size, "negative; use 0 or more bytes")
    if nbytes > MAX_SIZE_NBYTES:  # inf included
        raise _size_error(size, "above the limit of 1 EiB (2**60 bytes)")
    return int(nbytes)


def _warn_lower_case_bits(size: str, unit: str) -> None:
    global _warned_lower_b
    if _warned_lower_b or len(unit) != 2 or unit[-1] != "b" or unit[0].lower() not in "kmgt":
        return
    _warned_lower_b = True
    prefix = unit[0].upper()
    warnings.warn(
        f"memory size {size!r} is read as {prefix}B (bytes); in Accelerate a lower-case 'b' "
        f"means bits, 8 times less. Write '{prefix}B' or '{prefix}iB' to mean the same in both. "
        "(Shown once.)",
        SizeUnitWarning,
        stacklevel=3,
    )


def convert_file_size_to_int(size: int | str) -> int:
    """Convert a memory size to bytes.

    Accepts ints (bytes) and strings with a decimal unit (``KB``, ``MB``, ``GB``, ``TB``: powers
    of 1000) or a binary one (``KiB``, ``MiB``, ``GiB``, ``TiB``: powers of 1024), in any case,
    with optional spaces and decimals: ``"1.5 GB"`` is 1,500,000,000.

    The one size parser of the project: the CLI, the GUI, hardware profiles and the API all
    use it. A lower-case ``b`` after a decimal prefix (``"10gb"``) is read as bytes, as upper
    case is, but it means *bits* in Accelerate, so the first one warns (``SizeUnitWarning``).

    Raises:
        BadInputError: for negative, NaN, infinite or absurd sizes (above 1 EiB), booleans, or
            text such as ``"ten gigs"``; the message names the value and the problem.

    Example:
        >>> convert_file_size_to_int("1.5 GiB"), convert_file_size_to_int("500MB")
        (1610612736, 500000000)
    """
    if isinstance(size, bool):
        raise _size_error(size, "a boolean")
    if isinstance(size, int):
        return _checked_nbytes(size, size if abs(size) <= 2**62 else math.inf * (size > 0 or -1))
    if isinstance(size, float):
        return _checked_nbytes(size, size)
    if isinstance(size, str):
        match = _SIZE_TEXT.match(size)
        if match and match.group(2).lower() in _UNITS:
            unit = match.group(2)
            _warn_lower_case_bits(size, unit)
            return _checked_nbytes(size, float(match.group(1)) * _UNITS[unit.lower()])
        if size.strip().startswith("-"):
            raise _size_error(size, "negative; use 0 or more bytes")
        raise _size_error(size, "not a number with a known unit")
    raise _size_error(size, f"a {type(size).__name__}")


def compute_module_sizes(
    model: nn.Module,
    dtype: DType | None = None,
    special_dtypes: Mapping[str, DType] | None = None,
    buffers_only: bool = False,
) -> dict[str, int]:
    """Bytes of every module and tensor of ``model``, once its weights are loaded.

    One pass over the tree. Keys are every module name, every parameter and buffer name, and
    ``""`` for the whole model. A tied parameter is counted once, under the name met first.

    Args:
        model: the model (its weights may be on ``meta``).
        dtype: the dtype floating weights will be loaded in; integer and bool tensors keep
            their own size.
        special_dtypes: per-tensor dtypes that override ``dtype`` (e.g. ``{"lm_head.weight":
            torch.float32}``).
        buffers_only: count buffers only (keys: ``""``, the modules holding buffers, and the
            buffers), as the reference does.

    Returns:
        ``{name: nbytes}``.

    Example:
        >>> compute_module_sizes(nn.Linear(4, 2))  # 2*4*4 B + 2*4 B
        {'': 40, 'weight': 32, 'bias': 8}
    """
    if buffers_only:
        sizes: dict[str, int] = {"": 0}
        for name, nbytes in _buffer_nbytes(model, dtype, special_dtypes):
            parts = name.split(".")
            for depth in range(len(parts) + 1):
                prefix = ".".join(parts[:depth])
                sizes[prefix] = sizes.get(prefix, 0) + nbytes
        return sizes
    return ModuleIndex.build(model, dtype=dtype, special_dtypes=special_dtypes).all_sizes()


def compute_module_total_buffer_size(
    model: nn.Module,
    dtype: DType | None = None,
    special_dtypes: Mapping[str, DType] | None = None,
) -> int:
    """Total bytes of every buffer in ``model`` (all depths), under ``dtype`` as above.

    Example:
        >>> compute_module_total_buffer_size(nn.BatchNorm1d(3))  # 2 * 3 * 4 B + 8 B (int64)
        32
    """
    return sum(nbytes for _, nbytes in _buffer_nbytes(model, dtype, special_dtypes))


def _buffer_nbytes(
    model: nn.Module, dtype: DType | None, special_dtypes: Mapping[str, DType] | None
) -> list[tuple[str, int]]:
    """``(name, nbytes)`` of every buffer of ``model`` under ``dtype``/``special_dtypes``."""
    dtype_nbytes = dtype_byte_size(as_dtype(dtype)) if dtype is not None else None
    special = {name: as_dtype(value) for name, value in (special_dtypes or {}).items()}
    entries = []
    for name, buffer in model.named_buffers():
        if name in special:
            itemsize = dtype_byte_size(special[name])
        elif dtype_nbytes is not None and buffer.is_floating_point():
            itemsize = dtype_nbytes
        else:
            itemsize = dtype_byte_size(buffer.dtype)
        entries.append((name, int(buffer.numel() * itemsize)))
    return entries


def get_max_layer_size(
    modules: list[tuple[str, nn.Module]],
    module_sizes: Mapping[str, int],
    no_split_module_classes: list[str] | None,
) -> tuple[int, list[str]]:
    """The largest *layer* among ``modules``, and the names of every layer of that size.

    A layer is a module without child modules, or one whose class is in
    ``no_split_module_classes`` (it is not looked into). Linear in the number of modules walked.

    Returns:
        ``(max_nbytes, names)``.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        >>> get_max_layer_size(list(model.named_children()), compute_module_sizes(model), [])
        (80, ['0'])
    """
    no_split = set(no_split_module_classes or ())
    max_nbytes, names = 0, []
    stack = list(reversed(modules))
    while stack:
        name, module = stack.pop()
        children = list(module.named_children()) if isinstance(module, nn.Module) else []
        if not children or type(module).__name__ in no_split:
            nbytes = module_sizes.get(name, 0)
            if nbytes > max_nbytes:
                max_nbytes, names = nbytes, [name]
            elif nbytes == max_nbytes:
                names.append(name)
        else:
            stack.extend((f"{name}.{child}", sub) for child, sub in reversed(children))
    return max_nbytes, names


def find_tied_parameters(model: nn.Module, **kwargs: Any) -> list[list[str]]:
    """Groups of parameter names that share one ``Parameter`` object (tied weights).

    ``kwargs`` are accepted and ignored, as in the reference (its old recursive signature).

    Returns:
        A sorted list of sorted name lists, only groups of two names or more.

    Example:
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        >>> model[1].weight = model[0].weight
        >>> find_tied_parameters(model)
        [['0.weight', '1.weight']]
    """
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return sorted(sorted(names) for names in groups.values() if len(names) > 1)


def format_nbytes(nbytes: int | float) -> str:
    """Bytes in binary units, three significant digits, unit always shown.

    The one byte formatter of the project: engine messages, CLI and GUI all use it.

    Example:
        >>> format_nbytes(1717986918), format_nbytes(512), format_nbytes(-3 * 2**40)
        ('1.6 GiB', '512 B', '-3 TiB')
    """
    value = float(nbytes)
    sign = "-" if value < 0 else ""
    value = abs(value)
    for unit in _BYTE_UNITS:
        if value < 1024 or unit == _BYTE_UNITS[-1]:
            break
        value /= 1024
    if unit == "B":
        return f"{sign}{int(value)} B"
    return f"{sign}{value:.3g} {unit}" if value < 100 else f"{sign}{value:.0f} {unit}"


def format_param_count(count: int) -> str:
    """A parameter count in T/B/M/K, three significant digits: ``"70.6B"``, ``"12.3M"``, ``"512"``.

    Example:
        >>> format_param_count(70_553_706_496), format_param_count(512)
        ('70.6B', '512')
    """
    for threshold, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if count >= threshold:
            return f"{count / threshold:.3g}{suffix}"
    return str(int(count))


def get_max_memory(
    max_memory: Mapping[DeviceValue, int | str] | None = None,
) -> dict[Device, int]:
    """Bytes usable on each device, in planning order (GPUs by index, mps, cpu, disk).

    With ``max_memory`` given, only converts and orders it — the devices need not exist, which
    is what makes what-if planning work (``{0: "24GiB", 1: "24GiB", "cpu": "64GiB"}`` on a
    machine with no GPU). The caller's dict is never modified. With ``None``, detects what is
    free now: ``torch.cuda.mem_get_info`` per visible GPU and ``psutil`` available RAM for
    ``"cpu"``. This is the only function of the engine that touches hardware.

    Raises:
        BadInputError: for a key that is not a device or a value that is not a size (all
            offenders listed, sorted).

    Example:
        >>> get_max_memory({"cpu": "1GiB", "cuda:1": 100, 0: "1KB"})
        {0: 1000, 1: 100, 'cpu': 1073741824}
    """
    if max_memory is None:
        return _detect_free_memory()
    converted: dict[Device, int] = {}
    problems: list[str] = []
    for key, value in max_memory.items():
        try:
            device = normalize_device(key)
        except BadInputError as error:
            problems.append(f"key {key!r}: {error}")
            continue
        try:
            converted[device] = convert_file_size_to_int(value)
        except BadInputError as error:
            problems.append(f"{key!r}: {error}")
    if problems:
        raise MemoryBudgetError(
            f"max_memory has {len(problems)} bad entries: " + "; ".join(sorted(problems))
        )
    return {device: converted[device] for device in sorted(converted, key=device_sort_key)}


def _detect_free_memory() -> dict[Device, int]:
    import psutil  # noqa: PLC0415 (psutil is only needed when detecting free memory)

    detected: dict[Device, int] = {}
    if torch.cuda.is_available():
        for device_index in range(torch.cuda.device_count()):
            try:
                free_nbytes, _ = torch.cuda.mem_get_info(device_index)
            except RuntimeError as error:  # a GPU taken by another process, or broken
                logger.info("cuda:%d is not usable (%s); skipping it", device_index, error)
                continue
            detected[device_index] = int(free_nbytes)
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        detected["mps"] = int(psutil.virtual_memory().available)
    else:
        detected["cpu"] = int(psutil.virtual_memory().available)
    return detected
