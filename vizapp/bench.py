"""The app's part of ``python -m analysis.bench``: server time of reruns (Streamlit AppTest).

    python -m vizapp.bench [app] [rerun] [tokens]

prints one JSON line ``{section: result}``. ``analysis.bench`` runs this as a child process,
so the library never imports its app.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def bench_app_rerun(repeats: int) -> dict | None:
    try:
        from streamlit.testing.v1 import AppTest
    except ImportError:
        return None
    app = REPO / "vizapp" / "app.py"
    if not app.is_file():
        return None
    at = AppTest.from_file(str(app), default_timeout=180)
    at.run()
    if at.exception:
        return {"error": str(at.exception[0].message)[:200]}
    try:
        slider = at.slider(key="layer")
    except KeyError:
        return {"error": "no widget with key 'layer'"}
    low, high = slider.min, slider.max
    times = []
    for i in range(repeats):
        value = high if i % 2 == 0 else low
        start = time.perf_counter()
        at.slider(key="layer").set_value(value).run()
        times.append(time.perf_counter() - start)
    return {"rerun_ms": statistics.median(times) * 1000, "all_ms": [round(t * 1000) for t in times]}


RERUN_MODELS = {  # label -> (model name for the sidebar, input resolution or 0)
    "ViT-B/16": ("random:vit_base_patch16_224", 0),
    "ViT-L/16 @ 384 px": ("random:vit_large_patch16_384", 0),
    "DINOv2-S/14 @ 518 px": ("random:vit_small_patch14_dinov2", 518),
}


def bench_model_rerun(model: str, resolution: int, repeats: int) -> dict:
    """Server time of the Attention page after a layer change on ``model`` (after its first
    capture), and the memory of its one shared record."""
    from streamlit.testing.v1 import AppTest

    from vizapp import resources

    at = AppTest.from_file(str(REPO / "vizapp" / "app.py"), default_timeout=600)
    at.run()
    at.radio(key="model_source").set_value("timm").run()
    at.text_input(key="model_timm").input(model).run()
    if resolution:
        at.number_input(key="resolution").set_value(resolution).run()
    if at.exception:
        return {"error": str(at.exception[0].message)[:200]}
    current = at.session_state["current"]
    record = resources.forward(*current.args)
    slider = at.slider(key="layer")
    low, high = slider.min, slider.max
    at.slider(key="layer").set_value(high).run()  # the first visit of a layer's maps
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        at.slider(key="layer").set_value(low if i % 2 == 0 else high).run()
        times.append(time.perf_counter() - start)
    return {
        "rerun_ms": statistics.median(times) * 1000,
        "all_ms": [round(t * 1000) for t in times],
        "record_mib": record.nbytes / 2**20,
        "dtype": str(record.record.attentions.dtype).removeprefix("torch."),
        "tokens": current.spec.num_tokens,
    }


def bench_tokens_click(repeats: int, model: str = "random:vit_base_patch16_224") -> dict | None:
    """Server time of the Tokens page when the query patch changes (a click), ViT-B/16,
    after the first capture (the tokens are cached; PCA, similarity, norms are recomputed)."""
    try:
        from streamlit.testing.v1 import AppTest
    except ImportError:
        return None
    at = AppTest.from_file(str(REPO / "vizapp" / "app.py"), default_timeout=300)
    at.run()
    at.radio(key="model_source").set_value("timm").run()
    at.text_input(key="model_timm").input(model).run()
    at.switch_page("views/tokens/tokens.py").run()
    at.radio(key="query_mode").set_value("patch").run()
    if at.exception:
        return {"error": str(at.exception[0].message)[:200]}
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        at.number_input(key="query_patch").set_value(10 + 7 * i).run()
        times.append(time.perf_counter() - start)
    return {"rerun_ms": statistics.median(times) * 1000, "all_ms": [round(t * 1000) for t in times]}


def main(argv: list[str] | None = None) -> int:
    sections = list(sys.argv[1:] if argv is None else argv) or ["app", "rerun", "tokens"]
    try:
        import streamlit  # noqa: F401
    except ImportError:
        print(json.dumps({}))
        return 0
    results: dict = {}
    if "app" in sections:
        results["app"] = bench_app_rerun(repeats=7)
    if "rerun" in sections:
        results["rerun"] = {
            label: bench_model_rerun(model, resolution, repeats=5)
            for label, (model, resolution) in RERUN_MODELS.items()
        }
    if "tokens" in sections:
        results["tokens"] = bench_tokens_click(repeats=5)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
