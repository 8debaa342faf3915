"""The bundled demo CLIP (assets/demo_clip, ``training/train_demo_clip.py``) on held-out captioned scenes.

Acceptance (issue 25): zero-shot accuracy over the six class prompts ≥ 0.85 on single-object
scenes, and on two-object scenes the ``chefer`` / ``legrad`` map of a prompt naming one object
points inside that object (pointing game on the patch grid) ≥ 80 % of the time. The scenes
come from seed 2026, which training never saw (it used seeds 0 and 1).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from analysis import load_clip
from analysis.base.assets import asset_path
from analysis.base.errors import ModelLoadError
from analysis.demo.config import scenes_to_tensor
from analysis.demo.data import CLASS_NAMES
from analysis.demo.text_scenes import CLASS_PROMPTS, generate_text_scenes, position_words
from analysis.faithfulness import patch_mask, pointing_score
from analysis.text import explain_text, zero_shot

SEED = 2026  # held out: training used seeds 0 (scenes) and 1 (progress)
N_SINGLE, N_PAIRS = 300, 100
RETRIEVAL_FLOOR = 0.05  # measured 0.07 (chance 0.01): see the model card
POINTING_FLOORS = {"chefer": 0.8, "legrad": 0.6}  # measured 0.83 and 0.645: see the model card


@pytest.fixture(scope="module")
def clip():
    return load_clip("demo_clip", device="cpu")


@pytest.fixture(scope="module")
def pairs():
    scenes = generate_text_scenes(N_PAIRS, SEED, objects=2)
    return scenes, scenes_to_tensor(np.stack([s.image for s in scenes]))


def test_the_bundled_demo_clip_is_small_has_its_tokenizer_and_reads_the_scenes_as_training_did(clip):
    folder = asset_path("demo_clip")
    assert sum(f.stat().st_size for f in folder.iterdir()) < 10 * 2**20
    assert (folder / "MODEL_CARD.md").is_file()
    assert clip.tokenizer is not None and clip.probability == "softmax" and clip.logit_bias is None
    assert load_clip("demo-clip", device="cpu").context_length == clip.context_length
    ids, _, notices = clip.tokenize(["A Red STAR on the top left"])
    assert notices == () and ids.tolist() == clip.tokenize(["a red star on the top left"])[0].tolist()
    assert clip.tokenizer.unk_token_id not in ids[0].tolist()
    scene = generate_text_scenes(1, SEED)[0]
    from PIL import Image

    torch.testing.assert_close(
        clip.preprocess(Image.fromarray(scene.image)), scenes_to_tensor(scene.image[None]), atol=1e-5, rtol=0
    )


def test_a_missing_demo_clip_says_how_to_get_it_back(monkeypatch, tmp_path):
    import analysis.base.assets as assets

    monkeypatch.setattr(assets, "assets_dir", lambda: tmp_path)
    with pytest.raises(ModelLoadError, match="train_demo_clip"):
        load_clip("demo_clip", device="cpu")


def test_zero_shot_accuracy_over_the_class_prompts_is_at_least_0_85(clip):
    scenes = generate_text_scenes(N_SINGLE, SEED, objects=1)
    pixels = scenes_to_tensor(np.stack([s.image for s in scenes]))
    labels = np.array([s.objects[0].label for s in scenes])
    result = zero_shot(clip, pixels, CLASS_PROMPTS)
    accuracy = float((result.probabilities.argmax(-1).numpy() == labels).mean())
    assert accuracy >= 0.85, accuracy


def _full_caption(obj) -> str:
    return f"a {obj.colour} {obj.shape} on the {position_words(*obj.centre, 48)}"


def test_on_two_object_scenes_the_full_caption_of_either_object_matches_its_scene(clip, pairs):
    """Retrieval among the 2·N full captions ("a red star on the left") of the two-object scenes:
    each scene's best caption is one of its own two (chance: 2 / 2N = 0.01). The model binds colour and
    position to shape only weakly (measured 0.07), so this guards that level, not a target."""
    scenes, pixels = pairs
    captions = [_full_caption(obj) for s in scenes for obj in s.objects]  # scene i owns 2i and 2i + 1
    best = zero_shot(clip, pixels, captions).logits.argmax(-1).numpy() // 2  # (N,)
    assert (best == np.arange(len(scenes))).mean() >= RETRIEVAL_FLOOR


def _pointing(clip, pairs, method: str) -> tuple[float, float]:
    """``(pointing game, chance)`` of ``method``'s map of ``"a {shape}"`` over every object of the
    two-object scenes; chance is the mean share of the grid the named object covers (what a
    uniformly random map scores)."""
    scenes, pixels = pairs
    spec = clip.image.spec
    scores, shares = [], []
    for label, name in enumerate(CLASS_NAMES):  # one prompt per class, over every scene that holds it
        rows = [(i, obj) for i, s in enumerate(scenes) for obj in s.objects if obj.label == label]
        if not rows:
            continue
        maps = explain_text(clip, pixels[[i for i, _ in rows]], f"a {name}", method=method).maps  # (R, gh, gw)
        truth = patch_mask(np.stack([obj.mask for _, obj in rows]), spec.patch_size, spec.grid_size)  # (R, gh, gw)
        scores.extend(pointing_score(maps, truth).tolist())
        shares.extend(truth.mean((-2, -1)).tolist())
    assert len(scores) == 2 * len(scenes)
    return float(np.mean(scores)), float(np.mean(shares))


@pytest.mark.parametrize("method, floor", POINTING_FLOORS.items())
def test_the_map_of_a_prompt_naming_one_of_two_objects_points_at_it_well_above_chance(clip, pairs, method, floor):
    """The measured level (assets/demo_clip/MODEL_CARD.md), a regression guard."""
    score, chance = _pointing(clip, pairs, method)
    assert score >= floor and score >= 2 * chance, (method, score, chance)


def test_the_chefer_or_legrad_map_points_inside_the_named_object_at_least_80_percent_of_the_time(clip, pairs):
    best = max(_pointing(clip, pairs, method)[0] for method in ("chefer", "legrad"))
    assert best >= 0.8, best
