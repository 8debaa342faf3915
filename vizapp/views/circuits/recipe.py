"""The Circuits page's "Reproduce in Python": the public ``analysis`` calls that recompute what it
shows, ending with its arrays under the names of its ``.npz`` download (:mod:`vizapp.python_snippet`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from vizapp.python_snippet import Source, forward_lines, script

__all__ = ["circuits_code"]


def circuits_code(
    source: Source,
    *,
    target: int,
    method: str,
    reference: Sequence[Path],
    corruption: str,
    level: float,
    corrupted_path: Path | None,
    point: str,
) -> str:
    """The Circuits page: ``heads`` ``(L, heads, T)`` (direct logit attribution per head and
    token), ``delta_logit`` ``(L, heads)`` (head ablation) and ``effect`` (activation patching,
    ``(L, T)`` or ``(L, heads)``). ``reference``: the mean-ablation images (all samples) or the
    resampled one; ``corrupted_path``: the other image of the "another image" corruption."""
    lines = [
        *forward_lines(
            source,
            imports=[
                "import torch",
                "from analysis.circuits import activation_patching, direct_logit_attribution, head_ablation",
                "from analysis.base.image_ops import gaussian_blur, gaussian_noise",
            ],
            record=False,
        ),
        f"TARGET = {int(target)}  # the class whose logit is measured",
        "",
        "dla = direct_logit_attribution(vit, pixels, target=TARGET)",
        "heads = dla.heads[0].numpy()  # (L, heads, T): each head's direct contribution, per token",
        "",
    ]
    if method == "zero":
        lines.append("reference = None")
    else:
        paths = ", ".join(repr(str(path)) for path in reference)
        lines.append(f"reference = torch.cat([vit.preprocess(analysis.load_image(p)) for p in [{paths}]])")
    lines += [
        f"ablation = head_ablation(vit, pixels, target=TARGET, method={method!r}, reference=reference)",
        "delta_logit = ablation.delta_logit[0].numpy()  # (L, heads): change of the target logit",
        "",
    ]
    if corruption == "noise":
        lines.append(f"corrupted = gaussian_noise(pixels, {float(level)!r}, seed=0)")
    elif corruption == "blur":
        lines.append(f"corrupted = gaussian_blur(pixels, {float(level)!r})")
    else:
        lines.append(f"corrupted = vit.preprocess(analysis.load_image({str(corrupted_path)!r}))")
    lines += [
        f"patching = activation_patching(vit, pixels, corrupted, point={point!r}, target=TARGET)",
        "effect = patching.effect.numpy()  # restored share of the clean answer per layer and token / head",
    ]
    return script(lines)
