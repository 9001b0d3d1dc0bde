"""What the Inference tab shows about a run, as text: the per-layer table, the verify verdict,
the figures beside their predictions, the log line of each run.

Plain functions over ``workbench.runtime.protocol`` results and ``RunRecord``; the panel
(``inference_panel``) puts them on screen.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QTableWidget, QTableWidgetItem

from workbench.gui.colors import FAIL_HEX, PASS_HEX
from workbench.runtime.formatting import (
    format_bandwidth,
    format_forward,
    format_nbytes,
    format_rate,
    format_seconds,
    paged_in_words,
)
from workbench.runtime.protocol import InferenceResult, LayerTiming, VerifyResult
from workbench.runtime.run_records import RunRecord
from workbench.wording import plural

LAYER_HEADERS = ("layer", "module", "from", "size", "transfer ms", "compute ms", "rate")
LAYER_HEADER_TIPS = (
    "Position of the layer in the forward pass",
    "The module (one layer, its submodules folded in)",
    "Where the layer's weights came from: resident (already on the execution device), "
    "or the device they were copied from (cpu, disk)",
    "Weight bytes copied to the execution device, in binary units (1 KiB = 2^10 bytes, "
    "1 MiB = 2^20 bytes)",
    "Time spent copying the weights to the execution device, in milliseconds",
    "Time of the layer's own computation, in milliseconds",
    "Copy throughput in decimal units (1 GB/s = 10^9 bytes per second, 1 MB/s = 10^6): "
    "bytes copied / transfer time",
)


STOP_REASONS = {
    "eos": "the end-of-turn token",
    "max_new_tokens": "the max new tokens",
    "forward": "one forward (no generation)",
}


def hardware_words(predicted_for: str) -> str:
    """ " on this machine" for the detected hardware, " on NAME" for a profile, "" unknown."""
    if not predicted_for:
        return ""
    return " on this machine" if predicted_for == "detected" else f" on {predicted_for}"


def printable(text: str) -> bool:
    """True when ``text`` shows something: a character that is neither space nor control."""
    return any(c.isprintable() and not c.isspace() for c in text)


def layer_dict(timing: Any) -> dict[str, Any]:
    """One per-layer row as plain data for the run history."""
    return {
        "module": timing.module,
        "source": timing.source,
        "nbytes": timing.nbytes,
        "transfer_s": timing.transfer_s,
        "compute_s": timing.compute_s,
    }


def is_random_demo(source: str) -> bool:
    """True for a demo folder (random weights): ``--demo`` and the tests name theirs
    ``demo-<arch>...``; ``make-demo DIR`` folders of other names get the general wording."""
    name = source.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    return name.startswith("demo-")


def outcome(record: RunRecord, reason: str = "") -> str:
    """One log line for a finished, stopped or failed run."""
    head = f"{record.kind} run {record.run_id} (map {record.map_id})"
    if record.verify is not None and record.status == "done":
        verdict = "PASS" if record.verify["passed"] else "FAIL"
        return (
            f"{head}: {verdict}, max abs diff {record.verify['max_abs_diff']:.3g}, "
            f"max rel diff {record.verify['max_rel_diff']:.3g}"
        )
    figures = ""
    if record.kind == "infer" and record.one_forward:
        figures = format_forward(record.ttft_s or 0.0)
        if "forward_s" in record.predicted:
            where = hardware_words(record.predicted_for)
            figures += f" (predicted {format_seconds(record.predicted['forward_s'])}{where})"
    elif record.kind == "infer":
        rate = "— tok/s" if record.tokens_per_s is None else format_rate(record.tokens_per_s)
        ttft = "—" if record.ttft_s is None else format_seconds(record.ttft_s)
        figures = f"{plural(record.new_tokens, 'token')}, {rate}, TTFT {ttft}"
    if record.status == "done":
        return f"{head}: {figures}"
    why = f": {reason}" if reason else ""
    return f"{head} {record.status}{why}" + (f"; {figures}" if figures else "")


def make_layer_table(parent: Any, row_height: int) -> QTableWidget:
    """An empty read-only per-layer table with ``LAYER_HEADERS`` and their tooltips."""
    table = QTableWidget(0, len(LAYER_HEADERS), parent)
    table.setHorizontalHeaderLabels(list(LAYER_HEADERS))
    for column, tip in enumerate(LAYER_HEADER_TIPS):
        table.horizontalHeaderItem(column).setToolTip(tip)
    table.verticalHeader().setVisible(False)
    table.verticalHeader().setDefaultSectionSize(row_height)
    table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    return table


def no_text_note(new_tokens: int, text: str, source: str) -> str:
    """Why a run that generated tokens shows no text ("" when it shows some, or made none).

    Example:
        >>> no_text_note(16, " ", "/cache/demo-llama-60m")
        '16 tokens, no printable text: the demo model has random weights'
    """
    if not new_tokens or printable(text):
        return ""
    head = f"{plural(new_tokens, 'token')}, no printable text"
    if is_random_demo(source):
        return f"{head}: the demo model has random weights"
    return f"{head}: the tokens decode to spaces, control or special characters"


def figures_with_predictions(value: InferenceResult) -> tuple[str, str, str]:
    """The TTFT and decode-speed texts, each with the speed model's prediction beside it and
    the hardware it is for, and their shared tooltip."""
    where = hardware_words(value.predicted_for)
    paged = paged_in_words(value.paged_in_bytes, one_forward=value.one_forward)
    if value.one_forward:  # nothing generated: the forward's time is the figure
        forward = format_seconds(value.ttft_s)
        if value.prompt_tokens:
            forward += f", one forward over {plural(value.prompt_tokens, 'token')}"
        if "forward_s" in value.predicted:
            forward += f" (predicted {format_seconds(value.predicted['forward_s'])}{where})"
        tip = (
            "The model generates no tokens: its test is one forward over the input, timed "
            "beside the speed model's prediction for that forward"
        )
        forward, tip = _with_paged_in(forward, tip, value.paged_in_bytes, paged)
        return forward, "— (the model generates no tokens)", tip
    predicted_ttft = value.predicted.get("ttft_s")
    predicted_rate = value.predicted.get("tokens_per_s")
    ttft = format_seconds(value.ttft_s)
    if predicted_ttft is not None:
        ttft += f" (predicted {format_seconds(predicted_ttft)}{where})"
    rate = format_rate(value.tokens_per_s)
    if predicted_rate is not None:
        rate += f" (predicted {format_rate(predicted_rate)}{where})"
    tip = (
        "The speed model's prediction for the loaded map on "
        f"{where.removeprefix(' on ') or 'the selected hardware'}, beside the measured figure"
    )
    ttft, tip = _with_paged_in(ttft, tip, value.paged_in_bytes, paged)
    return ttft, rate, tip


def _with_paged_in(figure: str, tip: str, nbytes: int, words: str) -> tuple[str, str]:
    """``figure`` and ``tip`` with what the run paged in (``words``: ``paged_in_words``: pages
    of the model's files the kernel reclaimed since the load paged them in, or disk-offloaded
    weights read through their files), unchanged without."""
    if not words:
        return figure, tip
    return (
        f"{figure} · paged in {format_nbytes(nbytes)}",
        f"{tip}. {words[0].upper()}{words[1:]}: pages the kernel reclaimed since the load "
        "paged them in, or weights offloaded to disk",
    )


def fill_layer_table(
    table: QTableWidget, per_layer: tuple[LayerTiming, ...] | list[LayerTiming]
) -> None:
    """Fill ``table`` (columns ``LAYER_HEADERS``) with one forward's figures."""
    table.setRowCount(len(per_layer))
    for row, timing in enumerate(per_layer):
        cells = (
            str(row),
            timing.module,
            timing.source or "resident",
            format_nbytes(timing.nbytes) if timing.nbytes else "",
            f"{timing.transfer_s * 1e3:.2f}",
            f"{timing.compute_s * 1e3:.2f}",
            format_bandwidth(timing.nbytes / timing.transfer_s)
            if timing.nbytes and timing.transfer_s > 0
            else "",
        )
        for column, text in enumerate(cells):
            item = QTableWidgetItem(text)
            if column not in (1, 2):
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            table.setItem(row, column, item)
    table.resizeColumnsToContents()


def verify_record(value: VerifyResult) -> dict[str, Any]:
    """What the run history keeps of a verify: the logits' verdict and the greedy tokens."""
    record: dict[str, Any] = {
        "passed": value.passed,
        "max_abs_diff": value.max_abs_diff,
        "max_rel_diff": value.max_rel_diff,
        "exact": value.exact,
        "reference": value.reference,
    }
    if value.greedy_compared:
        record |= {
            "greedy_compared": value.greedy_compared,
            "greedy_matched": value.greedy_matched,
            "greedy_text": value.greedy_text,
            "greedy_reference_text": value.greedy_reference_text,
        }
    return record


def verify_summary(value: VerifyResult) -> tuple[str, str]:
    """The verify label's rich text (PASS/FAIL, differences, greedy tokens) and its tooltip
    (the reference, both greedy continuations)."""
    verdict = "PASS" if value.passed else "FAIL"
    color = PASS_HEX if value.passed else FAIL_HEX
    exact = " (bitwise identical)" if value.exact else ""
    greedy = tip = ""
    if value.greedy_compared:
        same = "identical" if value.greedy_identical else f"<b style='color:{FAIL_HEX}'>differ</b>"
        greedy = f" · greedy {value.greedy_matched}/{value.greedy_compared} tokens {same}"
        tip = (
            f"\n\ngreedy continuation, dispatched: {value.greedy_text!r}"
            f"\ngreedy continuation, reference: {value.greedy_reference_text!r}"
        )
    if value.top1_positions and not value.exact:  # a quantized load: agreement, not equality
        percent = 100 * value.top1_agreed // value.top1_positions  # floor: never a false 100%
        text = (
            f"<b style='color:{color}'>{verdict}</b> top-1 agreement {percent}% "
            f"({value.top1_agreed}/{value.top1_positions}) · max |dlogit| "
            f"{value.max_abs_diff:.2g} · mean {value.mean_abs_diff:.2g}{greedy}"
        )
        return text, f"reference: {value.reference}{tip}"
    text = (
        f"<b style='color:{color}'>{verdict}</b> max |abs| {value.max_abs_diff:.3g} · "
        f"max rel {value.max_rel_diff:.3g}{exact}{greedy}"
    )
    return text, f"reference: {value.reference}{tip}"
