"""What fits where: every hardware profile by context length, checked by hand for a few cells
of the bundled Llama 3.1 8B config (issue 21)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.models.hardware import DeviceSpec, HardwareProfile, load_profile
from workbench.models.intake import open_model
from workbench.runtime.fit_table import (
    CPU_ONLY,
    FULL_GPU,
    NO_FIT,
    PARTIAL,
    context_label,
    fit_cell,
    fit_contexts,
    fit_table,
)

GIB = 2**30
PARAMS_8B = 8_030_261_248  # Llama 3.1 8B: the published parameter count
WEIGHTS_8B = 2 * PARAMS_8B  # bf16: 16,060,522,496 B
BUFFERS_8B = 2 * 64 * 4  # rotary inv_freq and original_inv_freq: 64 fp32 each = 512 B


@pytest.fixture(scope="module")
def llama8b():
    return open_model("llama-3.1-8b")


def test_contexts_stop_at_the_model_maximum(llama8b) -> None:
    # max_position_embeddings 131072 = 128k: the maximum is one of the fixed columns
    assert fit_contexts(llama8b) == (4096, 32768, 131072)
    # GPT-2 supports 1024 positions: none of 4k/32k/128k, only its maximum
    assert fit_contexts(open_model("gpt2")) == (1024,)
    assert [context_label(c) for c in (1024, 4096, 131072, 1000)] == ["1k", "4k", "128k", "1000"]


def test_h200_at_4k_is_full_gpu_with_hand_checked_speed(llama8b) -> None:
    assert llama8b.tree.root.param_count == PARAMS_8B
    assert llama8b.tree.root.nbytes == WEIGHTS_8B + BUFFERS_8B
    cell = fit_cell(llama8b, load_profile("h200-141gb"), 4096)
    assert cell.status == FULL_GPU and cell.label() == "full GPU"
    assert cell.gpu_layers == cell.layer_count == 32
    assert set(cell.device_map.values()) == {0}
    # KV cache: 32 layers x 4096 tokens x 8 KV heads x (128 K + 128 V) x 2 B = 512 MiB
    kv_nbytes = 32 * 4096 * 8 * (128 + 128) * 2
    assert kv_nbytes == 512 * 2**20
    assert "512 MiB of KV cache at 4k context, bf16, GQA 8 of 32 heads" in cell.why[0]
    assert cell.reserve[0] > kv_nbytes  # plus the activation peak
    # decode at batch 1 reads the weights at 4800 GB/s x 0.8 (mbu) = 3.84e12 B/s, and the
    # host dispatches each call in the profile's typical 15 us, plus 300 us per forward. A
    # layer's 436,224,000 B read in 113.6 us hides behind its 10 calls' 150 us; embed_tokens
    # and lm_head read 1,050,673,152 B each in 273.6 us; norm and rotary_emb are their 15 us:
    # 32 x 150 us + 2 x 273.6 us + 2 x 15 us + 300 us = 5.68 ms -> 176 tok/s (239 by bandwidth)
    # A layer's attention over its 16 MiB cache moves it 3 times (DynamicCache's cat reads and
    # writes it, SDPA reads it): 13.1 us; with the weights' 113.6 us still under the dispatch
    layer_bytes = 436_224_000
    embed_bytes = 128256 * 4096 * 2
    assert 32 * layer_bytes + 2 * embed_bytes + 4096 * 2 + BUFFERS_8B == WEIGHTS_8B + BUFFERS_8B
    bandwidth = 4800e9 * 0.8
    layer_cache = 4096 * 8 * (128 + 128) * 2
    attention_decode = 3 * layer_cache / bandwidth
    assert attention_decode == pytest.approx(13.1e-6, abs=0.1e-6)
    assert layer_bytes / bandwidth + attention_decode < 10 * 15e-6
    decode_s = 32 * 150e-6 + 2 * embed_bytes / bandwidth + 2 * 15e-6 + 300e-6
    assert cell.tokens_per_s == pytest.approx(1 / decode_s, rel=1e-9)
    assert cell.tokens_per_s == pytest.approx(176.1, abs=0.1)
    # the 4096-token prefill is compute-bound in every decoder layer: 2 x N x 4096 FLOP at
    # 989 TFLOP/s x 0.5 (mfu) = 0.116 s, above each layer's dispatch. embed_tokens looks its
    # 4096 rows up and lm_head computes the last position only (generate keeps one row of
    # logits): each reads its 1,050,673,152 B in 273.6 us, as a decode step does (counted as
    # 4096 rows of matmul before: 17 ms more). The final norm (4096 params) and rotary_emb are
    # their 15 us, the forward 300 us; that forward yields the first token. Each layer's causal
    # attention adds 2 x 32 heads x (128 + 128) x 4096 x 4097 / 2 pairs of FLOP: 0.278 ms,
    # 8.9 ms in all
    compute = 989e12 * 0.5
    attention_prefill = 2 * 32 * (128 + 128) * 4096 * 4097 / 2 / compute
    assert 32 * attention_prefill == pytest.approx(8.9e-3, abs=0.05e-3)
    layer_params = PARAMS_8B - 4096 - 2 * 128256 * 4096
    prefill_s = (
        2 * layer_params * 4096 / compute
        + 32 * attention_prefill
        + 2 * embed_bytes / bandwidth
        + 2 * 15e-6
        + 300e-6
    )
    assert cell.ttft_s == pytest.approx(prefill_s, rel=1e-9)
    assert cell.ttft_s == pytest.approx(0.1254, abs=1e-4)


def test_the_laptop_cannot_hold_a_128k_cache(llama8b) -> None:
    cell = fit_cell(llama8b, load_profile("cpu-laptop-16gb"), 131072)
    # KV cache alone: 32 x 131072 x 8 x 256 x 2 B = 16 GiB = the laptop's whole RAM budget
    assert 16 * GIB == 32 * 131072 * 8 * 256 * 2
    assert cell.status == NO_FIT and not cell.fits
    assert cell.tokens_per_s is None and cell.device_map == {} and cell.speed_text() == ""
    assert "cpu" in cell.problem and "its 16 GiB budget" in cell.problem


def test_a_gpu_too_small_for_the_cache_leaves_the_cpu_to_run_it(llama8b) -> None:
    # RTX 4090 at 128k: 16 GiB of KV cache plus the prefill's activations would have to stay
    # on the GPU that runs the offloaded layers, beside at least one layer: 23 GiB is not enough
    cell = fit_cell(llama8b, load_profile("rtx4090-64gb"), 131072)
    assert cell.status == CPU_ONLY and cell.fits
    assert not any(isinstance(device, int) for device in cell.device_map.values())
    assert cell.problem.startswith("the GPUs are unused: none holds a layer beside the KV")
    assert cell.tokens_per_s is not None and cell.tokens_per_s > 0


def test_a_small_gpu_takes_part_of_the_layers(llama8b) -> None:
    profile = HardwareProfile(
        "12gb-gpu",
        "one 12 GiB GPU, 64 GiB RAM",
        (DeviceSpec(0, "GPU", 12 * GIB, None, 100.0, 900.0), DeviceSpec("cpu", "RAM", 64 * GIB)),
    )
    cell = fit_cell(llama8b, profile, 4096)
    assert cell.status == PARTIAL
    # 32 layers of 436 MB each cannot all sit in 12 GiB - margin; some can
    assert 0 < cell.gpu_layers < 32 and cell.layer_count == 32
    assert cell.label() == f"partial: {cell.gpu_layers} of 32 layers on GPU"
    budget = profile.budgets()[0]
    used = sum(llama8b.tree.node(name).nbytes for name, d in cell.device_map.items() if d == 0)
    assert used + cell.reserve[0] <= budget  # the weights on the GPU and its reserve fit


def test_the_table_has_every_profile_including_the_users(
    llama8b, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    folder = tmp_path / "model-memory-workbench" / "hardware"
    folder.mkdir(parents=True)
    (folder / "my-a100.json").write_text(
        json.dumps(
            {
                "description": "one A100 80 GB, 256 GB RAM",
                "devices": [
                    {"device": 0, "memory": "80GiB", "held": "2GiB"},
                    {"device": "cpu", "memory": "256GiB"},
                ],
            }
        )
    )
    seen = []
    table = fit_table(llama8b, contexts=[4096], on_cell=seen.append)
    names = [profile.name for profile in table.profiles]
    assert {"h200-141gb", "cpu-laptop-16gb", "rtx4090-64gb", "2x-h100-80gb", "my-a100"} <= set(
        names
    )
    assert [cell.profile for cell in table.cells] == names == [cell.profile for cell in seen]
    assert table.cell("my-a100", 4096).status == FULL_GPU
    data = json.loads(json.dumps(table.to_dict()))  # JSON-clean
    assert data["contexts"] == [4096] and len(data["cells"]) == len(names)
    mine = next(p for p in data["profiles"] if p["name"] == "my-a100")
    assert "2 GiB held" in mine["budget_description"]
    with pytest.raises(KeyError, match="no cell for profile 'nope' at 4096 tokens"):
        table.cell("nope", 4096)


def test_chunked_prefill_lets_the_4090_run_layers_at_128k(llama8b) -> None:
    from workbench.runtime.planning import MemoryOptions, device_reserves

    whole = fit_cell(llama8b, load_profile("rtx4090-64gb"), 131072)
    chunked = fit_cell(llama8b, load_profile("rtx4090-64gb"), 131072, prefill_tokens=2048)
    # a 128k prefill in one forward needs the 16 GiB cache plus 14.5 GiB of activations
    # (residual 4 x 131072 x 4096 x 2 B = 4 GiB, MLP 3 x 131072 x 14336 x 2 B = 10.5 GiB): more
    # than the 4090's 23 GiB; in 2k chunks the activations are 5x smaller and layers fit beside
    assert whole.status == CPU_ONLY
    assert chunked.status == PARTIAL and 0 < chunked.gpu_layers < 32
    expected = device_reserves(
        llama8b, chunked.device_map, MemoryOptions(context=131072, prefill_tokens=2048)
    )
    assert chunked.reserve == {d: r.nbytes for d, r in expected.items()}
    # the last 2k chunk, with 126k tokens cached before it: sdpa gets a mask, so transformers
    # repeats K/V to all 32 heads over 131072 keys (2 x 32 x 131072 x 128 x 2 B = 2 GiB):
    # residual 3 x 2048 x 4096 x 2 + rotary 2 x 2048 x 128 x 2        =    51,380,224
    # bool mask 2048 x 131072                                         =   268,435,456
    # attention: queries 32 x 2048 x 128 x 2 + repeated K/V 2 GiB + output 32 x 2048 x 128 x 2
    #   + additive mask 2048 x 131072 x 2                             = 2,717,908,992
    activation = 51_380_224 + 268_435_456 + 2_717_908_992  # 2.83 GiB, against 14.5 GiB whole
    assert chunked.reserve[0] - 16 * GIB == expected[0].activation_nbytes == activation
    assert chunked.why[0].endswith("for 2k-token prefill chunks")
    table = fit_table(llama8b, [load_profile("rtx4090-64gb")], [131072], prefill_tokens=2048)
    assert table.cells == (chunked,) and table.to_dict()["prefill_tokens"] == 2048


def test_an_encoder_is_timed_by_one_forward_not_tokens_per_second(llama8b) -> None:
    bert = open_model("bert-base-uncased")  # BertForMaskedLM: one forward, no generation
    assert fit_contexts(bert) == (512,)  # max_position_embeddings
    params = bert.tree.root.param_count
    assert params == 109_514_298
    cell = fit_cell(bert, load_profile("h200-141gb"), 512)
    assert cell.status == FULL_GPU and not cell.generates
    # every block's arithmetic over 512 tokens (e.g. one encoder layer: 7.09M params,
    # 2 x 7.09M x 512 FLOP / 494.5 TFLOP/s = 14.7 us) hides behind the host's dispatch at the
    # profile's typical 15 us per call: 12 calls per encoder layer (q, k, v, 3 dense, 2
    # LayerNorms, 3 dropouts, the GELU) = 180 us, 5 in the embeddings = 75 us, and one each for
    # the 3 prediction-head modules holding tensors = 45 us; plus 300 us for the forward
    forward_s = 12 * 180e-6 + 75e-6 + 3 * 15e-6 + 300e-6
    assert 2 * (params / 12) * 512 / (989e12 * 0.5) < 180e-6
    assert cell.forward_s == pytest.approx(forward_s, rel=1e-9)
    assert cell.speed_text() == "forward 2.6 ms"  # no tok/s, no TTFT: it generates nothing
    assert cell.to_dict()["generates"] is False
    llama = fit_cell(llama8b, load_profile("h200-141gb"), 4096)
    assert llama.generates and "tok/s" in llama.speed_text()


def test_this_machine_is_fitted_with_its_measured_attention(demo_dir: Path) -> None:
    from workbench.models.attention_probe import cached_attention_times
    from workbench.models.hardware import detect_hardware, with_host_probes
    from workbench.models.speed import attention_shapes_for, predict_speed
    from workbench.runtime.planning import attention_layout

    opened = open_model(str(demo_dir))
    here = with_host_probes(detect_hardware(measure_links=False))
    assert here.cpu_matmul_curve is not None
    times = cached_attention_times(attention_shapes_for(opened.tree, attention_layout(opened)))
    assert times  # measured once on this CPU, then cached
    cell = fit_cell(opened, here, 512)
    timed = predict_speed(opened, cell.device_map, here, prompt_tokens=512, attention_times=times)
    assert cell.tokens_per_s == pytest.approx(timed.tokens_per_s)
    assert cell.ttft_s == pytest.approx(timed.ttft_s)
    counted = predict_speed(opened, cell.device_map, here, prompt_tokens=512)
    assert counted.tokens_per_s != pytest.approx(timed.tokens_per_s)
    # a what-if profile is not this machine: its cells count FLOPs and bytes
    laptop = load_profile("cpu-laptop-16gb")
    what_if = fit_cell(opened, laptop, 512)
    assert what_if.tokens_per_s == pytest.approx(
        predict_speed(opened, what_if.device_map, laptop, prompt_tokens=512).tokens_per_s
    )


def test_this_machines_cells_say_when_their_attention_is_estimated(
    demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CPU cell of this machine before its CPU has timed the model's attention counts that
    attention's FLOPs, and says so in its notes; a GPU cell, or one timed, does not."""
    from dataclasses import replace

    from workbench.models import attention_probe
    from workbench.models.attention_probe import AttentionTimes
    from workbench.models.hardware import DETECTED_NAME
    from workbench.models.matmul_probe import MatmulCurve
    from workbench.models.speed import attention_shapes_for
    from workbench.runtime.machine_attention import ATTENTION_ESTIMATED
    from workbench.runtime.planning import attention_layout

    monkeypatch.setenv("WORKBENCH_CACHE_DIR", str(tmp_path))  # nothing timed yet
    opened = open_model(str(demo_dir))
    curve = MatmulCurve({"float32": [[2**20, 2e-4], [2**22, 6e-4]]}, 2, 0.0)
    here = replace(load_profile("cpu-laptop-16gb"), name=DETECTED_NAME, cpu_matmul_curve=curve)
    estimated = f"this machine's {ATTENTION_ESTIMATED}"
    cell = fit_cell(opened, here, 512)
    assert cell.status == CPU_ONLY and estimated in cell.notes
    gpu = replace(load_profile("h200-141gb"), name=DETECTED_NAME, cpu_matmul_curve=curve)
    on_gpu = fit_cell(opened, gpu, 512)
    assert on_gpu.status == FULL_GPU and estimated not in on_gpu.notes

    timed = AttentionTimes([[512, 1e-4], [4096, 1e-3]], [[256, 1e-3], [2048, 5e-2]], 0.0)
    monkeypatch.setattr(attention_probe, "measure_attention_times_apart", lambda shape: timed)
    attention_probe.cached_attention_times(
        attention_shapes_for(opened.tree, attention_layout(opened))
    )  # as an inference run caches them
    assert estimated not in fit_cell(opened, here, 512).notes
