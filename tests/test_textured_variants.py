"""The demo models fine-tuned on textured scenes (assets/demo_*_textured, training/train_textured_variants.py):
they open offline by name, keep the plain models' format, their model cards' held-out accuracies hold on
a fresh run (a prefix of the same held-out streams), and they read texture (the texture-only swatches,
whose construction and scoring are checked against hand-written references)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

from analysis import load_vit
from analysis.base.assets import asset_path
from analysis.base.errors import AnalysisError
from analysis.demo.cue_conflict import class_texture, texture_swatch, texture_swatches, textured_scenes
from analysis.demo.data import CLASS_NAMES, generate_samples
from analysis.demo.evaluate import DEFAULT_EVAL_SEED, cue_accuracies
from analysis.model.loading import DEMO_MODELS, TEXTURED_DEMO_MODELS
from analysis.robustness import DEMO_CNNS, TEXTURED_DEMO_CNNS, load_cnn
from tests.test_app import app  # noqa: F401 - the app fixture

# variant folder -> (its plain model's folder, how the library loads it)
VARIANTS = {
    "demo_vit_textured": ("demo_vit", lambda: load_vit("demo_textured", device="cpu")),
    "demo_cnn_textured": ("demo_cnn", lambda: load_cnn("demo_textured", device="cpu")),
    "demo_swin_textured": ("demo_swin", lambda: load_vit("demo_swin_textured", device="cpu")),
}
PLAIN = {
    "demo_vit_textured": lambda: load_vit("demo", device="cpu"),
    "demo_cnn_textured": lambda: load_cnn("demo", device="cpu"),
    "demo_swin_textured": lambda: load_vit("demo_swin", device="cpu"),
}
CARD_ROWS = {"plain": "plain scenes", "textured": "textured scenes", "texture_only": "texture only"}
FRESH_N = 300  # a prefix of the cards' 2,000 images of each kind
TOLERANCE = 0.05


class _Loaded(dict):
    """Each variant loaded on first use (one module-wide copy)."""

    def __missing__(self, folder):
        self[folder] = VARIANTS[folder][1]()
        return self[folder]


@pytest.fixture(scope="module")
def variants():
    return _Loaded()


def card_accuracies(folder: str) -> dict[str, float]:
    """The textured variant's column of the card's held-out table: ``| plain scenes | 0.950 | 0.920 |``."""
    card = (asset_path(folder) / "MODEL_CARD.md").read_text()
    found = {}
    for key, row in CARD_ROWS.items():
        match = re.search(rf"^\| {row}[^|]*\| \*\*([0-9.]+)\*\* \|", card, flags=re.M)
        assert match, f"{folder}/MODEL_CARD.md has no '{row}' row"
        found[key] = float(match.group(1))
    return found


def test_the_variants_are_registered_under_one_name_each():
    assert TEXTURED_DEMO_MODELS == {"demo": "demo_textured", "demo_swin": "demo_swin_textured"}
    assert TEXTURED_DEMO_CNNS == {"demo": "demo_textured"}
    assert DEMO_MODELS["demo_textured"][0] == asset_path("demo_vit_textured")
    assert DEMO_MODELS["demo_swin_textured"][0] == asset_path("demo_swin_textured")
    assert DEMO_CNNS["demo_textured"] == asset_path("demo_cnn_textured")


@pytest.mark.parametrize("folder", list(VARIANTS))
def test_each_variant_has_its_plain_models_format_in_half_the_bytes(folder, variants):
    """The plain model's config.json, the same tensors (float16 on disk), a model card; loaded, the
    parameters are float32 and the outputs those of the float16 state dict loaded by hand."""
    from safetensors.torch import load_file

    plain, here = asset_path(VARIANTS[folder][0]), asset_path(folder)
    assert sorted(p.name for p in here.iterdir()) == ["MODEL_CARD.md", "config.json", "model.safetensors"]
    assert json.loads((here / "config.json").read_text()) == json.loads((plain / "config.json").read_text())
    ours, theirs = load_file(str(here / "model.safetensors")), load_file(str(plain / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in ours.items()} == {k: tuple(v.shape) for k, v in theirs.items()}
    assert all(
        v.dtype == (torch.float16 if theirs[k].is_floating_point() else theirs[k].dtype) for k, v in ours.items()
    )
    assert (here / "model.safetensors").stat().st_size < 0.6 * (plain / "model.safetensors").stat().st_size
    model = variants[folder]
    assert all(p.dtype == torch.float32 for p in model.model.parameters())
    by_hand = {k: v.float() if v.is_floating_point() else v for k, v in ours.items()}
    for name, tensor in model.model.state_dict().items():
        assert torch.equal(tensor, by_hand[name]), name
    assert list(model.class_names) == CLASS_NAMES


@pytest.mark.parametrize("folder", list(VARIANTS))
def test_the_cards_held_out_accuracies_hold_on_a_fresh_run(folder, variants):
    """Plain, textured and texture-only accuracy of a fresh run on the first 300 images of the cards'
    held-out streams (seed 2026) within 0.05 of the card's 2,000-image numbers; and what fine-tuning
    taught, against the plain model on the same images: the textured scenes (+0.3 at least) and the
    texture without a shape (above chance, 1/6, and above the plain model)."""
    card = card_accuracies(folder)
    fresh = cue_accuracies(variants[folder], FRESH_N, DEFAULT_EVAL_SEED)
    for key, value in card.items():
        assert abs(fresh[key] - value) <= TOLERANCE, (folder, key, fresh[key], value)
    before = cue_accuracies(PLAIN[folder](), FRESH_N, DEFAULT_EVAL_SEED)
    assert fresh["textured"] > before["textured"] + 0.3, (fresh, before)
    assert fresh["texture_only"] > max(1 / 6, before["texture_only"]) + 0.03, (fresh, before)
    assert fresh["plain"] > before["plain"] - 0.05, (fresh, before)


def test_cue_accuracies_equal_a_per_image_loop_of_the_models_forward():
    cnn = load_cnn("demo", device="cpu")
    n = 12
    images, labels, _ = generate_samples(n, 5)
    textured, swatches = textured_scenes(n, 5), texture_swatches(n, 5)

    def loop(pictures, truth) -> float:
        hits = 0
        for picture, label in zip(pictures, truth):
            with torch.no_grad():
                hits += int(cnn.model(cnn.preprocess(picture)).argmax(-1)[0]) == label
        return hits / len(truth)

    expected = {
        "plain": loop(images, labels),
        "textured": loop([Image.fromarray(s.image) for s in textured], [s.shape_class for s in textured]),
        "texture_only": loop([Image.fromarray(s.image) for s in swatches], [s.texture_class for s in swatches]),
    }
    assert cue_accuracies(cnn, n, 5) == pytest.approx(expected, abs=1e-12)


def test_a_swatch_is_its_documented_construction():
    """Rebuilt by hand from the documented draws of stream (seed, index, 4): the class, the ground colour,
    a second colour at least 70 away, the phase, then the texture over the whole frame and the noise."""
    for index in range(6):
        swatch = texture_swatch(9, index)
        rng = np.random.default_rng((9, index, 4))
        texture = int(rng.integers(0, len(CLASS_NAMES)))
        ground = rng.integers(0, 256, size=3)
        for _ in range(8):
            ink = rng.integers(0, 256, size=3)
            if np.abs(ink - ground).max() >= 70:
                break
        else:
            ink = np.where(ground < 128, 255, 0)
        phase = rng.uniform(0, 48 / 8, size=2)
        clean = class_texture(texture, 48, colours=(ground, ink), phase=tuple(phase)).astype(np.float32)
        expected = np.clip(clean + rng.normal(0, 6.0, size=clean.shape).astype(np.float32), 0, 255).astype(np.uint8)
        assert swatch.texture_class == texture and np.array_equal(swatch.image, expected)
        assert np.abs(ink.astype(int) - ground.astype(int)).max() >= 70
    assert [s.texture_class for s in texture_swatches(40, 9)][:6] == [
        texture_swatch(9, i).texture_class for i in range(6)
    ]
    assert {s.texture_class for s in texture_swatches(40, 9)} == set(range(len(CLASS_NAMES)))
    with pytest.raises(AnalysisError, match="whole number"):
        texture_swatches(-1, 0)


def test_a_half_turn_leaves_or_turns_each_image_and_a_short_run_writes_a_loadable_variant(tmp_path):
    from training.train_textured_variants import half_turn, train_variant

    x = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).view(2 * 1, 3, 4, 4).repeat(4, 1, 1, 1)  # (8, 3, 4, 4)
    turned = half_turn(x, torch.Generator().manual_seed(0))
    for original, result in zip(x, turned):
        assert torch.equal(result, original) or torch.equal(result, torch.rot90(original, 2, dims=(-2, -1)))
    assert any(not torch.equal(a, b) for a, b in zip(x, turned)) and any(torch.equal(a, b) for a, b in zip(x, turned))

    summary = train_variant(
        "cnn", tmp_path / "cnn", steps=2, pool=16, batch_size=8, val_size=8, eval_size=0, log=lambda _: None
    )
    assert summary["steps"] == 2
    loaded = load_cnn(str(tmp_path / "cnn"), device="cpu")
    assert list(loaded.class_names) == CLASS_NAMES


def test_the_app_offers_the_textured_variants_as_second_models(app):  # noqa: F811 - app: the fixture
    """Attention distance lists the textured ViT and Swin among its comparison models and draws the
    textured ViT's distances (the library's) when picked."""
    import analysis
    from tests.test_app import DEMO_PRESENT, array, assert_clean, charts, first_sample, traces

    if not DEMO_PRESENT:
        pytest.skip("needs the bundled demo models (assets/)")
    app.switch_page("views/distance/distance.py").run()
    choices = app.selectbox(key="dist_model2").options
    assert sum("trained on textured scenes too" in option for option in choices) == 2, choices
    app.selectbox(key="dist_model2").set_value("demo_textured").run()
    assert_clean(app)
    vit = analysis.load_vit("demo_textured")
    record = analysis.capture_attention(vit, vit.preprocess(analysis.load_image(first_sample())))
    expected = np.sort(analysis.mean_attention_distance(record).numpy().ravel())
    drawn = [
        array(t["y"]).astype(np.float64) for t in traces(charts(app)[0], "scatter") if "demo_textured" in t["name"]
    ]
    assert drawn, [t["name"] for t in traces(charts(app)[0], "scatter")]
    np.testing.assert_allclose(np.sort(drawn[0]), expected, rtol=1e-4)


def test_a_missing_textured_cnn_says_how_to_train_it_again(monkeypatch, tmp_path):
    from analysis.base.errors import ModelLoadError
    from analysis.robustness import cnn

    monkeypatch.setitem(cnn.DEMO_CNNS, "demo_textured", tmp_path / "gone")
    with pytest.raises(ModelLoadError, match="train_textured_variants --model cnn"):
        load_cnn("demo_textured")
