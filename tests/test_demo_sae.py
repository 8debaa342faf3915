"""The bundled demo SAE: it loads, reads the demo ViT's point, and its card's held-out FVE and L0
are what a fresh measurement on the same held-out scenes gives."""

from __future__ import annotations

import re

import pytest
import torch

from analysis import load_vit
from analysis.sae import DEMO_SAE_POINT, SAEFolderError, load_demo_sae, load_sae
from analysis.sae.demo import HELD_OUT_SCENES, demo_sae_path, held_out_metrics

#: how far a fresh measurement may sit from the card (the card's 4 decimals, other CPUs' rounding)
TOLERANCE = 0.005


def card_value(card: str, label: str) -> float:
    row = next(line for line in card.splitlines() if line.startswith(f"| {label}"))
    return float(re.findall(r"\d+\.\d+", row.split("|")[2])[0])


def test_the_demo_sae_is_small_reads_the_demo_vit_and_is_sparse():
    folder = demo_sae_path()
    size = sum(p.stat().st_size for p in folder.iterdir())
    assert size < 3 * 2**20, f"the demo SAE's folder weighs {size / 2**20:.1f} MiB"
    sae = load_demo_sae()
    assert sae.config.hook_name == DEMO_SAE_POINT and sae.config.tokens == "patches"
    assert sae.config.architecture == "topk" and sae.config.d_in == load_vit("demo").spec.embed_dim
    assert load_sae(folder).config == sae.config
    norms = sae.W_dec.detach().norm(dim=1)  # unit decoder rows: trained, not random-initialised only
    torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-5, rtol=0)


def test_the_cards_fve_and_l0_match_a_fresh_held_out_measurement():
    card = (demo_sae_path() / "README.md").read_text()
    assert "python -m training.train_demo_sae" in card and f"0–{HELD_OUT_SCENES - 1}" in card
    metrics = held_out_metrics(load_vit("demo"), load_demo_sae())
    assert metrics.images == HELD_OUT_SCENES
    assert metrics.fraction_variance_explained == pytest.approx(card_value(card, "Fraction of variance"), abs=TOLERANCE)
    assert metrics.l0 == pytest.approx(card_value(card, "L0"), abs=TOLERANCE)
    assert metrics.dead_fraction == pytest.approx(card_value(card, "Dead fraction"), abs=TOLERANCE)
    assert metrics.fraction_variance_explained > 0.7  # a useful dictionary, not a random one


def test_a_missing_bundle_is_a_typed_error(monkeypatch, tmp_path):
    import analysis.sae.demo as demo

    monkeypatch.setattr(demo, "demo_sae_path", lambda: tmp_path / "demo_sae")
    with pytest.raises(SAEFolderError, match="train_demo_sae"):
        demo.load_demo_sae()
