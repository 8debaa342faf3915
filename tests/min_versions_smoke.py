"""Smoke test for the CI "minimum versions" job (not collected by pytest: no test_ prefix).

Run from the repository root with the floor versions installed:

    HF_HUB_OFFLINE=1 python tests/min_versions_smoke.py

It imports the package (which imports every attention adapter, so a timm that lacks
``AttentionRope``, ``EvaAttention``, ``AttentionPoolLatent``... fails here), loads the bundled
demo model, one small random-weight model of every supported timm family (the matrix of
``tests/families.py``, shared with ``tests/test_families.py``), a tiny torchvision
ViT and, when transformers is installed, tiny random Hugging Face ViTs; each is captured and
checked (rows sum to one, logits equal an uncaptured forward or the source library's own
attention), and rollout / attention distance run on every record. Offline, CPU, ~10-30 s.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import analysis  # noqa: E402
from analysis import (  # noqa: E402
    attention_rollout,
    capture_attention,
    load_image,
    load_vit,
    mean_attention_distance,
    patch_embedding_components,
    position_embedding_similarity,
)
from families import FAMILIES  # noqa: E402  (tests/families.py: the one family matrix)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("+")[0].split(".")[:3] if part.isdigit())


HF_SMALL = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8
)
# transformers class -> (config class, extra config)
HF_CASES = {
    "ViTForImageClassification": ("ViTConfig", {}),
    "DeiTForImageClassificationWithTeacher": ("DeiTConfig", {}),
    "Dinov2WithRegistersModel": ("Dinov2WithRegistersConfig", dict(num_register_tokens=2)),
    "CLIPVisionModelWithProjection": ("CLIPVisionConfig", dict(projection_dim=16)),
    "SiglipVisionModel": ("SiglipVisionConfig", {}),
}


def check_record(label: str, vit, pixels: torch.Tensor, expected_logits: torch.Tensor | None = None) -> None:
    record = capture_attention(vit, pixels)
    att = record.attentions  # (L, B, heads, T, T)
    assert att.ndim == 5 and att.shape[:2] == (vit.spec.num_layers, pixels.shape[0]), (label, att.shape)
    assert att.shape[-1] == record.spec.num_tokens, (label, att.shape, record.spec.num_tokens)
    rows = att.double().sum(-1)
    assert torch.allclose(rows, torch.ones_like(rows), atol=1e-4), f"{label}: attention rows do not sum to 1"
    assert torch.isfinite(att).all(), f"{label}: non-finite attention"
    if expected_logits is None:
        with torch.no_grad():
            expected_logits = vit.model(pixels.to(next(vit.model.parameters()).device))
    torch.testing.assert_close(record.logits.float().cpu(), expected_logits.float().cpu(), atol=1e-4, rtol=1e-4)
    gh, gw = record.spec.grid_size
    with warnings.catch_warnings():  # post-norm families warn that rollout is a heuristic: expected
        warnings.filterwarnings("ignore", message=".*post-norm", category=RuntimeWarning)
        assert attention_rollout(record).shape == (pixels.shape[0], gh, gw), label
    distance = mean_attention_distance(record)
    assert distance.shape == (vit.spec.num_layers, att.shape[2]) and torch.isfinite(distance).all(), label
    print(f"  ok  {label:40s} attentions {tuple(att.shape)}")


def perturb(module: torch.nn.Module) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in module.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.02)
    return module.eval()


def versions() -> str:
    import PIL
    import streamlit
    import timm
    import torchvision

    names = dict(torch=torch, torchvision=torchvision, timm=timm, numpy=np, pillow=PIL, streamlit=streamlit)
    try:
        import transformers

        names["transformers"] = transformers
    except ImportError:
        pass
    return " ".join(f"{name}={module.__version__}" for name, module in names.items())


def main() -> None:
    started = time.perf_counter()
    print("versions:", versions())
    torch.manual_seed(0)

    # 1. the bundled demo model on a real sample image
    vit = load_vit("demo", device="cpu")
    pixels = vit.preprocess(load_image(REPO / "assets" / "samples" / "scene_1_star.png"))
    pixels = pixels if pixels.ndim == 4 else pixels.unsqueeze(0)
    check_record("demo", vit, pixels)
    assert position_embedding_similarity(vit).ndim == 4
    assert patch_embedding_components(vit, n_components=3)[0].shape[0] == 3

    # 2. one random-weight model per supported timm family (every attention adapter)
    import timm

    for family, (arch, kwargs, (height, width), since_timm) in FAMILIES.items():
        if _version(timm.__version__) < _version(since_timm):
            print(f"  --  timm:{family} ({arch}) needs timm>={since_timm}, this is {timm.__version__}: not checked")
            continue
        vit = load_vit(arch, pretrained=False, device="cpu", **kwargs)
        perturb(vit.model)
        pixels = torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(1))
        check_record(f"timm:{family} ({arch})", vit, pixels)

    # 3. a torchvision ViT object
    import torchvision

    tv = perturb(
        torchvision.models.VisionTransformer(
            image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=5
        )
    )
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = tv(pixels)
    check_record("torchvision:VisionTransformer", load_vit(tv), pixels, expected)

    # 4. Hugging Face transformers objects (optional dependency)
    try:
        import transformers
    except ImportError:
        print("  --  transformers not installed: skipped the Hugging Face models")
    else:
        for model_class, (config_class, extra) in HF_CASES.items():
            if not hasattr(transformers, model_class):  # e.g. Dinov2WithRegisters arrived in 4.48
                print(f"  --  transformers {transformers.__version__} has no {model_class}: nothing to check")
                continue
            torch.manual_seed(0)
            config = getattr(transformers, config_class)(**HF_SMALL, **extra)
            config._attn_implementation = "eager"
            model = perturb(getattr(transformers, model_class)(config))
            pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
            with torch.no_grad():
                out = model(pixel_values=pixels, output_attentions=True)
            reference = next(
                getattr(out, n)
                for n in ("logits", "image_embeds", "pooler_output")
                if getattr(out, n, None) is not None
            )
            vit = load_vit(model)
            assert vit.source_library == "transformers", vit.source_library
            check_record(f"transformers:{model_class}", vit, pixels, reference)
            record = capture_attention(vit, pixels)
            torch.testing.assert_close(record.attentions, torch.stack(out.attentions), atol=1e-5, rtol=1e-4)

    # 5. the app's modules import (streamlit, plotly)
    import vizapp.figures  # noqa: F401
    import vizapp.state  # noqa: F401

    print(
        f"min-versions smoke OK ({time.perf_counter() - started:.1f} s, analysis from {Path(analysis.__file__).parent})"
    )


if __name__ == "__main__":
    main()
