"""The real DINOv2-S-derived backbone (no class head, num_classes 0) is never compared with a
classifier: the rule says why, and the app's Robustness page gives no verdict."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from analysis import label_space, shared_label_space
from analysis.robustness import load_cnn

APP = str(Path(__file__).resolve().parent.parent / "vizapp" / "app.py")


def test_the_real_backbone_has_no_label_space(real_vit_224):
    assert real_vit_224.spec.num_outputs == 0 and real_vit_224.class_names is None
    assert label_space(real_vit_224) is None
    match = shared_label_space(real_vit_224, load_cnn("demo"), ("the ViT", "the CNN"))
    assert not match
    assert (
        match.reason == "The ViT has no class head (it gives features, not classes): there is no prediction to compare."
    )


def test_the_robustness_page_gives_the_real_backbone_no_verdict(real_dinov2_folder, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    at.radio(key="model_source").set_value("local").run()
    at.text_input(key="model_path").input(str(real_dinov2_folder)).run()
    at.switch_page("views/robustness/robustness.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["current"].model.source == str(real_dinov2_folder)
    assert any("no class head" in i.value for i in at.info)
    assert not [m.value for m in at.markdown if "same prediction" in m.value or "prediction changed" in m.value]
    assert "rob_cnn" not in [s.key for s in at.selectbox]
