"""Eight visitors, eight different ViT-B models, one server: does its memory stay within the budget?

    .venv/bin/python tests/bench_server_memory.py --budget-mb 2048

Starts ``streamlit run vizapp/app.py`` with ``VIZAPP_MEMORY_MB`` set to ``--budget-mb``, then opens
eight Chromium sessions at once, each by a link naming a different ViT-B-sized model with random
weights (``?model=random:NAME``: about 330 MB of float32 weights each, 2.7 GB for the eight), and
one more session by the link ``?model=random:vit_small_patch16_224&res=1024`` (a 4,097-token
record of about 4.8 GB in float32). Each session waits until its page has drawn its first result or
shown why it refused. The server's resident memory (``/proc/PID/status``) is sampled every 0.2 s
while they run; after the sessions close, the server is left for ``--rest`` seconds.

Prints the resident memory before the first visitor (the baseline: Python, torch, Streamlit, the
demo model), its peak, and its value after the rest, each also over the baseline; what each
session showed; and whether the peak stayed within the baseline plus the budget plus ``--slack-mb``
(what the budget does not count: a forward pass's activations, figures being built, the
allocator's free lists). Exits 1 if it did not, or if the server died.

A benchmark, not a test (minutes of CPU, gigabytes of memory); the suite's checks of the same budget
are tests/test_app.py (the store's byte budget) and tests/test_app_caches.py (eight ViT-S/16 in
one process).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from streamlit_server import CHROMIUM, CHROMIUM_ARGS, rss_mib, streamlit_server  # noqa: E402

#: eight timm architectures of ViT-B size (12 layers, 768 wide): each is a different model to the app
VIT_B = (
    "vit_base_patch16_224",
    "vit_base_patch32_224",
    "deit_base_patch16_224",
    "deit_base_distilled_patch16_224",
    "deit3_base_patch16_224",
    "vit_base_patch16_clip_224",
    "vit_base_patch16_siglip_224",
    "vit_base_patch16_224_miil",
)
LARGE_INPUT = {"model": "random:vit_small_patch16_224", "res": "1024"}


async def _visitor(browser, url: str, params: dict, timeout_s: float) -> dict:
    context = await browser.new_context(viewport={"width": 1280, "height": 1000})
    page = await context.new_page()
    page.set_default_timeout(timeout_s * 1000)
    began = time.monotonic()
    try:
        await page.goto(f"{url}/?{urllib.parse.urlencode(params)}")
        await page.wait_for_function(
            "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
            " && (document.querySelector('[data-testid=\"stPlotlyChart\"] .main-svg')"
            " || document.querySelector('iframe[title*=\"attention_view\"]')"
            " || document.querySelector('[data-testid=\"stAlert\"]'))",
            polling=500,
        )
        alert = page.locator("[data-testid='stAlert']")
        said = (await alert.first.inner_text())[:140].replace("\n", " ") if await alert.count() else ""
        exceptions = await page.locator("[data-testid='stException']").count()
        return {
            "model": params.get("model", "demo"),
            "s": round(time.monotonic() - began, 1),
            "alert": said,
            "exceptions": exceptions,
        }
    finally:
        await context.close()


async def _visit(url: str, visits: list[dict], timeout_s: float) -> list[dict]:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            return await asyncio.gather(*(_visitor(browser, url, params, timeout_s) for params in visits))
        finally:
            await browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-mb", type=int, default=2048, help="VIZAPP_MEMORY_MB for the server")
    parser.add_argument("--slack-mb", type=int, default=512, help="what the budget does not count (see above)")
    parser.add_argument("--rest", type=float, default=20.0, help="seconds after the visitors leave")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a session may take")
    parser.add_argument("--log", type=Path, default=Path("artifacts/server_memory_streamlit.log"))
    args = parser.parse_args(argv)
    args.log.parent.mkdir(parents=True, exist_ok=True)
    if not CHROMIUM.exists():
        print(f"no Chromium at {CHROMIUM}", file=sys.stderr)
        return 2
    visits = [{"model": f"random:{name}"} for name in VIT_B] + [LARGE_INPUT]
    env = {"VIZAPP_MEMORY_MB": str(args.budget_mb)}
    with streamlit_server(args.log, env) as (url, process):
        asyncio.run(_visit(url, [{}], args.timeout))  # the demo's first page once: every library imported
        baseline = rss_mib(process.pid)
        peak, stop = [baseline], threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], rss_mib(process.pid))
                stop.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            results = asyncio.run(_visit(url, visits, args.timeout))
        finally:
            stop.set()
            sampler.join()
        time.sleep(args.rest)
        after = rss_mib(process.pid)
        alive = process.poll() is None
    for row in results:
        print(row)
    bound = baseline + args.budget_mb + args.slack_mb
    print(
        f"budget {args.budget_mb} MiB (VIZAPP_MEMORY_MB) + slack {args.slack_mb} MiB; server RSS: baseline "
        f"{baseline:.0f} MiB, peak {peak[0]:.0f} MiB (+{peak[0] - baseline:.0f}), {args.rest:g} s after the "
        f"visitors left {after:.0f} MiB (+{after - baseline:.0f}); bound {bound:.0f} MiB: "
        f"{'held' if peak[0] <= bound else 'EXCEEDED'}; server {'alive' if alive else 'dead'}"
    )
    exceptions = sum(row["exceptions"] for row in results)
    return 0 if peak[0] <= bound and alive and not exceptions else 1


if __name__ == "__main__":
    raise SystemExit(main())
