"""The Robustness page's adversarial-attack, natural-corruption and texture sections: the drawn values against
the library's own results, on the bundled demo ViT, CNN and Swin."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

import analysis
from analysis.robustness import (
    attack,
    attack_curve,
    corruption_curve,
    corruption_errors,
    load_cnn,
    remove_texture,
    shape_bias_of,
    texture_curve,
    transfer_matrix,
)
from tests.test_app import (  # noqa: F401 - app: fixture
    DEMO_PRESENT,
    app,
    array,
    assert_clean,
    chart,
    first_sample,
    traces,
)

pytestmark = pytest.mark.skipif(not DEMO_PRESENT, reason="needs the bundled demo models (assets/)")


def _models():
    return {"ViT": analysis.load_vit("demo"), "CNN": load_cnn("demo"), "Swin": analysis.load_vit("demo_swin")}


def _samples():
    from vizapp.inputs import sample_paths

    return [analysis.load_image(p) for p in sample_paths()]  # the page's order


def _top1(model, images) -> list[int]:
    with torch.no_grad():
        return model.model(torch.cat([model.preprocess(i) for i in images])).argmax(-1).tolist()


def test_the_attack_on_this_image_and_over_the_set_are_the_librarys(app):
    app.switch_page("views/robustness/robustness.py").run()
    assert_clean(app)
    app.toggle(key="rob_curves").set_value(False)  # the drop curves are tested elsewhere
    app.number_input(key="rob_steps").set_value(2).run()
    assert_clean(app)
    vit = analysis.load_vit("demo")
    image = analysis.load_image(first_sample())
    pixels = vit.preprocess(image)
    clean = vit.model(pixels).argmax(-1)
    adversarial = attack("pgd", vit, pixels, clean, epsilon=4.0, steps=2, seed=0)
    probabilities = vit.model(adversarial).softmax(-1)[0]
    best = int(probabilities.argmax())
    text = next(m.value for m in app.markdown if "**ViT adversarial:**" in m.value)
    assert f"**ViT adversarial:** {vit.class_names[best]} · {float(probabilities[best]):.1%}" in text

    app.button(key="rob_attack_run").click().run()
    assert_clean(app)
    models, images = _models(), _samples()
    drawn = {t["name"]: array(t["y"]) for t in traces(chart(app, "rob_attack_chart"), "scatter")}
    assert set(drawn) == {"ViT", "CNN", "Swin"}  # the demo Swin beside the demo pair, one chart
    for name, model in models.items():
        expected = attack_curve({name: model}, images, _top1(model, images), epsilons=(0, 1, 2, 4, 8), steps=2, seed=0)
        np.testing.assert_allclose(drawn[name], expected.accuracy[name], atol=1e-6)
        assert drawn[name][0] == 1.0
    # the transfer matrix: over the images where every model predicts the same clean class
    predictions = np.array([_top1(m, images) for m in models.values()])
    agreed = [i for i in range(len(images)) if len(set(predictions[:, i])) == 1]
    _, matrix = transfer_matrix(
        models, [images[i] for i in agreed], [int(predictions[0, i]) for i in agreed], epsilon=4.0, steps=2, seed=0
    )
    (heatmap,) = traces(chart(app, "rob_transfer_chart"), "heatmap")
    np.testing.assert_allclose(array(heatmap["z"]), matrix, atol=1e-6)


def test_a_negative_epsilon_cannot_be_entered_and_zero_keeps_every_prediction(app, monkeypatch):
    import streamlit

    widths = {}  # caption -> the width the page asked for (AppTest keeps no width)
    original = streamlit.image

    def recorded(image, caption=None, width="content", **options):
        for text in caption if isinstance(caption, list) else [caption]:
            widths[str(text)] = width
        return original(image, caption=caption, width=width, **options)

    monkeypatch.setattr(streamlit, "image", recorded)
    app.switch_page("views/robustness/robustness.py").run()
    app.toggle(key="rob_curves").set_value(False)
    field = app.number_input(key="rob_epsilon")
    assert field.min == 0.0  # the field stops at 0
    field.set_value(-1.0).run()
    assert_clean(app)
    assert app.number_input(key="rob_epsilon").value == 0.0 and not app.error
    attacked = [m.value for m in app.markdown if "adversarial:**" in m.value]
    assert len(attacked) == 3 and all(m.endswith("(kept)") for m in attacked), attacked  # ViT, CNN, Swin
    # each adversarial picture and its perturbation beside its numbers, not the page wide (it was ~1000 px)
    pictures = {c: w for c, w in widths.items() if "adversarial, ε" in c or c.startswith("perturbation (grey")}
    assert len(pictures) >= 4 and set(pictures.values()) == {320}, pictures


@pytest.mark.skipif(importlib.util.find_spec("imagecorruptions") is None, reason="needs the corruptions extra")
def test_the_corruption_curves_and_the_mce_are_the_librarys(app):
    app.switch_page("views/robustness/robustness.py").run()
    app.toggle(key="rob_curves").set_value(False)
    app.multiselect(key="rob_corruption_set").set_value(["gaussian_noise", "pixelate"]).run()
    assert_clean(app)
    app.button(key="rob_corruption_run").click().run()
    assert_clean(app)
    models, images = _models(), _samples()
    curve = corruption_curve(models, images, None, corruptions=("gaussian_noise", "pixelate"))  # image i: seed 0 + i
    drawn = {t["name"]: array(t["y"]) for t in traces(chart(app, "rob_corruption_chart"), "scatter")}
    for name in models:
        np.testing.assert_allclose(drawn[name], curve.accuracy[name].mean(0), atol=1e-6)
        assert drawn[name][0] == 1.0  # severity 0: each model's own clean prediction
    errors = corruption_errors(curve, "CNN")
    text = next(m.value for m in app.markdown if m.value.startswith("**Mean corruption error"))
    assert f"ViT {errors['ViT'][1]:.3f}" in text and "CNN 1.000" in text


def test_without_the_corruptions_package_the_section_says_how_to_install_it(app, monkeypatch):
    from analysis.robustness import corruptions

    def missing():
        raise corruptions.CorruptionsUnavailableError(
            'Natural corruptions need the optional imagecorruptions package: pip install "vit-explorer[corruptions]".'
        )

    monkeypatch.setattr(corruptions, "_package", missing)
    app.switch_page("views/robustness/robustness.py").run()
    app.toggle(key="rob_curves").set_value(False).run()
    assert_clean(app)
    shown = [i.value.replace("\\", "") for i in app.info]  # markdown escapes dropped
    assert any('pip install "vit-explorer[corruptions]"' in text for text in shown), shown
    assert not app.get("multiselect") or all(m.key != "rob_corruption_set" for m in app.multiselect)


def test_the_texture_probes_and_the_shape_bias_are_the_librarys(app):
    """This image's edge map and each model's prediction on it; over the samples, each model's agreement
    with its own clean prediction on each probe; the shape bias over the page's cue-conflict scenes."""
    from analysis.demo.cue_conflict import cue_conflict_scenes
    from vizapp.views.robustness.sections import CUE_CONFLICT_SCENES

    app.switch_page("views/robustness/robustness.py").run()
    app.toggle(key="rob_curves").set_value(False)
    app.radio(key="rob_texture_probe").set_value("edges").run()
    assert_clean(app)
    models, images = _models(), _samples()
    vit = models["ViT"]
    edges = remove_texture(analysis.load_image(first_sample()), "edges")
    probabilities = vit.model(vit.preprocess(edges)).softmax(-1)[0]
    best = int(probabilities.argmax())
    # the last of the sections' "**ViT:** … · **CNN:** …" lines (the corruption section draws one above)
    text = [m.value for m in app.markdown if m.value.startswith("**ViT:**") and "**CNN:**" in m.value][-1]
    assert text.startswith(f"**ViT:** {vit.class_names[best]} · {float(probabilities[best]):.1%}")

    app.button(key="rob_texture_run").click().run()
    assert_clean(app)
    drawn = {t["name"]: array(t["y"]) for t in traces(chart(app, "rob_texture_chart"), "bar")}
    assert set(drawn) == {"ViT", "CNN", "Swin"}
    for name, model in models.items():
        expected = texture_curve({name: model}, images, _top1(model, images), probes=("edges", "kuwahara"))
        np.testing.assert_allclose(drawn[name], expected.accuracy[name], atol=1e-6)

    app.button(key="rob_shape_bias_run").click().run()
    assert_clean(app)
    assert traces(chart(app, "rob_texture_chart"), "bar")  # the probes' results stay after another button
    seed = int(app.session_state["rob_seed"]) if "rob_seed" in app.session_state else 0
    # by default the textured variants of the page's bundled demo models; on request the page's models
    textured = {
        "ViT (textured)": analysis.load_vit("demo_textured"),
        "CNN (textured)": load_cnn("demo_textured"),
        "Swin (textured)": analysis.load_vit("demo_swin_textured"),
    }
    assert app.radio(key="rob_shape_bias_models").value == "textured"  # the default
    for choice, judged in (("textured", textured), ("page", models)):
        app.radio(key="rob_shape_bias_models").set_value(choice).run()
        assert_clean(app)
        biases = shape_bias_of(judged, cue_conflict_scenes(CUE_CONFLICT_SCENES, seed))
        drawn = {t["name"]: array(t["y"]) for t in traces(chart(app, "rob_shape_bias_chart"), "bar")}
        assert set(drawn) == set(biases)
        for name, bias in biases.items():
            np.testing.assert_allclose(drawn[name], [bias.fraction], atol=1e-9)
        counts = next(m.value for m in app.markdown if "shape," in m.value and "neither" in m.value)
        first = next(iter(biases))
        assert f"**{first}:** {biases[first].shape} shape, {biases[first].texture} texture" in counts
        named = any("`demo_textured`" in c.value and "`demo_swin_textured`" in c.value for c in app.caption)
        assert named == (choice == "textured")  # the page says which models it measured


def test_the_patch_curves_transfer_and_attention_share_are_the_librarys(app, monkeypatch):
    """After "Train the patches": each model's accuracy with its own patch and with the noise patch per
    share (and the margins at the largest share), the transfer matrix of the largest patches, and the ViT's
    class-token attention share on its patch pasted at this image's centre, all equal to analysis.robustness
    on the same demo scenes (fewer of them, and fewer steps, than the page trains with, to keep the test
    short); then a targeted run, whose target-hit rates the page states."""
    from analysis.robustness import demo_patch_scenes, patch_attention_share, patch_size_curve, patch_transfer_matrix
    from vizapp.views.robustness import sections

    monkeypatch.setattr(sections, "PATCH_TRAIN_SCENES", 8)
    monkeypatch.setattr(sections, "PATCH_HELD_OUT_SCENES", 12)
    monkeypatch.setattr(sections, "PATCH_STEPS", 2)
    monkeypatch.setattr(sections, "PATCH_BATCH_SIZE", 4)

    app.switch_page("views/robustness/robustness.py").run()
    app.toggle(key="rob_curves").set_value(False).run()
    app.button(key="rob_patch_run").click().run()
    assert_clean(app)
    seed = int(app.session_state["rob_seed"]) if "rob_seed" in app.session_state else 0

    models = _models()
    scenes = demo_patch_scenes(sections.PATCH_HELD_OUT_SCENES, seed, train_scenes=sections.PATCH_TRAIN_SCENES)
    held, held_labels = scenes.held_out_images, scenes.held_out_labels

    def curve_of(target):
        return patch_size_curve(
            models, scenes.train_images, scenes.train_labels, shares=sections.PATCH_SHARES, eval_images=held,
            eval_labels=held_labels, target=target, steps=sections.PATCH_STEPS,
            batch_size=sections.PATCH_BATCH_SIZE, seed=seed,
        )  # fmt: skip

    curve = curve_of(None)
    drawn = {t["name"]: array(t["y"]) for t in traces(chart(app, "rob_patch_chart"), "scatter")}
    for name in models:
        np.testing.assert_allclose(drawn[name], curve.accuracy[name], atol=1e-9)
        np.testing.assert_allclose(drawn[f"{name}, noise patch"], curve.noise_accuracy[name], atol=1e-9)
        own, noise = curve.accuracy[name][-1], curve.noise_accuracy[name][-1]
        stated = f"**{name}:** accuracy {own:.3f} with its own 10% patch, {noise:.3f} with the noise patch"
        assert any(stated in m.value and f"({100 * (noise - own):+.1f} points)" in m.value for m in app.markdown)
    assert not any("predicted as" in m.value for m in app.markdown)  # untargeted: no target-hit rate
    largest = {name: patches[-1] for name, patches in curve.patches.items()}
    _, matrix = patch_transfer_matrix(models, largest, held, held_labels, seed=seed + 1)
    (heatmap,) = traces(chart(app, "rob_patch_transfer_chart"), "heatmap")
    np.testing.assert_allclose(array(heatmap["z"]), matrix, atol=1e-9)
    vit, patch = models["ViT"], largest["ViT"]
    side, (height, width) = patch.side, vit.spec.img_size
    share = patch_attention_share(
        vit, [analysis.load_image(first_sample())], patch, ((height - side) // 2, (width - side) // 2)
    )
    drawn = {t["name"]: array(t["y"]) for t in traces(chart(app, "rob_patch_attention_chart"), "scatter")}
    np.testing.assert_allclose(drawn["patched"], share.patched_share[:, 0], atol=1e-6)
    np.testing.assert_allclose(drawn["clean (the same tokens)"], share.clean_share[:, 0], atol=1e-6)

    app.selectbox(key="rob_patch_target").set_value(1).run()  # ring
    app.button(key="rob_patch_run").click().run()
    assert_clean(app)
    targeted = curve_of(1)
    assert targeted.target_rate is not None and targeted.noise_target_rate is not None
    for name in models:
        hits, noise_hits = targeted.target_rate[name][-1], targeted.noise_target_rate[name][-1]
        stated = f"predicted as *ring* {hits:.3f} of the time with its patch, {noise_hits:.3f} with the noise"
        assert any(f"**{name}:**" in m.value and stated in m.value for m in app.markdown), name
