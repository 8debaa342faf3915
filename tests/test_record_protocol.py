"""One record for every family: an analysis asks the spec, its geometry or its record, and only the
record, geometry and adapter modules ask whether a model is windowed.

The guard reads every ``.py`` under ``analysis/``: ``is_windowed`` may appear only in the modules
listed in :data:`ALLOWED`, where the global and the windowed implementations live. Everywhere else
a refusal goes through ``require_global_attention`` and a dispatch asks ``spec.attends_globally``,
``spec.window_geometry(layer)``, ``spec.max_layer_heads`` or the record's type.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from analysis.base.errors import AnalysisError
from analysis.model.geometry import LayerGeometry, ViTSpec
from analysis.model.windowed_support import refuse_windowed, require_global_attention, windowed_message

REPO = Path(__file__).resolve().parent.parent
ANALYSIS = REPO / "analysis"

# The record, geometry, spec and windowed modules and the adapters, relative to analysis/.
ALLOWED_FILES = frozenset(
    {
        "records/attention.py",
        "records/windowed.py",
        "model/geometry.py",
        "model/spec.py",
        "model/windowed_support.py",
    }
)
ALLOWED_PACKAGES = ("model/adapters/",)


def files_asking_is_windowed(root: Path) -> list[str]:
    """``path:line`` (relative to ``root``) of every ``is_windowed`` outside the allowed modules."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative in ALLOWED_FILES or relative.startswith(ALLOWED_PACKAGES):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if re.search(r"\bis_windowed\b", line):
                found.append(f"{relative}:{number}")
    return found


def test_only_record_geometry_and_adapter_modules_ask_is_windowed():
    assert files_asking_is_windowed(ANALYSIS) == [], (
        "ask spec.attends_globally / spec.window_geometry(layer) / the record's type, or refuse with "
        "analysis.model.windowed_support.require_global_attention"
    )


def test_the_guard_sees_a_stray_is_windowed(tmp_path):
    (tmp_path / "model" / "adapters").mkdir(parents=True)
    (tmp_path / "model" / "adapters" / "swin.py").write_text("x = spec.is_windowed\n")
    (tmp_path / "model" / "geometry.py").write_text("x = spec.is_windowed\n")
    (tmp_path / "tokens").mkdir()
    (tmp_path / "tokens" / "capture.py").write_text("a = 1\nif spec.is_windowed:\n    pass\n")
    assert files_asking_is_windowed(tmp_path) == ["tokens/capture.py:2"]


def _vit_spec(**extra) -> ViTSpec:
    return ViTSpec(
        patch_size=(4, 4),
        grid_size=(3, 5),
        num_prefix_tokens=1,
        num_layers=2,
        num_heads=3,
        embed_dim=12,
        img_size=(12, 20),
        has_class_token=True,
        **extra,
    )


def _windowed_spec() -> ViTSpec:
    geometries = (
        LayerGeometry(stage=0, grid_size=(8, 8), stride=(4, 4), window_size=(4, 4), num_heads=2),
        LayerGeometry(stage=1, grid_size=(4, 4), stride=(8, 8), window_size=(4, 4), num_heads=5),
    )
    return _vit_spec(family="SwinTransformer", layer_geometry=geometries)


def test_spec_questions_for_a_vit_and_a_windowed_model():
    vit, windowed = _vit_spec(), _windowed_spec()
    assert vit.attends_globally and not windowed.attends_globally
    assert vit.attends_globally is not vit.is_windowed and windowed.attends_globally is not windowed.is_windowed
    assert vit.max_layer_heads == 3  # the spec's heads
    assert windowed.max_layer_heads == max(2, 5)  # the most of any stage
    assert [vit.window_geometry(layer) for layer in range(2)] == [None, None]
    assert [windowed.window_geometry(layer) for layer in range(2)] == list(windowed.layer_geometry)


class _PatchError(AnalysisError):
    pass


def test_require_global_attention_raises_the_callers_error_for_windowed_models_only():
    vit, windowed = _vit_spec(), _windowed_spec()

    class Loaded:  # a LoadedViT or a record: anything with a spec
        spec = windowed

    for value in (vit, type("L", (), {"spec": vit})(), torch.zeros(2), None):
        require_global_attention(value, lambda spec: _PatchError("never"))  # a ViT or no spec: nothing
    for value in (windowed, Loaded()):
        with pytest.raises(_PatchError, match=r"^SwinTransformer attends in windows$"):
            require_global_attention(value, lambda spec: _PatchError(f"{spec.family} attends in windows"))
    with pytest.raises(AnalysisError) as caught:
        refuse_windowed(Loaded(), "feature X")
    assert str(caught.value) == windowed_message("feature X", "SwinTransformer")


def test_both_records_answer_the_protocol_with_their_own_layouts():
    import sys

    sys.path.insert(0, str(REPO / "tests"))
    from analysis import capture_attention, load_vit
    from analysis.records.attention import AttentionRecord, AttentionRecordProtocol
    from analysis.records.windowed import WindowedAttentionRecord
    from windowed_models import small_pixels, small_swin

    vit = load_vit("demo")
    pixels = torch.zeros(1, 3, *vit.spec.img_size)
    record = capture_attention(vit, pixels, layers=[1, 3])
    assert isinstance(record, AttentionRecord) and isinstance(record, AttentionRecordProtocol)
    assert torch.equal(record.layer_maps(3), record.attentions[1])  # layer 3 is the second captured
    assert record.geometry(3) == vit.spec.geometry(3) and record.geometry(3).is_global
    with pytest.raises(AnalysisError, match="Layer 2 was not captured"):
        record.layer_maps(2)

    swin = small_swin()
    windowed = capture_attention(swin, small_pixels(), layers=[0, 3])
    assert isinstance(windowed, WindowedAttentionRecord) and isinstance(windowed, AttentionRecordProtocol)
    assert windowed.layer_maps(3) is windowed.windows[1]
    assert windowed.geometry(-1) == swin.spec.layer_geometry[3] == windowed.geometry(3)
    assert windowed.geometry(0).grid_size != windowed.geometry(3).grid_size  # a stage grid per layer
