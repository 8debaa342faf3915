"""One layer protocol for every family: ``ViTSpec.geometries()`` gives each layer's geometry, a
ViT's as one global window, so code that sizes or draws a layer need not ask whether the model
is windowed. Checked against the former two-branch formulas on a ViT and a Swin."""

from __future__ import annotations

from conftest import make_vit
from vizapp.resources import record_dtype
from windowed_models import small_swin


def test_a_vits_layers_are_one_window_of_every_token():
    spec = make_vit("registers").spec
    geometries = spec.geometries()
    assert len(geometries) == spec.num_layers and all(g == spec.geometry(i) for i, g in enumerate(geometries))
    for g in geometries:
        assert (g.num_windows, g.window_tokens, g.num_heads, tuple(g.stride)) == (
            1,
            spec.num_tokens,
            spec.num_heads,
            tuple(spec.patch_size),
        )
    entries = sum(g.num_windows * g.num_heads * g.window_tokens**2 for g in geometries)
    assert entries == spec.num_layers * spec.num_heads * spec.num_tokens**2  # the former ViT branch


def test_a_windowed_models_layers_are_its_own():
    spec = small_swin().spec
    assert spec.geometries() == spec.layer_geometry


def test_the_record_dtype_reads_every_layer_through_its_geometry(monkeypatch):
    """float16 exactly when the float32 record (Σ windows·heads·Wt² entries · 4 bytes) is over the limit."""
    import torch

    from vizapp import resources

    for spec in (make_vit("class_token").spec, small_swin().spec):
        entries = sum(g.num_windows * g.num_heads * g.window_tokens**2 for g in spec.layer_geometry) or (
            spec.num_layers * spec.num_heads * spec.num_tokens**2
        )
        monkeypatch.setattr(resources, "FLOAT16_RECORD_BYTES", 4 * entries)
        assert record_dtype(spec) == torch.float32
        monkeypatch.setattr(resources, "FLOAT16_RECORD_BYTES", 4 * entries - 1)
        assert record_dtype(spec) == torch.float16


def test_the_logit_lens_reads_every_layer_of_a_vit_and_the_last_stage_of_a_swin():
    from analysis.tokens import logit_lens_layers

    vit = make_vit("class_token")
    assert logit_lens_layers(vit) == tuple(range(vit.spec.num_layers))
    swin = small_swin().spec
    last = [layer for layer, g in enumerate(swin.layer_geometry) if g.stage == swin.layer_geometry[-1].stage]
    assert logit_lens_layers(swin) == tuple(last) and len(last) < swin.num_layers
