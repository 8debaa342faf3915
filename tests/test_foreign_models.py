"""Hugging Face transformers and torchvision ViTs, as folders, files and model objects.

Tiny random models are built in temporary folders (no network). The reference is the source
library itself: transformers' ``output_attentions=True`` under eager attention, and
torchvision's ``nn.MultiheadAttention(need_weights=True, average_attn_weights=False)`` on
each block's ``ln_1`` input.
"""

from __future__ import annotations

import sys
import time

import pytest
import torch

from analysis import (
    AnalysisError,
    CheckpointError,
    ModelLoadError,
    UnsupportedModelError,
    WeightsUnavailableError,
    attention_rollout,
    capture_attention,
    load_vit,
    mean_attention_distance,
    patch_embedding_components,
    position_embedding_similarity,
)
from ci_skip_check import in_ci

if in_ci():  # CI installs transformers: an import failure there is an error with its traceback, not a skip
    import transformers
else:
    transformers = pytest.importorskip("transformers", reason="transformers is optional: pip install transformers")
import torchvision  # noqa: E402  (a dependency of the package, never optional)

SMALL = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=8
)


def _perturbed(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random init leaves biases, layer scales and tokens at constants: perturb every parameter."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model.eval()


def _hf(model_class: str, config_class: str, **extra) -> torch.nn.Module:
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**SMALL, **extra)
    config._attn_implementation = "eager"  # so output_attentions returns the softmax weights
    return _perturbed(getattr(transformers, model_class)(config))


HF_CASES = {
    "vit_classifier": ("ViTForImageClassification", "ViTConfig", {}),
    "vit_model_pooler": ("ViTModel", "ViTConfig", {}),
    "deit_distilled": ("DeiTForImageClassificationWithTeacher", "DeiTConfig", {}),
    "deit_classifier": ("DeiTForImageClassification", "DeiTConfig", {}),
    "dinov2": ("Dinov2Model", "Dinov2Config", {}),
    "dinov2_classifier": ("Dinov2ForImageClassification", "Dinov2Config", dict(num_labels=3)),
    "dinov2_registers": ("Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", dict(num_register_tokens=4)),
    "clip_vision": ("CLIPVisionModel", "CLIPVisionConfig", {}),
    "clip_vision_projection": ("CLIPVisionModelWithProjection", "CLIPVisionConfig", dict(projection_dim=16)),
    "siglip_vision": ("SiglipVisionModel", "SiglipVisionConfig", {}),
}
# case -> (prefix tokens, head kind)
EXPECTED = {
    "vit_classifier": (1, "classifier"),
    "vit_model_pooler": (1, "none"),
    "deit_distilled": (2, "classifier"),
    "deit_classifier": (2, "classifier"),
    "dinov2": (1, "none"),
    "dinov2_classifier": (1, "classifier"),
    "dinov2_registers": (5, "none"),
    "clip_vision": (1, "none"),
    "clip_vision_projection": (1, "embedding"),
    "siglip_vision": (0, "none"),
}


def _hf_output(model, pixels, **kwargs):
    with torch.no_grad():
        out = model(pixel_values=pixels, output_attentions=True, **kwargs)
    for name in ("logits", "image_embeds", "pooler_output"):
        value = getattr(out, name, None)
        if value is not None:
            return value, torch.stack(out.attentions)
    raise AssertionError("no output")


def _source_patch_positions(model: torch.nn.Module, num_patches: int) -> torch.Tensor:
    """``(N, D)``: the patch rows of the source model's own position-embedding parameter
    (transformers' ``position_embedding(s)``, torchvision's ``pos_embedding``), read by name;
    prefix rows (class, distillation) come first, so the patches are the last ``N``."""
    tables = [
        p
        for name, p in model.named_parameters()
        if name.split(".")[-1] in ("position_embeddings", "pos_embedding") or name.endswith("position_embedding.weight")
    ]
    assert len(tables) == 1, [name for name, _ in model.named_parameters()]
    table = tables[0].detach().double()
    return table.reshape(-1, table.shape[-1])[-num_patches:]


def check_position_similarity_by_hand(vit, model: torch.nn.Module) -> None:
    """position_embedding_similarity equals the cosine similarity of every pair of the source
    model's own patch position rows, computed one pair at a time."""
    gh, gw = vit.spec.grid_size
    rows = _source_patch_positions(model, gh * gw)
    got = torch.as_tensor(position_embedding_similarity(vit)).double()
    assert got.shape == (gh, gw, gh, gw)
    for p in range(gh * gw):
        for q in range(gh * gw):
            cosine = float(rows[p] @ rows[q]) / (float(rows[p].norm()) * float(rows[q].norm()))
            assert float(got[p // gw, p % gw, q // gw, q % gw]) == pytest.approx(cosine, abs=1e-5)


def check_filter_pca_by_hand(vit, model: torch.nn.Module, k: int) -> None:
    """patch_embedding_components equals a PCA of the source model's own patch convolution,
    done another way: the eigenvectors of the filters' covariance ``Xcᵀ·Xc`` (``torch.linalg.eigh``),
    each signed so its largest-magnitude entry is positive, and eigenvalue / trace as the ratio."""
    conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    filters = conv.weight.detach().double()  # (D, C, ph, pw)
    flat = filters.reshape(filters.shape[0], -1)
    centred = flat - flat.mean(0, keepdim=True)
    eigenvalues, eigenvectors = torch.linalg.eigh(centred.T @ centred)  # ascending
    order = eigenvalues.argsort(descending=True)[:k]
    expected_ratio = eigenvalues[order] / eigenvalues.clamp_min(0).sum()
    components, ratio = patch_embedding_components(vit, n_components=k)
    assert components.shape == (k, *filters.shape[1:])
    torch.testing.assert_close(ratio.double(), expected_ratio, atol=1e-5, rtol=1e-4)
    for got, index in zip(components.double().reshape(k, -1), order):
        vector = eigenvectors[:, index]
        vector = vector * torch.sign(vector[vector.abs().argmax()])
        torch.testing.assert_close(got, vector, atol=1e-4, rtol=0)


def _storages(module: torch.nn.Module) -> set[int]:
    return {p.untyped_storage().data_ptr() for p in module.parameters()}


def _copied_numel(wrapped: torch.nn.Module, original: torch.nn.Module) -> int:
    """Elements of ``wrapped``'s parameters that do not live in ``original``'s storage."""
    own = _storages(original)
    return sum(p.numel() for p in wrapped.parameters() if p.untyped_storage().data_ptr() not in own)


@pytest.mark.parametrize("case", sorted(HF_CASES))
def test_transformers_model_object_matches_its_own_attention_and_output(case):
    model = _hf(*HF_CASES[case][:2], **HF_CASES[case][2])
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    expected_out, expected_attention = _hf_output(model, pixels)
    vit = load_vit(model)
    prefix, head = EXPECTED[case]
    assert vit.source_library == "transformers"
    assert vit.spec.num_prefix_tokens == prefix and vit.spec.head == head
    record = capture_attention(vit, pixels)
    torch.testing.assert_close(record.attentions, expected_attention, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(record.logits, expected_out, atol=1e-5, rtol=1e-4)
    # nothing copied: every weight is the original's; DINOv2 with registers folds the class
    # position into the class token (one D-vector), since registers have no position
    assert _copied_numel(vit.model, model) == (SMALL["hidden_size"] if case == "dinov2_registers" else 0)
    assert attention_rollout(record).shape == (2, 4, 4)
    assert mean_attention_distance(record).shape == (2, 2)
    check_position_similarity_by_hand(vit, model)
    check_filter_pca_by_hand(vit, model, k=3)


def test_siglip_pooling_head_attention_matches_its_multihead_attention():
    model = _hf("SiglipVisionModel", "SiglipVisionConfig")
    pixels = torch.randn(1, 3, 32, 32)
    seen = {}
    head = getattr(model, "vision_model", model).head  # transformers 4.x nests the tower
    handle = head.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0]))
    with torch.no_grad():
        model(pixel_values=pixels)
    handle.remove()
    probe = head.probe.expand(1, -1, -1)
    with torch.no_grad():
        _, weights = head.attention(probe, seen["x"], seen["x"], need_weights=True, average_attn_weights=False)
    record = capture_attention(load_vit(model), pixels)
    torch.testing.assert_close(record.pool_attention, weights, atol=1e-5, rtol=1e-4)


def test_save_pretrained_folder_with_its_preprocessor(tmp_path):
    model = _hf("ViTForImageClassification", "ViTConfig", num_labels=3, id2label={0: "cat", 1: "dog", 2: "fox"})
    model.save_pretrained(tmp_path)
    transformers.ViTImageProcessor(
        size={"height": 32, "width": 32}, image_mean=[0.1, 0.2, 0.3], image_std=[0.4, 0.5, 0.6], resample=3
    ).save_pretrained(tmp_path)
    vit = load_vit(tmp_path, device="cpu")
    assert vit.class_names == ["cat", "dog", "fox"]
    assert vit.preprocessing.mean == (0.1, 0.2, 0.3) and vit.preprocessing.std == (0.4, 0.5, 0.6)
    assert vit.preprocessing.interpolation == "bicubic" and vit.preprocessing.crop_mode == "squash"
    pixels = torch.randn(1, 3, 32, 32)
    expected_out, expected_attention = _hf_output(model, pixels)
    record = capture_attention(vit, pixels)
    torch.testing.assert_close(record.attentions, expected_attention, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(record.logits, expected_out, atol=1e-5, rtol=1e-4)


def test_dinov2_folder_at_its_preprocessors_crop_uses_transformers_own_position_resize(tmp_path):
    """DINOv2's processor crops below the config's image_size; transformers then resizes its
    position table, so the converted model must use exactly those positions."""
    model = _hf("Dinov2WithRegistersModel", "Dinov2WithRegistersConfig", num_register_tokens=2)
    model.save_pretrained(tmp_path)
    transformers.BitImageProcessor(size={"shortest_edge": 28}, crop_size={"height": 24, "width": 24}).save_pretrained(
        tmp_path
    )
    vit = load_vit(f"local-dir:{tmp_path}", device="cpu")
    assert vit.spec.img_size == (24, 24) and vit.spec.grid_size == (3, 3)
    assert vit.preprocessing.crop_pct == pytest.approx(24 / 28)
    pixels = torch.randn(2, 3, 24, 24)
    expected_out, expected_attention = _hf_output(model, pixels)
    record = capture_attention(vit, pixels)
    torch.testing.assert_close(record.attentions, expected_attention, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(record.logits, expected_out, atol=1e-5, rtol=1e-4)


def test_hf_repo_id_loads_from_the_local_cache_offline(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub_constants

    model = _hf("ViTModel", "ViTConfig")
    snapshot = tmp_path / "models--someone--tiny-vit" / "snapshots" / "0123abcd"
    model.save_pretrained(snapshot)
    (tmp_path / "models--someone--tiny-vit" / "refs").mkdir()
    (tmp_path / "models--someone--tiny-vit" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    vit = load_vit("hf:someone/tiny-vit", device="cpu")
    pixels = torch.randn(1, 3, 32, 32)
    expected_out, _ = _hf_output(model, pixels)
    torch.testing.assert_close(capture_attention(vit, pixels).logits, expected_out, atol=1e-5, rtol=1e-4)
    started = time.perf_counter()
    with pytest.raises(WeightsUnavailableError, match="cannot be downloaded"):
        load_vit("hf:someone/not-cached", device="cpu")
    assert time.perf_counter() - started < 10


def test_a_non_vision_transformers_folder_is_refused_quickly(tmp_path):
    transformers.BertModel(
        transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    ).save_pretrained(tmp_path)
    started = time.perf_counter()
    with pytest.raises(UnsupportedModelError, match="'bert' model, not a supported vision transformer"):
        load_vit(tmp_path, device="cpu")
    assert time.perf_counter() - started < 10


def test_without_transformers_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    _hf("ViTModel", "ViTConfig").save_pretrained(tmp_path)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    with pytest.raises(ModelLoadError, match="pip install transformers"):
        load_vit(tmp_path, device="cpu")


# --------------------------------------------------------------------------- torchvision


def _torchvision_vit(**overrides) -> torch.nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    options = dict(image_size=48, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128, num_classes=5)
    return _perturbed(VisionTransformer(**{**options, **overrides}))


@torch.no_grad()
def torchvision_reference(tv: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """(L, B, heads, T, T) from each block's own MultiheadAttention with need_weights=True."""
    maps = []
    handles = [
        layer.ln_1.register_forward_hook(
            lambda m, a, x, layer=layer: maps.append(
                layer.self_attention(x, x, x, need_weights=True, average_attn_weights=False)[1]
            )
        )
        for layer in tv.encoder.layers
    ]
    tv(pixels)
    for handle in handles:
        handle.remove()
    return torch.stack(maps)


def test_torchvision_object_matches_multihead_attention_weights():
    tv = _torchvision_vit()
    pixels = torch.randn(2, 3, 48, 48)
    expected = torchvision_reference(tv, pixels)
    with torch.no_grad():
        logits = tv(pixels)
    vit = load_vit(tv)
    assert vit.source_library == "torchvision" and vit.spec.grid_size == (3, 3) and vit.spec.has_classifier
    record = capture_attention(vit, pixels)
    torch.testing.assert_close(record.attentions, expected, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(record.logits, logits, atol=1e-5, rtol=1e-4)
    assert _copied_numel(vit.model, tv) == 0
    assert attention_rollout(record).shape == (2, 3, 3)
    check_position_similarity_by_hand(vit, tv)
    check_filter_pca_by_hand(vit, tv, k=2)


def test_torchvision_state_dict_with_arch(tmp_path):
    tv = torchvision.models.vit_b_32(weights=None, image_size=64, num_classes=7)
    _perturbed(tv)
    path = tmp_path / "vit_b_32.pth"
    torch.save(tv.state_dict(), path)
    vit = load_vit(path, arch="torchvision:vit_b_32", device="cpu")
    assert vit.spec.img_size == (64, 64) and vit.spec.num_outputs == 7
    pixels = torch.randn(1, 3, 64, 64)
    torch.testing.assert_close(
        capture_attention(vit, pixels).attentions, torchvision_reference(tv, pixels), atol=1e-5, rtol=1e-4
    )
    with pytest.raises(CheckpointError, match="does not fit"):
        load_vit(path, arch="torchvision:vit_b_16", device="cpu")


def test_torchvision_random_weights_by_name_and_refusals():
    vit = load_vit("torchvision:vit_b_32", pretrained=False, device="cpu")
    assert vit.spec.grid_size == (7, 7) and vit.spec.num_layers == 12
    with pytest.raises(UnsupportedModelError, match="convolutional network"):
        load_vit(torchvision.models.resnet18())
    with pytest.raises(UnsupportedModelError, match="not a Vision Transformer"):
        load_vit("torchvision:resnet50", pretrained=False)
    with pytest.raises(ModelLoadError, match="Unknown torchvision model"):
        load_vit("torchvision:vit_q_99", pretrained=False)


# --------------------------------------------------------------------------- model objects


def test_a_timm_object_is_wrapped_without_a_copy_and_takes_overrides():
    import timm

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, dynamic_img_size=True)
    vit = load_vit(model, mean=(0.2, 0.2, 0.2), std=(0.3, 0.3, 0.3), img_size=48)
    assert vit.model is model and not model.training
    assert vit.spec.img_size == (48, 48) and vit.preprocessing.mean == (0.2, 0.2, 0.2)
    assert model.cls_token.requires_grad  # the caller's module keeps its own flags
    fixed = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1)
    with pytest.raises(ModelLoadError, match="cannot take img_size"):
        load_vit(fixed, img_size=48)
    with pytest.raises(ModelLoadError, match="only img_size"):
        load_vit(fixed, depth=3)
    with pytest.raises(UnsupportedModelError):
        load_vit(torch.nn.Linear(3, 3))


def test_transformers_object_with_another_input_size():
    model = _hf("Dinov2Model", "Dinov2Config")
    vit = load_vit(model, img_size=40)
    pixels = torch.randn(1, 3, 40, 40)
    expected_out, expected_attention = _hf_output(model, pixels)
    record = capture_attention(vit, pixels)
    assert record.spec.grid_size == (5, 5)
    torch.testing.assert_close(record.attentions, expected_attention, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(record.logits, expected_out, atol=1e-5, rtol=1e-4)
    with pytest.raises(AnalysisError):
        capture_attention(vit, torch.randn(1, 3, 32, 32))


@pytest.mark.parametrize("case", ["vit_classifier", "deit_distilled", "dinov2_classifier"])
def test_transformers_attention_gradients_equal_the_originals(case):
    """Explanations of a converted model differentiate the original's own attention: its
    eager ``output_attentions`` tensors, with ``retain_grad``, are the reference."""
    from analysis import explain
    from analysis.explanations import attention_gradients

    model = _hf(*HF_CASES[case][:2], **HF_CASES[case][2])
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    vit = load_vit(model)
    record = attention_gradients(vit, pixels, target=[1, 0])
    x = pixels.clone().requires_grad_(True)
    output = model(pixel_values=x, output_attentions=True)
    for attention in output.attentions:
        attention.retain_grad()
    (output.logits[0, 1] + output.logits[1, 0]).backward()
    torch.testing.assert_close(record.logits, output.logits.detach(), atol=1e-5, rtol=1e-4)
    for layer, attention in enumerate(output.attentions):
        torch.testing.assert_close(record.attentions[layer], attention.detach(), atol=1e-5, rtol=1e-4)
        scale = float(attention.grad.abs().max())
        torch.testing.assert_close(record.gradients[layer], attention.grad, atol=1e-4 * scale + 1e-12, rtol=1e-3)
    assert explain(vit, pixels, target=[1, 0], method="chefer").shape == (2, 4, 4)


def test_torchvision_explanations_equal_autograd_on_the_torchvision_model():
    """Input × gradient and Grad-CAM of a converted torchvision ViT against the same formulas
    written out with autograd on the torchvision module itself (its own forward, its own
    ``ln_1`` output as the last block's attention input)."""
    from analysis import explain

    tv = _torchvision_vit()
    vit = load_vit(tv)
    pixels = torch.randn(2, 3, 48, 48, generator=torch.Generator().manual_seed(3))
    target, (ph, pw), (gh, gw) = 4, vit.spec.patch_size, vit.spec.grid_size

    # input × gradient: Σ over channels and each patch's pixels of x · ∂y_target/∂x
    x = pixels.clone().requires_grad_(True)
    tv(x)[:, target].sum().backward()  # images are independent: one backward gives every image's gradient
    per_pixel = (x * x.grad).detach().sum(1)  # (B, H, W)
    expected = torch.zeros(2, gh, gw)
    for i in range(gh):
        for j in range(gw):
            expected[:, i, j] = per_pixel[:, i * ph : (i + 1) * ph, j * pw : (j + 1) * pw].sum((1, 2))
    torch.testing.assert_close(
        explain(vit, pixels, target=target, method="input_x_gradient"), expected, atol=1e-5, rtol=1e-4
    )

    # Grad-CAM on the last block's attention input X (ln_1's output), class token dropped:
    # w_c = mean_p ∂y/∂X[p, c];  map[p] = ReLU(Σ_c w_c · X[p, c])
    kept = {}

    def keep(module, args, out):  # (B, T, D), class token first
        out.retain_grad()
        kept["X"] = out

    handle = tv.encoder.layers[-1].ln_1.register_forward_hook(keep)
    try:
        tv(pixels)[:, target].sum().backward()
    finally:
        handle.remove()
    activations, gradients = kept["X"].detach()[:, 1:], kept["X"].grad[:, 1:]  # (B, N, D)
    weights = gradients.mean(1, keepdim=True)  # (B, 1, D)
    expected = (activations * weights).sum(-1).clamp(min=0).reshape(2, gh, gw)
    assert expected.abs().sum() > 0
    torch.testing.assert_close(explain(vit, pixels, target=target, method="gradcam"), expected, atol=1e-5, rtol=1e-4)
    assert torch.isfinite(explain(vit, pixels, target=target, method="chefer")).all()


@pytest.mark.parametrize(
    "change, what", [(dict(num_hidden_layers=400), "depth 400"), (dict(hidden_size=1_000_000), "width 10^6")]
)
def test_a_hf_config_larger_than_its_weights_is_refused_before_anything_is_built(tmp_path, monkeypatch, change, what):
    """A save_pretrained folder whose config.json describes a far larger model than its weights (a
    2-layer ViT-Ti) is refused with a typed error naming both sizes; the model is only built on the
    meta device (no memory). transformers itself would build all 400 layers and fill the 398 without
    weights at random. The folder with its own config still loads."""
    import json

    import analysis.model.loading.hf_transformers as hf
    from analysis import CheckpointError

    width = dict(hidden_size=192, num_attention_heads=3, intermediate_size=768)
    config = transformers.ViTConfig(**{**SMALL, **width}, num_labels=3)
    transformers.ViTForImageClassification(config).save_pretrained(tmp_path)
    assert load_vit(tmp_path, device="cpu").spec.num_layers == 2
    devices = []
    built = transformers.ViTForImageClassification._from_config

    def recorded(*args, **kwargs):
        devices.append(str(torch.get_default_device()))
        return built(*args, **kwargs)

    monkeypatch.setattr(transformers.ViTForImageClassification, "_from_config", recorded)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    started = time.perf_counter()
    with pytest.raises(CheckpointError, match=r"describes a model of [\d,.]+ M values, but its weights hold"):
        load_vit(tmp_path, device="cpu")
    assert devices == ["meta"], (what, devices)
    assert time.perf_counter() - started < 20, what
    assert hf.check_hf_config_fits_weights(tmp_path.parent, transformers.ViTModel) is None  # no weights: not its call


def test_the_hf_config_check_keeps_its_message_with_the_counts_of_real_builds(tmp_path):
    """check_hf_config_fits_weights on a 400-layer ViT-Ti config beside a 13-value model.safetensors:
    the message, written out, with the model's values extrapolated from real 1- and 2-layer builds
    (each layer adds the same values)."""
    from safetensors.torch import save_file

    import analysis.model.loading.hf_transformers as hf
    from analysis import CheckpointError

    width = dict(hidden_size=192, num_attention_heads=3, intermediate_size=768)

    def values(layers: int) -> int:
        model = transformers.ViTModel(transformers.ViTConfig(**{**SMALL, **width, "num_hidden_layers": layers}))
        return sum(t.numel() for t in model.state_dict().values())

    needed = values(1) + 399 * (values(2) - values(1))
    transformers.ViTConfig(**{**SMALL, **width, "num_hidden_layers": 400}).save_pretrained(tmp_path)
    save_file({"a": torch.zeros(2, 5), "b": torch.zeros(3)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError) as caught:
        hf.check_hf_config_fits_weights(tmp_path, transformers.ViTModel)
    assert str(caught.value) == (
        f"{tmp_path / 'config.json'} describes a model of {needed / 1e6:,.1f} M values, but its weights hold "
        f"{13 / 1e6:,.1f} M: the config does not fit its weights (check num_hidden_layers, hidden_size, ...). "
        "Nothing was built."
    )
