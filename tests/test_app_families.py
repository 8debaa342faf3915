"""The app opens every supported ViT family (random weights, ``VIZAPP_DEFAULT_MODEL=random:<name>``).

Each family's attention page renders without an exception, headless models and embedding
towers show no class predictions, attention-pooling heads get their own labelled map, and
the position page shows the right encoding (table, rotary features, or why there is none).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from streamlit.testing.v1 import AppTest  # noqa: E402

APP = str(REPO / "vizapp" / "app.py")

# timm name -> (shows class predictions, has a pooling-head map, position page shows)
FAMILIES = {
    "vit_tiny_r_s16_p8_224": (True, False, "position embedding"),  # hybrid: a CNN stem
    "vit_base_patch16_clip_224": (True, False, "position embedding"),  # CLIP image tower
    "vit_small_patch16_dinov3": (False, False, "rotary"),
    "eva02_tiny_patch14_224": (False, False, "both"),
    "beit_base_patch16_224": (True, False, "relative"),
    "vit_relpos_small_patch16_224": (True, False, "relative"),
    "vit_srelpos_small_patch16_224": (True, False, "relative"),
    "vit_base_patch16_rope_reg1_gap_256": (True, False, "rotary"),
    "vit_pe_core_small_patch16_384": (False, True, "both"),
    "naflexvit_base_patch16_gap": (True, False, "position embedding"),
    "vit_base_patch16_siglip_224": (False, True, "position embedding"),
}


def chart_keys(at: AppTest) -> list[str]:
    return [chart.proto.id for chart in at.get("plotly_chart")]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_app_opens_every_family(name, monkeypatch):
    predictions, pooling, position_text = FAMILIES[name]
    monkeypatch.setenv("VIZAPP_DEFAULT_MODEL", f"random:{name}")
    at = AppTest.from_file(APP, default_timeout=180)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert at.session_state["current"].model.source == name
    subheaders = [s.value for s in at.subheader]
    captions = " ".join(c.value for c in at.caption)
    assert ("Top-5 predictions" in subheaders) == predictions
    if not predictions:
        assert "No class predictions" in captions
    assert ("Attention-pooling head" in subheaders) == pooling
    charts = at.get("plotly_chart")
    assert len(charts) >= 2 + predictions + pooling
    if pooling:  # the probe's map is a patch grid over the image
        spec = at.session_state["current"].spec
        pool_chart = json.loads(charts[1].proto.spec)
        assert "Pooling probe" in pool_chart["layout"]["title"]["text"]
        heatmap = next(t for t in pool_chart["data"] if t.get("type") == "heatmap")
        assert heatmap["dx"] == spec.patch_size[1]

    at.switch_page("views/position/position.py").run()
    assert not at.exception, [e.value for e in at.exception]

    def page_text() -> str:
        return " ".join([c.value for c in at.caption] + [i.body for i in at.info])

    if position_text == "both":  # a learned table and RoPE (EVA-02, PE): both are offered
        kinds = at.radio(key="pos_kind")
        assert list(kinds.options) == ["learned position table (Figure 7)", "rotary features [sin θp, cos θp] (RoPE)"]
        assert "position embedding of patch" in page_text()
        kinds.set_value("rope").run()
        assert not at.exception, [e.value for e in at.exception]
        position_text = "rotary"
    assert position_text in page_text()

    for page in ("views/rollout/rollout.py", "views/filters/filters.py"):
        at.switch_page(page).run()
        assert not at.exception, (page, [e.value for e in at.exception])
        assert not at.error, (page, [e.value for e in at.error])
    if name == "vit_tiny_r_s16_p8_224":  # the filters page says why a hybrid has no pixel filters
        assert "CNN stem" in " ".join(i.body for i in at.info)
