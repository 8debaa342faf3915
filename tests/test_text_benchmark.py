"""The captioned demo scenes and the text faithfulness benchmark (issue 25, item 4) on the demo CLIP.

The reference for the image–text deletion / insertion curve is an explicit loop over patches
scored by the source model itself (transformers' ``CLIPModel.logits_per_image``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from analysis import load_clip
from analysis.base.assets import asset_path
from analysis.demo.config import scenes_to_tensor
from analysis.demo.text_scenes import caption, caption_words, generate_text_scenes, position_words, render_text_scene
from analysis.faithfulness import RANDOM, area_under_curve, perturbation_curve, text_benchmark
from analysis.faithfulness.__main__ import main as faithfulness_main
from analysis.text import explain_text

SEED = 31


@pytest.fixture(scope="module")
def clip():
    return load_clip("demo_clip", device="cpu")


def test_two_object_scenes_hold_two_different_named_objects_one_per_half_with_disjoint_masks():
    for index in range(40):
        scene = render_text_scene(SEED, index, objects=2)
        a, b = scene.objects
        assert a.label != b.label and a.colour != b.colour
        assert a.mask.any() and b.mask.any() and not (a.mask & b.mask).any()
        # one object per half, along x or along y
        assert (a.centre[0] < 24 < b.centre[0]) or (a.centre[1] < 24 < b.centre[1])
        assert scene.image.shape == (48, 48, 3) and scene.image.dtype == np.uint8
    again = render_text_scene(SEED, 7, objects=2)
    np.testing.assert_array_equal(again.image, render_text_scene(SEED, 7, objects=2).image)
    assert {len(s.objects) for s in generate_text_scenes(30, SEED)} == {1, 2}


def test_position_words_name_the_thirds_of_the_image():
    assert position_words(5, 5, 48) == "top left"
    assert position_words(24, 40, 48) == "bottom"
    assert position_words(40, 24, 48) == "right"
    assert position_words(24, 24, 48) == "middle"
    assert position_words(30, 20, 48) == "middle"  # within a sixth of the side of the centre


def test_every_caption_word_is_in_the_demo_clips_vocabulary(clip):
    rng = np.random.default_rng(0)
    words = set(caption_words())
    for scene in generate_text_scenes(30, SEED):
        for obj in scene.objects:
            text = caption(obj, 48, rng)
            assert set(text.split()) <= words, text
            assert clip.tokenizer.unk_token_id not in clip.tokenize([text])[0][0].tolist()


def _reference_curve(hf_model, ids, pixels, saliency, steps: int, mode: str) -> list[float]:
    """Explicit loop: patches ranked by ``saliency`` (ties by index), the top ``k`` zeroed (the
    mean colour after normalisation) or alone kept, scored by the source model."""
    gh, gw = saliency.shape
    ph, pw = pixels.shape[-2] // gh, pixels.shape[-1] // gw
    flat = saliency.reshape(-1).tolist()
    order = sorted(range(gh * gw), key=lambda i: (-flat[i], i))
    values = []
    for step in range(steps + 1):
        k = round(step / steps * gh * gw)
        x = pixels.clone() if mode == "deletion" else torch.zeros_like(pixels)
        for i in order[:k]:
            r, c = divmod(i, gw)
            x[..., r * ph : (r + 1) * ph, c * pw : (c + 1) * pw] = (
                0 if mode == "deletion" else pixels[..., r * ph : (r + 1) * ph, c * pw : (c + 1) * pw]
            )
        with torch.no_grad():
            values.append(float(hf_model(pixel_values=x, input_ids=ids).logits_per_image[0, 0]))
    return values


@pytest.mark.parametrize("mode", ["deletion", "insertion"])
def test_the_image_text_curve_equals_an_explicit_loop_scored_by_the_source_model(clip, mode):
    import transformers

    hf_model = transformers.CLIPModel.from_pretrained(str(asset_path("demo_clip"))).eval()
    scene = render_text_scene(SEED, 3, objects=2)
    pixels = scenes_to_tensor(scene.image[None])
    prompt = f"a {scene.objects[0].shape}"
    text = clip.encode_text(prompt)
    saliency = explain_text(clip, pixels, prompt, method="chefer").maps[0]
    fractions, values = perturbation_curve(
        clip.image, pixels, saliency, 0, mode=mode, steps=4, value=lambda out: clip.logits(out, text.embeddings)[:, 0]
    )
    ids = clip.tokenize([prompt])[0]
    expected = _reference_curve(hf_model, ids, pixels, saliency, 4, mode)
    np.testing.assert_allclose(values, expected, atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(fractions, np.linspace(0, 1, 5))
    assert values[0] != values[-1]  # removing patches moves the score


def test_the_text_benchmark_scores_each_method_by_its_own_maps_and_curves(clip):
    from PIL import Image

    scenes = generate_text_scenes(3, SEED, objects=2)
    named = [s.objects[i % 2] for i, s in enumerate(scenes)]
    prompts = [f"a {obj.shape}" for obj in named]
    results = text_benchmark(
        clip,
        [Image.fromarray(s.image) for s in scenes],
        prompts,
        [o.mask for o in named],
        methods=["chefer", "patch_text"],
        steps=4,
    )
    assert [r.method for r in results] == [RANDOM, "chefer", "patch_text"]
    chefer = results[1]
    pixels = scenes_to_tensor(scenes[1].image[None])
    saliency = explain_text(clip, pixels, prompts[1], method="chefer").maps[0]
    text = clip.encode_text(prompts[1])
    fractions, values = perturbation_curve(
        clip.image,
        pixels,
        saliency,
        0,
        mode="deletion",
        steps=4,
        value=lambda out: clip.logits(out, text.embeddings)[:, 0],
    )
    assert chefer.values["deletion_auc"][1] == pytest.approx(area_under_curve(fractions, values), abs=1e-6)
    assert all(len(r.values["pointing"]) == 3 and len(r.values["insertion_auc"]) == 3 for r in results)
    assert not results[0].values["sanity_rho"]  # the text benchmark does not run the sanity check


def test_the_command_line_prints_the_text_table(capsys):
    assert faithfulness_main(["--model", "demo_clip", "--n", "2", "--methods", "legrad", "--steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "two-object scenes" in out and "| legrad |" in out and "| random |" in out
    assert "deletion AUC" in out and "sanity" not in out
