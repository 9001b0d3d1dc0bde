"""Checkpoints stored quantized (GPTQ / AWQ / compressed-tensors / bitsandbytes), planned at
the bytes their headers give, with their ``quantization_config``: what ``workbench plan`` does
for such a folder. No widgets here.

Example:
    >>> stored = prequantized(open_model("path/to/gptq-folder"))  # doctest: +SKIP
    >>> stored.config.summary()  # doctest: +SKIP
    'gptq 4-bit, group 128'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from workbench.big_modeling.planning.planner import PlanResult, plan_device_map
from workbench.big_modeling.quantization.prequantized import (
    PrequantizedConfig,
    read_quantization_config,
    stored_tensor_nbytes,
)
from workbench.models.hardware import HardwareProfile
from workbench.models.intake import read_config
from workbench.models.speed import SpeedPrediction
from workbench.models.tree import ModuleTree, build_module_tree
from workbench.runtime.machine_attention import predict_with_attention

if TYPE_CHECKING:
    from workbench.models.intake import OpenedModel


@dataclass(frozen=True)
class Prequantized:
    """A checkpoint stored quantized: its config and a module tree at the stored bytes.

    Attributes:
        config: what its ``quantization_config`` says.
        tree: the model's tree with each tensor at its stored bytes (packed parts counted into
            their module's ``weight``), for planning and the speed model.
        orphans: stored tensors under no module with a weight (sorted).
    """

    config: PrequantizedConfig
    tree: ModuleTree
    orphans: tuple[str, ...] = ()

    def module_sizes(self) -> dict[str, int]:
        """Bytes per module, for ``plan_opened_model(..., module_sizes=)``."""
        return self.tree.module_sizes()


def prequantized(opened: OpenedModel) -> Prequantized | None:
    """The stored sizes of a pre-quantized checkpoint (GPTQ / AWQ / compressed-tensors /
    bitsandbytes), or ``None`` for a plain one or a config without weights.

    Raises:
        BadInputError: a ``quantization_config`` this planner cannot size (named).
    """
    if opened.config_path is None:
        return None
    config = read_quantization_config(read_config(opened.config_path), str(opened.config_path))
    if config is None or opened.checkpoint is None:
        return None
    stored = {name: info.nbytes for name, info in opened.checkpoint.tensors.items()}
    sizes, orphans = stored_tensor_nbytes(stored, opened.model)
    tree = build_module_tree(
        opened.model, stored_nbytes=sizes, no_split_classes=opened.no_split_modules
    )
    return Prequantized(config, tree, tuple(orphans))


@dataclass(frozen=True)
class PrequantizedPlanning:
    """A plan of a pre-quantized checkpoint at its stored sizes.

    Attributes:
        stored: the checkpoint's config and stored-size tree.
        plan: the reference planner's ``PlanResult`` for those sizes.
        prediction: the speed model's prediction on the stored sizes.
    """

    stored: Prequantized
    plan: PlanResult
    prediction: SpeedPrediction


def plan_prequantized(
    opened: OpenedModel,
    stored: Prequantized,
    *,
    max_memory: Mapping[int | str, int],
    profile: HardwareProfile,
    strategy: str = "auto",
    reserve: Mapping[int | str, int] | None = None,
    prefetch: bool = True,
    prompt_tokens: int = 128,
) -> PrequantizedPlanning:
    """Plan ``opened`` (pre-quantized) with the bytes its files store, predict its speed.

    Raises:
        BadInputError, MemoryBudgetError: as ``plan_device_map``.
    """
    plan = plan_device_map(
        opened.model,
        max_memory=dict(max_memory),
        strategy=strategy,  # type: ignore[arg-type]
        no_split_module_classes=opened.no_split_modules,
        reserve=dict(reserve) if reserve else None,
        module_sizes=stored.module_sizes(),
    )
    prediction = predict_with_attention(
        opened,
        stored.tree,
        plan.device_map,
        profile,
        prefetch=prefetch,
        prompt_tokens=prompt_tokens,
    )
    return PrequantizedPlanning(stored, plan, prediction)


def prequantized_section(stored: Prequantized) -> dict[str, Any]:
    """The ``quantization`` part of ``--json`` for a pre-quantized checkpoint."""
    return {
        "prequantized": stored.config.summary(),
        "method": stored.config.method,
        "bits": stored.config.bits,
        "group_size": stored.config.group_size,
        "not_converted": list(stored.config.not_converted),
        "quantization_config": stored.config.raw,
        "stored_nbytes": stored.tree.root.nbytes,
        "orphans": list(stored.orphans),
    }
