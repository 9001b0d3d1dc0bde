"""``workbench fit MODEL``: the what-fits-where table as text and as JSON (issue 21)."""

from __future__ import annotations

import json

STATUSES = {"full GPU", "partial offload", "CPU only", "does not fit"}


def test_fit_json_has_a_cell_per_profile_and_context(cli) -> None:
    code, out, err = cli(
        "fit", "llama-3.1-8b", "--json", "--context", "4096", "131072",
        "--profile", "h200-141gb", "cpu-laptop-16gb",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["source"] == "llama-3.1-8b" and data["contexts"] == [4096, 131072]
    assert [p["name"] for p in data["profiles"]] == ["h200-141gb", "cpu-laptop-16gb"]
    assert [(c["profile"], c["context"]) for c in data["cells"]] == [
        ("h200-141gb", 4096),
        ("h200-141gb", 131072),
        ("cpu-laptop-16gb", 4096),
        ("cpu-laptop-16gb", 131072),
    ]
    for cell in data["cells"]:
        assert cell["status"] in STATUSES and cell["layer_count"] in (0, 32)
        assert set(cell) >= {"label", "gpu_layers", "tokens_per_s", "ttft_s", "device_map"}
    h200_4k, _, laptop_4k, laptop_128k = data["cells"]
    assert h200_4k["status"] == "full GPU" and set(h200_4k["device_map"].values()) == {0}
    assert h200_4k["tokens_per_s"] > laptop_4k["tokens_per_s"] > 0
    assert laptop_4k["status"] == "CPU only"
    # 16 GiB of KV cache at 128k (32 x 131072 x 8 x 256 x 2 B) fills the laptop's RAM
    assert laptop_128k["status"] == "does not fit" and laptop_128k["tokens_per_s"] is None
    assert "its 16 GiB budget" in laptop_128k["problem"]


def test_fit_text_lists_each_profile_with_its_budgets(cli) -> None:
    code, out, err = cli("fit", "llama-3.1-8b", "--context", "4096", "--profile", "rtx4090-64gb")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "fit        llama-3.1-8b: 1 profile x contexts 4k"
    assert lines[1].startswith("rtx4090-64gb") and "1004 MiB margin" in lines[1]
    assert lines[2].split()[:3] == ["4k", "full", "GPU"] and "tok/s · TTFT" in lines[2]


def test_fit_refuses_a_context_below_one_token(cli) -> None:
    code, _, err = cli("fit", "llama-3.1-8b", "--context", "0")
    assert code == 2 and "--context must be at least 1 token, got 0" in err


def test_fit_prefill_chunks_change_the_cells_and_the_title(cli) -> None:
    args = ("fit", "llama-3.1-8b", "--context", "131072", "--profile", "rtx4090-64gb")
    code, whole, err = cli(*args)
    assert code == 0, err
    code, chunked, err = cli(*args, "--prefill-tokens", "2048")
    assert code == 0, err
    assert whole.splitlines()[0] == "fit        llama-3.1-8b: 1 profile x contexts 128k"
    title = "fit        llama-3.1-8b: 1 profile x contexts 128k, prefill in 2k-token chunks"
    assert chunked.splitlines()[0] == title
    # one 128k-token prefill keeps the 4090 from running any layer; 2k-token chunks do not
    assert "CPU only" in whole.splitlines()[2] and "partial:" in chunked.splitlines()[2]
    code, _, err = cli(*args, "--prefill-tokens", "0")
    assert code == 2 and "--prefill-tokens must be at least 1, got 0" in err


def test_fit_text_lists_a_cells_notes_under_it() -> None:
    from workbench.commands.fit import fit_lines
    from workbench.models.hardware import load_profile
    from workbench.runtime.fit_table import CPU_ONLY, FitCell, FitTable

    laptop = load_profile("cpu-laptop-16gb")
    cell = FitCell(
        "cpu-laptop-16gb", 4096, CPU_ONLY, tokens_per_s=20.0, ttft_s=1.5, notes=("a note",)
    )
    lines = fit_lines(FitTable("demo", (4096,), (laptop,), (cell,)))
    assert lines[-2].split()[:3] == ["4k", "CPU", "only"]
    assert lines[-1] == "            note: a note"
