"""The Robustness page's "Reproduce in Python": the public ``analysis`` calls that recompute what it
shows, ending with its arrays under the names of its ``.npz`` download (:mod:`vizapp.python_snippet`)."""

from __future__ import annotations

from vizapp.python_snippet import Source, forward_lines, script

__all__ = ["robustness_code"]


def robustness_code(
    source: Source,
    *,
    perturbation: str,
    clean_level: float,
    level: float,
    selection: str,
    seed: int,
    windowed: bool = False,
) -> str:
    """The Robustness page's one-image probe of the ViT (the comparison CNN is left out):
    ``vit_clean_*`` and ``vit_perturbed_*`` rollouts ``(gh, gw)`` (NaN: a dropped token) and
    probabilities ``(classes,)``, and ``dropped_patches`` for drops."""
    lines = [
        *forward_lines(source, imports=["from analysis.robustness import probe"]),
        "",
        f"PERTURBATION, SELECTION, SEED = {perturbation!r}, {selection!r}, {int(seed)}",
    ]
    if selection != "random":
        lines.append(
            "saliency = analysis.attention_rollout(record, stage=0, query='mean')[0].numpy()"
            "  # the first stage's rollout (patch grid) ranks the patches"
            if windowed
            else "saliency = analysis.attention_rollout(record)[0].numpy()  # the clean rollout ranks the patches"
        )
    saliency = ", saliency=saliency" if selection != "random" else ""
    lines += [
        f"clean = probe(vit, pixels, PERTURBATION, {clean_level!r}, seed=SEED, selection=SELECTION{saliency})",
        f"perturbed = probe(vit, pixels, PERTURBATION, {float(level)!r}, seed=SEED, selection=SELECTION{saliency})",
        "vit_clean_rollout, vit_perturbed_rollout = clean.saliency.numpy(), perturbed.saliency.numpy()  # (gh, gw)"
        + ("; a windowed model: clean.saliency_name, on the last layer's grid" if windowed else ""),
        "vit_clean_probabilities = clean.logits[0].softmax(-1).numpy()  # (classes,)",
        "vit_perturbed_probabilities = perturbed.logits[0].softmax(-1).numpy()",
    ]
    if perturbation in ("token_drop", "pixel_drop"):
        lines.append("dropped_patches = perturbed.dropped.numpy()  # row-major patch indices")
    return script(lines)
