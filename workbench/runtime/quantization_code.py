"""The ``quantization_config`` lines of "Copy as code" / ``--emit-code`` for a precision map:
a ``TorchAoConfig`` over torchao's ``FqnToConfig`` (int8 / int4 / fp8 layers), or a
``BitsAndBytesConfig`` (one NF4/FP4 format for the model), that transformers accepts.
``runtime.map_code.from_pretrained_code(quantization=...)`` puts them in the call.

Example:
    >>> print("\\n".join(quantization_config_code({"m.0": "int8", "m.1": "bf16"})))
    from torchao.quantization import FqnToConfig, Int8WeightOnlyConfig
    from transformers import TorchAoConfig
    quantization_config = TorchAoConfig(
        quant_type=FqnToConfig({
            're:m\\\\.(0)\\\\..*': Int8WeightOnlyConfig(),
        }),
        modules_to_not_convert=['m.1'],
    )
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from workbench.big_modeling.errors import BadInputError
from workbench.big_modeling.quantization.precisions import Precision, parse_precision

_TORCHAO_CLASSES = {"int8": "Int8WeightOnlyConfig", "int4": "Int4WeightOnlyConfig"}


def _torchao_call(precision: Precision) -> str:
    if precision.kind == "int8":
        return "Int8WeightOnlyConfig()"
    if precision.kind == "int4":
        return f"Int4WeightOnlyConfig(group_size={precision.group_size})"
    return "Float8WeightOnlyConfig()"


def quantization_config_code(
    precision_map: Mapping[str, str], keep_high_precision: Sequence[str] = ()
) -> list[str]:
    """Lines defining ``quantization_config`` for ``from_pretrained`` (transformers' classes).

    int8 / int4 / fp8 layers become a ``TorchAoConfig`` over a torchao ``FqnToConfig`` with one
    regex per precision; NF4/FP4 (one format for the whole model only) a ``BitsAndBytesConfig``.
    Layers at a plain dtype and the kept modules go to ``modules_to_not_convert``.

    Raises:
        BadInputError: NF4/FP4 mixed with another quantized format (transformers takes one
            quantization method per model).
    """
    by_precision: dict[Precision, list[str]] = {}
    skipped = list(keep_high_precision)
    for module, name in precision_map.items():
        precision = parse_precision(name)
        if precision.quantized:
            by_precision.setdefault(precision, []).append(module)
        else:
            skipped.append(module)
    kinds = {precision.kind for precision in by_precision}
    if not by_precision:
        return []
    if kinds & {"nf4", "fp4"}:
        if len(by_precision) > 1:
            raise BadInputError(
                "NF4/FP4 load through bitsandbytes, one format per model; the plan mixes "
                f"{', '.join(sorted(p.name for p in by_precision))}. Plan with one 4-bit format"
            )
        (precision,) = by_precision
        return [
            "from transformers import BitsAndBytesConfig",
            "quantization_config = BitsAndBytesConfig(",
            "    load_in_4bit=True,",
            f"    bnb_4bit_quant_type={precision.kind!r},",
            f"    bnb_4bit_use_double_quant={precision.double_quant},",
            f"    llm_int8_skip_modules={sorted(skipped)!r},",
            ")",
        ]
    classes = sorted({_TORCHAO_CLASSES.get(kind, "Float8WeightOnlyConfig") for kind in kinds})
    lines = [
        f"from torchao.quantization import FqnToConfig, {', '.join(classes)}",
        "from transformers import TorchAoConfig",
        "quantization_config = TorchAoConfig(",
        "    quant_type=FqnToConfig({",
    ]
    for precision, modules in sorted(by_precision.items(), key=lambda item: item[0].name):
        lines.append(f"        {_module_regex(modules)!r}: {_torchao_call(precision)},")
    lines += ["    }),", f"    modules_to_not_convert={sorted(skipped)!r},", ")"]
    return lines


def _module_regex(modules: Sequence[str]) -> str:
    """``re:`` pattern FqnToConfig matches against each Linear's name under these modules:
    ``re:model\\.layers\\.(0|1|79)\\..*``, or one alternative per prefix otherwise."""
    numbered = [re.match(r"^(.*)\.(\d+)$", module) for module in modules]
    prefixes = {match.group(1) for match in numbered if match}
    if len(prefixes) == 1 and all(numbered):
        (prefix,) = prefixes
        indices = "|".join(match.group(2) for match in numbered if match)
        return f"re:{re.escape(prefix)}\\.({indices})\\..*"
    return "re:(" + "|".join(re.escape(module) for module in modules) + ")\\..*"
