"""Hostile drops on the window and its lanes: a message or nothing, never an exception.

Drag data comes from any process (another app can offer our MIME type) and dropped files from
anywhere: deep JSON raised RecursionError and a 5000-digit integer a bare ValueError from
``names_from_mime`` and from the drop handler's config sniffing, inside a Qt event handler.
"""

from __future__ import annotations

import pytest
from PySide6.QtCore import QMimeData
from user_input import drop_file

from workbench.gui import map_io
from workbench.gui.tree_model import MODULES_MIME, names_from_mime

pytestmark = pytest.mark.gui

DEEP = b"[" * 100_000 + b"]" * 100_000
LONG_INT = b"[" + b"9" * 5000 + b"]"


@pytest.mark.parametrize("payload", [DEEP, LONG_INT, b"\xff\xfe", b'["embed", 3, null]'])
def test_foreign_drag_data_is_ignored_by_the_lanes(tiny_window, payload: bytes) -> None:
    mime = QMimeData()
    mime.setData(MODULES_MIME, payload)
    expected = ["embed"] if payload.startswith(b'["embed"') else []
    assert names_from_mime(mime) == expected
    lane = tiny_window.lanes.lane(0)
    assert lane.dropMimeData(mime) is bool(expected)
    assert (tiny_window.session.device_map != {"": "cpu"}) is bool(expected)


@pytest.mark.parametrize("payload", [DEEP, LONG_INT])
def test_a_hostile_json_file_dropped_on_the_window_is_reported(
    tiny_window, tmp_path, payload: bytes
) -> None:
    path = tmp_path / "dropped.json"
    path.write_bytes(payload)
    drop_file(tiny_window, path)  # raised RecursionError / ValueError inside dropEvent
    assert not [d for d in tiny_window.findChildren(map_io.ImportDialog) if d.isVisible()]
    assert len(tiny_window.errors) == 1 and str(path) in tiny_window.errors[0][1]
    assert tiny_window.session.device_map == {"": "cpu"}
