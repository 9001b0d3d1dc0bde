"""What a path is: sessions, wrapped and plain maps, model configs and folders, junk."""

from __future__ import annotations

import json

from workbench.big_modeling.device_map.files import save_device_map
from workbench.runtime.documents import Document, classify_document
from workbench.runtime.session import Session


def test_a_saved_session_is_a_session_and_its_format_comes_first(tmp_path):
    path = Session(source="/models/x", device_map={"": "cpu"}).save(tmp_path / "s.json")
    assert classify_document(path).kind == "session"
    assert path.read_text(encoding="utf-8").startswith('{\n  "format": "workbench-session"')


def test_maps_plain_and_wrapped(tmp_path):
    plain = tmp_path / "plain.json"
    save_device_map(plain, {"model.layers.0": 0, "lm_head": "disk"})
    wrapped = tmp_path / "wrapped.json"
    save_device_map(wrapped, {"": "cpu"}, source="/models/demo", param_count=10)
    assert classify_document(plain) == Document("map", str(plain), None)
    document = classify_document(wrapped)
    assert (document.kind, document.model_source) == ("map", "/models/demo")


def test_models_configs_folders_names_and_junk(tmp_path):
    config = tmp_path / "renamed.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    junk = tmp_path / "junk.json"
    junk.write_text("{not json")
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"a": "gpu0"}))  # not devices: not a map
    for path in (config, tmp_path, tmp_path / "config.json", junk, odd, "llama-3.1-70b"):
        assert classify_document(path).kind == "model", path
    assert classify_document("hf-cache:org/repo").kind == "model"
