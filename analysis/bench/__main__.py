"""Benchmark: ratios measured side by side in one run (medians of several runs).

    python -m analysis.bench              # everything (a few minutes on 2 CPU cores)
    python -m analysis.bench --quick      # fewer repeats and images

Prints, each with its target:
  1. capture_attention vs timm's own fused forward and vs the peers' approach (fused attention
     off, a hook on attn_drop), vit_base_patch16_224 and the RoPE vit_base_patch16_dinov3, batch 8;
     and vs its floor, the fused forward followed by writing a record of the same size into new
     memory (what keeping every map costs by itself);
  1b. run_with_cache (named activations) with no names, every residual stream and every
     attention map, vs the fused forward and vs capture_attention;
  2. dataset attention distance throughput vs plain forward throughput (same model, same
     images, JPEG decode and preprocessing included);
  3. peak memory (max RSS, fresh processes) of the dataset attention distance for 32 vs 160 images;
  4. memory of a ViT-L/16 at 384 px record in float32 vs float16 (with --vit-large, it is captured);
  5. app rerun time after a layer change (Streamlit AppTest, server time) on the demo model and
     on ViT-B/16, ViT-L/16 at 384 px and DINOv2-S/14 at 518 px, with each one's record memory,
     and the Tokens page's rerun after a patch click on ViT-B/16;
  6. on CUDA: capture vs the fused bf16 forward.
Random weights are used for the timm architectures (timing does not depend on the values).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from analysis import capture_attention, dataset_attention_distance, load_vit  # noqa: E402
from analysis.attention.streaming import iter_batches  # noqa: E402


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def jpeg_images(count: int, size=(320, 240), seed: int = 0) -> list[bytes]:
    """Encoded JPEGs, so that decoding is part of what is measured."""
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        base = rng.integers(0, 255, size=(size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
        image = Image.fromarray(base).resize(size, Image.Resampling.BICUBIC)
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=90)
        images.append(buffer.getvalue())
    return images


def peers_capture(model):
    """The approach of vit-explain and similar tools, on a private copy of ``model``: timm's
    fused attention switched off (explicit softmax(q·kᵀ)) and a forward hook on every
    ``attn_drop`` that keeps its output. Returns ``run(pixels) -> (logits, maps)``."""
    import copy

    peer = copy.deepcopy(model)
    for module in peer.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False

    def run(pixels):
        maps, handles = [], []
        for module in peer.modules():
            if hasattr(module, "fused_attn") and hasattr(module, "attn_drop"):
                handles.append(module.attn_drop.register_forward_hook(lambda m, i, o: maps.append(o.detach().cpu())))
        try:
            with torch.no_grad():
                return peer(pixels), maps
        finally:
            for handle in handles:
                handle.remove()

    return run


def bench_capture(model_name: str, batch: int, repeats: int, device=None) -> dict:
    """Fused forward, the peers' approach and ``capture_attention``, interleaved (so drifts in
    machine load hit all alike), ``repeats`` rounds. Ratios are medians of each round's own
    ratio (paired, so a slow round slows both sides); times are medians.

    ``capture`` writes every record into new memory. ``floor`` is the fused forward followed by writing a record of
    the capture's size into new memory, layer by layer, as the capture does: what any capture
    that keeps every map costs at least (the maps themselves), so ``capture / floor`` is what the
    capture adds beyond them."""
    vit = load_vit(model_name, pretrained=False, device=device)
    pixels = torch.randn(batch, 3, *vit.spec.img_size, device=vit.device)
    precision = "auto"
    from analysis.base.devices import autocast_context

    def forward():
        with torch.no_grad(), autocast_context(vit.device, precision):
            vit.model(pixels)
        _sync(vit.device)

    def capture():
        record = capture_attention(vit, pixels, precision=precision, to_cpu=vit.device.type == "cpu")
        _sync(vit.device)
        return record

    peers_run = peers_capture(vit.model)

    def peers():
        with autocast_context(vit.device, precision):
            peers_run(pixels)
        _sync(vit.device)

    first = capture().attentions  # (L, B, heads, T, T)
    record_shape, record_dtype, record_mib = tuple(first.shape), first.dtype, first.nbytes / 2**20
    del first
    layer_maps = torch.rand(record_shape[1:], dtype=record_dtype)

    def floor():
        forward()
        record = torch.empty(record_shape, dtype=record_dtype)  # new memory, as the capture's
        for layer in range(record_shape[0]):
            record[layer].copy_(layer_maps)
        return record

    variants = {"forward": forward, "peers": peers, "capture": capture, "floor": floor}
    forward(), peers(), floor()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            times[name].append(_median_time(fn, 1))

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b]))

    return {
        "device": vit.device.type,
        "forward_s": statistics.median(times["forward"]),
        "capture_s": statistics.median(times["capture"]),
        "peers_s": statistics.median(times["peers"]),
        "ratio": paired("capture", "forward"),
        "peers_ratio": paired("peers", "forward"),
        "vs_peers": paired("capture", "peers"),
        "floor_ratio": paired("floor", "forward"),
        "vs_floor": paired("capture", "floor"),
        "record_mib": record_mib,
    }


def bench_cache(model_name: str, batch: int, repeats: int) -> dict:
    """``run_with_cache`` beside a plain fused forward, interleaved: with no names
    (no hook at all), with every block's residual stream, and with every block's probabilities
    beside ``capture_attention`` (the same engine: the cache keeps one tensor per layer, the
    record stacks them into one ``(L, …)`` buffer; both compute each map in place)."""
    from analysis.engine.activations import run_with_cache

    vit = load_vit(model_name, pretrained=False, device="cpu")
    pixels = torch.randn(batch, 3, *vit.spec.img_size)
    layers = range(vit.spec.num_layers)
    residual = [f"blocks.{layer}.resid_post" for layer in layers]
    probs = [f"blocks.{layer}.attn.probs" for layer in layers]

    def forward():
        with torch.no_grad():
            vit.model(pixels)

    variants = {
        "forward": forward,
        "empty": lambda: run_with_cache(vit, pixels, names=[]),
        "residual": lambda: run_with_cache(vit, pixels, names=residual),
        "probs": lambda: run_with_cache(vit, pixels, names=probs),
        "capture": lambda: capture_attention(vit, pixels),
    }
    for fn in variants.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            times[name].append(_median_time(fn, 1))

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b]))

    return {
        "forward_s": statistics.median(times["forward"]),
        "empty": paired("empty", "forward"),
        "residual": paired("residual", "forward"),
        "probs": paired("probs", "forward"),
        "probs_vs_capture": paired("probs", "capture"),
    }


def bench_dataset(model_name: str, count: int, batch: int, repeats: int) -> dict:
    vit = load_vit(model_name, pretrained=False)
    images = jpeg_images(count)

    def plain():
        with torch.no_grad():
            for pixels in iter_batches(vit, images, batch, workers=min(4, os.cpu_count() or 1)):
                vit.model(pixels.to(vit.device))
        _sync(vit.device)

    def streamed():
        dataset_attention_distance(vit, images, batch_size=batch)
        _sync(vit.device)

    plain_times, stream_times = [], []
    for _ in range(repeats):
        plain_times.append(_median_time(plain, 1))
        stream_times.append(_median_time(streamed, 1))
    p, s = statistics.median(plain_times), statistics.median(stream_times)
    return {"plain_img_per_s": count / p, "stream_img_per_s": count / s, "ratio": p / s}


def _memory_probe(model_name: str, count: int, batch: int) -> int:
    """Run in a fresh process: dataset distance over ``count`` images; print max RSS (KiB)."""
    import resource

    vit = load_vit(model_name, pretrained=False)
    dataset_attention_distance(vit, jpeg_images(count), batch_size=batch)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def bench_memory(model_name: str, counts=(32, 160), batch: int = 16) -> dict:
    peaks = {}
    for count in counts:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "analysis.bench",
                "--memory-probe",
                str(count),
                "--model",
                model_name,
                "--batch",
                str(batch),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
        peaks[count] = int(out.stdout.strip().splitlines()[-1])
    return {"peak_mib": {k: v / 1024 for k, v in peaks.items()}, "ratio": peaks[counts[1]] / peaks[counts[0]]}


def bench_vit_large(capture: bool) -> dict:
    layers, heads, tokens = 24, 16, 1 + (384 // 16) ** 2
    entries = layers * heads * tokens * tokens
    result: dict[str, Any] = {
        "entries_per_image": entries,
        "float32_gib": entries * 4 / 2**30,
        "float16_gib": entries * 2 / 2**30,
    }
    if capture:
        vit = load_vit("vit_large_patch16_384", pretrained=False)
        pixels = torch.randn(1, 3, 384, 384)
        start = time.perf_counter()
        record = capture_attention(vit, pixels, dtype=torch.float16)
        result["captured_shape"] = tuple(record.attentions.shape)
        result["captured_gib"] = record.attentions.numel() * record.attentions.element_size() / 2**30
        result["capture_s"] = time.perf_counter() - start
    return result


def bench_app(sections: list[str]) -> dict | None:
    """The app's sections (``app``, ``rerun``, ``tokens``) measured by ``python -m vizapp.bench``
    in a child process (the library never imports its app): ``{section: result}``, or ``None``
    when the app or streamlit is not there."""
    if not (REPO / "vizapp" / "bench.py").is_file():
        return None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", "vizapp.bench", *sections], cwd=REPO, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and images")
    parser.add_argument("--vit-large", action="store_true", help="also capture a ViT-L/16 at 384 px (slow on CPU)")
    parser.add_argument("--memory-probe", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--model", default="vit_small_patch16_224", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=16, help=argparse.SUPPRESS)
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        help="sections to skip: capture cache dataset memory large app rerun tokens gpu",
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.memory_probe:
        print(_memory_probe(args.model, args.memory_probe, args.batch))
        return 0

    repeats = 3 if args.quick else 5
    rows = []

    def report(name, value, target, ok):
        rows.append((name, value, target, "PASS" if ok else "FAIL"))
        print(f"{name:<58} {value:>14}   target {target:<10} {'PASS' if ok else 'FAIL'}", flush=True)

    def report_floor(model: str, r: dict) -> None:
        print(
            f"  floor: the fused forward, then its record written into new memory: {r['floor_ratio']:.3f} x the "
            "fused forward (what any capture that keeps every map pays here)"
        )
        report(f"capture / floor ({model}, batch 8, cpu)", f"{r['vs_floor']:.3f}", "<= 1.02", r["vs_floor"] <= 1.02)

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, cuda={torch.cuda.is_available()}\n", flush=True
    )
    if "capture" not in args.skip:
        r = bench_capture("vit_base_patch16_224", batch=8, repeats=max(7, repeats), device="cpu")
        print(
            f"  fused forward {r['forward_s']:.3f} s, peers' approach (fused off + attn_drop hook) "
            f"{r['peers_s']:.3f} s ({r['peers_ratio']:.3f}), capture {r['capture_s']:.3f} s (cpu, batch 8, "
            f"{r['record_mib']:.0f} MiB record)"
        )
        report("capture / fused forward (ViT-B/16, batch 8, cpu)", f"{r['ratio']:.3f}", "<= 1.05", r["ratio"] <= 1.05)
        report_floor("ViT-B/16", r)
        report(
            "capture / peers' approach (ViT-B/16, batch 8, cpu)",
            f"{r['vs_peers']:.3f}",
            "<= 1.00",
            r["vs_peers"] <= 1.0,
        )
        r = bench_capture("vit_base_patch16_dinov3", batch=8, repeats=max(7, repeats), device="cpu")
        print(
            f"  fused forward {r['forward_s']:.3f} s, capture {r['capture_s']:.3f} s = {r['ratio']:.3f} x the fused "
            f"forward (cpu, batch 8, 256 px, RoPE, {r['record_mib']:.0f} MiB record): at 261 tokens the maps alone cost more than 5 %, see the floor"
        )
        report_floor("DINOv3 ViT-B/16 RoPE", r)
    if "cache" not in args.skip:
        r = bench_cache("vit_base_patch16_224", batch=8, repeats=max(5, repeats))
        print(
            f"  fused forward {r['forward_s']:.3f} s; run_with_cache: every residual stream {r['residual']:.3f} x, "
            f"every attention map {r['probs']:.3f} x the forward ({r['probs_vs_capture']:.3f} x capture_attention)"
        )
        report(
            "run_with_cache(names=[]) / fused forward (ViT-B/16, batch 8)",
            f"{r['empty']:.3f}",
            "<= 1.02",
            r["empty"] <= 1.02,
        )
        report(
            "run_with_cache(every attn.probs) / capture_attention",
            f"{r['probs_vs_capture']:.3f}",
            "<= 1.25",
            r["probs_vs_capture"] <= 1.25,
        )
    if "dataset" not in args.skip:
        count = 32 if args.quick else 64
        r = bench_dataset("vit_base_patch16_224", count=count, batch=16, repeats=max(2, repeats - 2))
        print(
            f"  plain {r['plain_img_per_s']:.2f} img/s, streamed distance {r['stream_img_per_s']:.2f} img/s ({count} JPEGs)"
        )
        report(
            "dataset distance / plain forward throughput (ViT-B/16)", f"{r['ratio']:.3f}", ">= 0.80", r["ratio"] >= 0.8
        )
    if "memory" not in args.skip:
        r = bench_memory("vit_small_patch16_224")
        print(f"  peak RSS: {', '.join(f'{k} images {v:.0f} MiB' for k, v in r['peak_mib'].items())}")
        report("peak memory 160 / 32 images (ViT-S/16, batch 16)", f"{r['ratio']:.3f}", "<= 1.15", r["ratio"] <= 1.15)
    if "large" not in args.skip:
        r = bench_vit_large(capture=args.vit_large)
        print(
            f"  ViT-L/16 @384: {r['entries_per_image']:,} attention entries per image = "
            f"{r['float32_gib']:.2f} GiB float32, {r['float16_gib']:.2f} GiB float16 per image"
        )
        if "captured_gib" in r:
            print(f"  captured {r['captured_shape']} in float16: {r['captured_gib']:.2f} GiB, {r['capture_s']:.1f} s")
    app_sections = [name for name in ("app", "rerun", "tokens") if name not in args.skip]
    app = bench_app(app_sections) if app_sections else {}
    if app is None:
        print("  app: vizapp/app.py or streamlit missing, skipped")
        app = {}
    if "app" in app:
        r = app["app"]
        if r is None:
            print("  app: vizapp/app.py or streamlit missing, skipped")
        elif "error" in r:
            print(f"  app rerun: skipped ({r['error']})")
        else:
            report(
                "app rerun after a layer change (demo model, server)",
                f"{r['rerun_ms']:.0f} ms",
                "<= 150 ms",
                r["rerun_ms"] <= 150,
            )
    if "rerun" in app:
        for label, r in app["rerun"].items():
            if "error" in r:
                print(f"  rerun {label}: skipped ({r['error']})")
                continue
            print(
                f"  {label}: one shared record of {r['record_mib']:.0f} MiB ({r['dtype']}, {r['tokens']} tokens); "
                f"reruns {r['all_ms']} ms"
            )
            report(
                f"app rerun after a layer change ({label}, server)",
                f"{r['rerun_ms']:.0f} ms",
                "<= 150 ms",
                r["rerun_ms"] <= 150,
            )
    if "tokens" in app:
        r = app["tokens"]
        if r is None or "error" in r:
            print(f"  tokens click: skipped ({'streamlit missing' if r is None else r['error']})")
        else:
            report(
                "Tokens page after a patch click (ViT-B/16, server)",
                f"{r['rerun_ms']:.0f} ms",
                "<= 150 ms",
                r["rerun_ms"] <= 150,
            )
    if "gpu" not in args.skip and torch.cuda.is_available():
        r = bench_capture("vit_base_patch16_224", batch=8, repeats=max(10, repeats), device="cuda")
        print(f"  cuda bf16: fused forward {r['forward_s'] * 1000:.2f} ms, capture {r['capture_s'] * 1000:.2f} ms")
        report(
            "capture / fused bf16 forward (ViT-B/16, batch 8, cuda)", f"{r['ratio']:.3f}", "<= 1.30", r["ratio"] <= 1.3
        )
    print("\n" + json.dumps([dict(zip(("measure", "value", "target", "result"), row)) for row in rows], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
