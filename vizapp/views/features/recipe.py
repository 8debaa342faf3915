"""The Features page's "Reproduce in Python": the public ``analysis`` calls that recompute what it
shows, ending with its arrays under the names of its ``.npz`` download (:mod:`vizapp.python_snippet`)."""

from __future__ import annotations

from vizapp.python_snippet import Source, forward_lines, script

__all__ = ["features_code"]


def features_code(cur, sae_name: str, *, feature: int, factor: float, patch: int, mode: str = "scale") -> str:
    """The Features page: the patch features of the image, the feature index over the demo scenes,
    the feature's class effect and the intervention (the arrays of the page's downloads): the
    feature scaled by ``factor`` (``mode="scale"``) or set to it (``"clamp"``)."""
    source = Source.of(cur)
    load = "load_demo_sae()" if sae_name == "demo" else f"load_sae({sae_name!r})"
    lines = forward_lines(source, imports=["from PIL import Image"], record=False)
    lines += [
        "from analysis.demo.data import render_sample",
        "from analysis.sae import build_feature_index, feature_class_effect, intervene, load_demo_sae, load_sae, "
        "patch_feature_grid",
        "from analysis.sae.demo import SAE_HELD_OUT_SEED",
        "",
        f"sae = {load}",
        "grid = patch_feature_grid(vit, sae, pixels)[0]  # (gh, gw, d_sae): every patch's features",
        f"row, col = divmod({int(patch)}, grid.shape[1])",
        "print(grid[row, col].topk(8))  # the features firing most on the chosen patch",
        f"feature_map = grid[..., {int(feature)}].numpy()  # (gh, gw)",
        "size = vit.spec.img_size[0]",
        "scenes = [Image.fromarray(render_sample(SAE_HELD_OUT_SEED, i, size)[0]) for i in range(256)]",
        "index = build_feature_index(vit, sae, scenes)",
        f"top_scenes, top_peaks = index.top_images({int(feature)}, 8)",
        f"activations = index.activations({int(feature)}).numpy()  # its histogram's data",
        f"class_effect = feature_class_effect(vit, sae, {int(feature)}).numpy()  # (C,)",
        f"changed = intervene(vit, sae, pixels, {'scale' if mode == 'scale' else 'clamp'}={{{int(feature)}: {float(factor)!r}}})",
        "print(changed.clean_logits.softmax(-1), changed.steered_logits.softmax(-1))",
    ]
    return script(lines)
