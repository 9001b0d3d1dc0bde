"""The real pipeline split against one process: per-stage memory (RSS) beside the plan, and
decode tokens/s of the pipeline beside the single process.

Model: a Llama demo (``--params``, default 20M, float32 compute) made on first use. Both sides
run the same greedy loop without a KV cache on a fixed-length input (prompt plus new tokens;
see ``workbench.runtime.pipeline_run``), each in a fresh spawned process so the RSS figures
compare like with like; the single process also runs ``model.generate`` with its KV cache.

Reported per stage: the planned bytes (weights + one chunk of activations + the torch process
overhead the planner assumes, ``ENGINE_OVERHEAD_BYTES["torch"]``), RSS before loading (the
interpreter with torch and transformers), after loading, and the peak; the bytes read from the
checkpoint (its own stage's tensors only).

    python benchmarks/bench_pipeline.py                 # 2 stages, 20M demo
    python benchmarks/bench_pipeline.py --stages 4 --params 60M
"""

from __future__ import annotations

import argparse
import multiprocessing
import time

MIB = 2**20


def _single_process(
    out: multiprocessing.Queue, folder: str, ids: list[int], new: int, dtype: str
) -> None:
    import resource

    import psutil
    import torch

    from workbench.big_modeling.loading.api import load_checkpoint_in_model
    from workbench.models.intake import open_model

    rss_before = psutil.Process().memory_info().rss
    opened = open_model(folder)
    load_checkpoint_in_model(opened.model, folder, device_map={"": "cpu"}, dtype=dtype)
    model = opened.model.eval()
    rss_loaded = psutil.Process().memory_info().rss
    padded = torch.zeros((1, len(ids) + new), dtype=torch.long)
    padded[0, : len(ids)] = torch.tensor(ids)
    step_s, tokens = [], []
    with torch.no_grad():
        for step in range(new):
            start = time.perf_counter()
            logits = model(padded).logits
            chosen = int(logits[0, len(ids) + step - 1].argmax())
            step_s.append(time.perf_counter() - start)
            padded[0, len(ids) + step] = chosen
            tokens.append(chosen)
        model.generation_config.eos_token_id = None
        start = time.perf_counter()
        model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False)
        generate_s = time.perf_counter() - start
    out.put(
        {
            "tokens": tokens,
            "rss_before": rss_before,
            "rss_loaded": rss_loaded,
            "rss_peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "decode_tokens_per_s": (new - 1) / sum(step_s[1:]),
            "generate_tokens_per_s": new / generate_s,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--params", default="20M")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()

    import torch

    from workbench.models.demo import demo_model_dir
    from workbench.models.intake import open_model
    from workbench.runtime.pipeline_run import planned_stages, run_pipeline

    folder = demo_model_dir("llama", args.params)
    opened = open_model(folder)
    vocab = opened.config.vocab_size
    ids = torch.randint(
        0, vocab, (args.prompt_tokens,), generator=torch.Generator().manual_seed(0)
    ).tolist()
    total = args.prompt_tokens + args.new_tokens
    stages = planned_stages(opened, args.stages, chunk_tokens=total)
    print(
        f"model {folder} ({opened.tree.root.param_count:,} params), {args.stages} stages, {args.dtype}"
    )
    print(
        f"prompt {args.prompt_tokens} tokens + {args.new_tokens} new (fixed length {total}, no KV cache)"
    )

    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    single = context.Process(
        target=_single_process, args=(queue, str(folder), ids, args.new_tokens, args.dtype)
    )
    single.start()
    baseline = queue.get()
    single.join()

    result = run_pipeline(
        str(folder), stages, ids, max_new_tokens=args.new_tokens, dtype=args.dtype
    )
    assert result is not None
    print()
    print(
        f"{'':<14}{'layers':>8}{'planned':>10}{'RSS start':>11}{'RSS loaded':>12}{'RSS peak':>10}{'read':>9}  (MiB)"
    )
    for report in result.stages:
        last = report.first_layer + report.layer_count - 1
        print(
            f"stage {report.rank:<8}{report.first_layer:>4}-{last:<3}{report.planned_bytes / MIB:>10.0f}"
            f"{report.rss_before_load / MIB:>11.0f}{report.rss_after_load / MIB:>12.0f}"
            f"{report.rss_peak / MIB:>10.0f}{report.nbytes_read / MIB:>9.1f}"
        )
    print(
        f"{'one process':<14}{'all':>8}{'':>10}{baseline['rss_before'] / MIB:>11.0f}"
        f"{baseline['rss_loaded'] / MIB:>12.0f}{baseline['rss_peak'] / MIB:>10.0f}"
    )
    print()
    same = "same tokens" if result.tokens == baseline["tokens"] else "DIFFERENT tokens"
    print(
        f"decode (uncached, full forward per token): pipeline {result.decode_tokens_per_s:.2f} tok/s, "
        f"one process {baseline['decode_tokens_per_s']:.2f} tok/s, ratio "
        f"{result.decode_tokens_per_s / baseline['decode_tokens_per_s']:.2f}x ({same})"
    )
    print(
        f"one process with KV cache (model.generate): {baseline['generate_tokens_per_s']:.2f} tok/s"
    )


if __name__ == "__main__":
    main()
