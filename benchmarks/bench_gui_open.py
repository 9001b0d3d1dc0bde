"""GUI benchmark: open -> tree shown, apply a plan -> repainted, GUI memory with the MoE open.

Sizes: Llama 3.1 405B config (126 layers, ~1.9k modules) and the synthetic MoE of
``benchmarks/synthetic.py`` (48 layers x 512 experts x 3 Linear, ~98k modules).

For each model the script times, in one process:

- the model layer (``open_model`` / ``build_module_tree``: not GUI work, shown for context);
- ours: ``MainWindow.set_opened`` + the first paint of the tree and lanes (lazy
  ``ModuleTreeModel``: no per-row objects);
- baseline: the same tree put into a ``QStandardItemModel`` (one ``QStandardItem`` per cell,
  what a straightforward implementation does) and shown in a ``QTreeView``; ratio printed;
- apply a planner result (one undo macro) and repaint; the planner's own time is shown apart;
- RSS of the process after the MoE is open.

Targets: tree shown < 1 s (405B) and < 3 s (MoE); apply + repaint < 200 ms.

    QT_QPA_PLATFORM=offscreen python benchmarks/bench_gui_open.py [--layers 48 --experts 512]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent))

GIB = 1024**3


def _settle(app: Any, widget: Any) -> None:
    """Process pending events and paint ``widget`` now (what the user would see)."""
    app.processEvents()
    widget.repaint()
    app.processEvents()


def _gui_open(app: Any, window: Any, source: str, opened: Any) -> float:
    start_s = time.perf_counter()
    window.set_opened(source, opened, {"": "cpu"})
    window.tree_panel.view.expandToDepth(0)
    _settle(app, window)
    elapsed_s = time.perf_counter() - start_s
    window.update_speed_prediction(wait=True)  # not timed: it runs off the GUI thread
    return elapsed_s


def _baseline_open(app: Any, tree: Any) -> float:
    from PySide6.QtGui import QStandardItem, QStandardItemModel
    from PySide6.QtWidgets import QTreeView

    from workbench.gui.formatting import format_nbytes, format_param_count

    start_s = time.perf_counter()
    model = QStandardItemModel()
    model.setHorizontalHeaderLabels(["Name", "Class", "Parameters", "Size", "Device", "Flags"])

    def fill(parent_item: Any, node: Any) -> None:
        for child in node.children:
            row = [
                QStandardItem(child.short_name),
                QStandardItem(child.class_name),
                QStandardItem(format_param_count(child.param_count)),
                QStandardItem(format_nbytes(child.nbytes)),
                QStandardItem("cpu"),
                QStandardItem("no-split" if child.no_split else ""),
            ]
            parent_item.appendRow(row)
            fill(row[0], child)

    fill(model.invisibleRootItem(), tree.root)
    view = QTreeView()
    view.setUniformRowHeights(True)
    view.setModel(model)
    view.resize(900, 700)
    view.show()
    view.expandToDepth(0)
    _settle(app, view)
    elapsed_s = time.perf_counter() - start_s
    from PySide6.QtCore import QCoreApplication, QEvent

    view.close()
    view.deleteLater()
    model.deleteLater()
    # free the baseline's items now, not inside the next measurement's event processing
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    app.processEvents()
    return elapsed_s


def _apply_plan(
    app: Any, window: Any, model: Any, budgets: dict, no_split: list[str]
) -> tuple[float, float, int]:
    from workbench.big_modeling.planner import plan_device_map
    from workbench.gui.commands import push_plan

    start_s = time.perf_counter()
    plan = plan_device_map(
        model, max_memory=budgets, strategy="sequential", no_split_module_classes=no_split
    )
    plan_s = time.perf_counter() - start_s
    start_s = time.perf_counter()
    push_plan(
        window.undo_stack, window.session, plan.device_map, strategy="sequential", budgets=budgets
    )
    window.tree_model.set_trace({p.module: p.reason for p in plan.trace})
    _settle(app, window)
    apply_s = time.perf_counter() - start_s
    return plan_s, apply_s, len(plan.device_map)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="GUI open / apply benchmark")
    parser.add_argument("--layers", type=int, default=48, help="MoE layers")
    parser.add_argument("--experts", type=int, default=512, help="experts per MoE layer")
    parser.add_argument("--skip-405b", action="store_true")
    args = parser.parse_args(argv)

    import psutil
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from workbench.gui.app import configure_application
    from workbench.gui.main_window import MainWindow
    from workbench.models.hardware import DeviceSpec, HardwareProfile

    settings_dir = tempfile.mkdtemp(prefix="workbench-bench-")
    os.environ["XDG_DATA_HOME"] = os.environ["XDG_CONFIG_HOME"] = settings_dir
    app = QApplication.instance() or QApplication(sys.argv)
    configure_application(app)
    QSettings.setPath(QSettings.Format.IniFormat, QSettings.Scope.UserScope, settings_dir)
    profile = HardwareProfile(
        name="bench-2x80g",
        description="2 x 80 GiB GPUs, 512 GiB RAM, NVMe",
        devices=(
            DeviceSpec(0, "GPU 0", 80 * GIB, None, 400.0, 2000.0),
            DeviceSpec(1, "GPU 1", 80 * GIB, None, 400.0, 2000.0),
            DeviceSpec("cpu", "RAM", 512 * GIB, None, 2.0, 100.0),
            DeviceSpec("disk", "NVMe", 8192 * GIB, None, 0.0, 0.0),
        ),
    )
    window = MainWindow(profiles=[profile], autosave=False)
    window.resize(1600, 1000)
    window.show()
    app.processEvents()
    rows = []

    if not args.skip_405b:
        from workbench.models import open_model

        start_s = time.perf_counter()
        opened = open_model("llama-3.1-405b")
        model_s = time.perf_counter() - start_s
        gui_s = _gui_open(app, window, "llama-3.1-405b", opened)
        base_s = _baseline_open(app, opened.tree)
        budgets = {0: 80 * GIB, 1: 80 * GIB, "cpu": 512 * GIB, "disk": 8192 * GIB}
        plan_s, apply_s, entries = _apply_plan(
            app, window, opened.model, budgets, opened.no_split_modules
        )
        rows.append(
            ("llama-3.1-405b", len(opened.tree), model_s, gui_s, base_s, plan_s, apply_s, entries)
        )

    from synthetic import build_moe

    from workbench.models.tree import build_module_tree

    rss_before = psutil.Process().memory_info().rss
    start_s = time.perf_counter()
    moe = build_moe(num_layers=args.layers, num_experts=args.experts)
    tree = build_module_tree(moe, no_split_classes=["Expert"])
    model_s = time.perf_counter() - start_s
    opened = SimpleNamespace(
        source="synthetic-moe",
        tree=tree,
        model=moe,
        config=None,
        checkpoint=None,
        no_split_modules=["Expert"],
        tied_groups=tree.tied_groups,
        planning_dtype=None,
        model_class="SyntheticMoE",
        folder=None,
    )
    gui_s = _gui_open(app, window, "synthetic-moe", opened)
    rss_open = psutil.Process().memory_info().rss
    base_s = _baseline_open(app, tree)
    total = tree.root.nbytes
    budgets = {0: total // 3, 1: total // 3, "cpu": total // 4, "disk": total}
    plan_s, apply_s, entries = _apply_plan(app, window, moe, budgets, ["Expert"])
    rows.append(
        (
            f"moe {args.layers}x{args.experts}",
            len(tree),
            model_s,
            gui_s,
            base_s,
            plan_s,
            apply_s,
            entries,
        )
    )

    speed_start_s = time.perf_counter()
    window.update_speed_prediction(wait=True)
    speed_s = time.perf_counter() - speed_start_s

    print(
        f"{'model':<18} {'modules':>8} {'model s':>8} {'ours s':>8} {'baseline s':>10} {'ratio':>6} {'plan s':>7} {'apply+paint ms':>14} {'entries':>8}"
    )
    for name, modules, model_s, gui_s, base_s, plan_s, apply_s, entries in rows:
        print(
            f"{name:<18} {modules:>8,} {model_s:>8.2f} {gui_s:>8.3f} {base_s:>10.3f} "
            f"{base_s / gui_s:>5.1f}x {plan_s:>7.2f} {apply_s * 1000:>14.1f} {entries:>8,}"
        )
    print(
        f"GUI process RSS with the MoE open: {rss_open / 2**20:.0f} MiB ({(rss_open - rss_before) / 2**20:.0f} MiB for model + tree + window)"
    )
    print(f"speed prediction on the MoE map: {speed_s * 1000:.0f} ms (worker thread, debounced)")
    print("targets: tree shown < 1 s (405B), < 3 s (MoE); apply + repaint < 200 ms")
    window.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
