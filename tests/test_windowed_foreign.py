"""Windowed attention beyond timm's Swin v1/v2 (issue 23): timm ``swinv2_cr_*``, Hugging Face
Swin/Swinv2 and torchvision Swin/Swin V2 (converted once, at the boundary, into timm's Swin),
and the hierarchical families that stay out (Hiera, MViTv2, MaxViT), all random weights at
small sizes.

References, each independent of the capture and of :class:`~analysis.model.geometry.LayerGeometry`:

* ``swinv2_cr``: ``softmax(τ·cos(q, k) + meta_mlp(Δ) + M)`` recomputed from each block's own
  weights, with the cyclic shift, padding, partition, log-spaced offsets and roll regions
  written out by hand;
* torchvision: the inputs of each ``shifted_window_attention`` call (recorded by wrapping that
  function for one forward), recomputed by hand in the order torchvision uses (pad, then shift);
* Hugging Face: the probabilities transformers returns with ``output_attentions=True`` under
  eager attention, per layer.
"""

from __future__ import annotations

import copy
import inspect
import math
import sys

import pytest
import torch
import torch.nn.functional as F

from analysis import attention_map, capture_attention, load_vit
from analysis.base.errors import ModelLoadError, UnsupportedModelError
from ci_skip_check import in_ci
from tests.test_windowed import _roll_region
from windowed_models import SWIN_SMALL_GEOMETRY, assert_bias_image_is_per_pair, small_pixels, small_swin

if in_ci():  # CI installs transformers: an import failure there is an error, not a skip
    import transformers
else:
    transformers = pytest.importorskip("transformers", reason="transformers is optional: pip install transformers")

# 64 px / patch 4 = a 16x16 grid of 4x4 windows, then 8x8 after one patch merging; every other block shifted by 2.
EXPECTED_GEOMETRY = SWIN_SMALL_GEOMETRY  # (stage, grid, stride, window, shift, heads) per layer


@pytest.fixture(scope="module")
def pixels():
    return small_pixels()


def _geometry(vit) -> list[tuple]:
    return [(g.stage, g.grid_size, g.stride, g.window_size, g.shift, g.num_heads) for g in vit.spec.layer_geometry]


def _perturb(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter moved by N(0, 0.05²), and relative-position tables drawn at size 1, so
    constant inits (zero biases, zero tables) and a wrong bias index show."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("relative_position_bias_table"):
                parameter.copy_(torch.randn(parameter.shape, generator=generator))
            else:
                parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def hand_windows(x: torch.Tensor, window, shift, scores_of, *, pad_first: bool) -> torch.Tensor:
    """``(B, windows, heads, Wt, Wt)`` float64 from one block's attention input ``x (B, H, W, C)``.

    The grid is padded with zero tokens to whole windows and cyclically shifted,
    ``shifted[y, x] = x[(y + sh) mod H, (x + sw) mod W]``: timm shifts then pads, torchvision
    and transformers pad then shift (``pad_first``). Windows are cut row-major by loops;
    ``scores_of(tokens (B, Wt, C)) -> (B, heads, Wt, Wt)`` are the scores before the mask;
    pairs from different roll regions of the padded, shifted grid get −∞."""
    x = x.double()
    batch, height, width, _ = x.shape
    (wh, ww), (sh, sw) = window, shift
    padded_h, padded_w = -(-height // wh) * wh, -(-width // ww) * ww

    def pad(t):
        return F.pad(t, (0, 0, 0, padded_w - t.shape[2], 0, padded_h - t.shape[1]))

    def roll(t):
        rows = (torch.arange(t.shape[1]) + sh) % t.shape[1]
        cols = (torch.arange(t.shape[2]) + sw) % t.shape[2]
        return t[:, rows][:, :, cols]

    grid = roll(pad(x)) if pad_first else pad(roll(x))
    columns = padded_w // ww
    out = []
    for a in range(padded_h // wh):
        for b in range(columns):
            tokens = grid[:, a * wh : (a + 1) * wh, b * ww : (b + 1) * ww].reshape(batch, wh * ww, -1)
            scores = scores_of(tokens)
            region = [
                (_roll_region(a * wh + i // ww, padded_h, wh, sh), _roll_region(b * ww + i % ww, padded_w, ww, sw))
                for i in range(wh * ww)
            ]
            masked = torch.tensor([[region[i] != region[j] for j in range(wh * ww)] for i in range(wh * ww)])
            out.append(scores.masked_fill(masked, float("-inf")).softmax(-1))
    return torch.stack(out, dim=1)


def _heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """``(B, Wt, heads·d) -> (B, heads, Wt, d)``."""
    return t.view(t.shape[0], t.shape[1], heads, -1).transpose(1, 2)


def _assert_windows_equal(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.double(), want.double(), atol=1e-5, rtol=0)
    assert torch.equal(got == 0, want < 1e-30)  # masked pairs exactly 0 in the record, and only those


# --------------------------------------------------------------------------- timm swinv2_cr


@pytest.fixture(scope="module")
def swin_cr():
    vit = small_swin("swinv2_cr_tiny_ns_224")  # windowed_models.SWIN_SMALL
    _perturb(vit.model, 1)
    return vit


def _cr_scores(attn):
    """``τ·cos(q, k) + meta_mlp(Δ)`` of one window, from the module's own weights, the offsets
    ``Δ = sign(d)·log(1 + |d|)`` of ``d = (yi − yj, xi − xj)`` written out per pair."""
    (wh, ww), heads = attn.window_size, attn.num_heads
    meta = copy.deepcopy(attn.meta_mlp).double()
    offsets = torch.empty(wh * ww, wh * ww, 2, dtype=torch.float64)
    for i in range(wh * ww):
        for j in range(wh * ww):
            (yi, xi), (yj, xj) = divmod(i, ww), divmod(j, ww)
            for axis, d in enumerate((yi - yj, xi - xj)):
                offsets[i, j, axis] = math.copysign(math.log(1 + abs(d)), d) if d else 0.0
    bias = meta(offsets).permute(2, 0, 1)  # (heads, Wt, Wt)
    tau = torch.clamp(attn.logit_scale.double(), max=math.log(100.0)).exp().view(heads, 1, 1)

    def scores(tokens):
        qkv = F.linear(tokens, attn.qkv.weight.double(), attn.qkv.bias.double())
        q, k, _ = (_heads(part, heads) for part in qkv.chunk(3, dim=-1))
        return F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2) * tau + bias

    return scores


@torch.no_grad()
def test_swinv2_cr_windows_equal_the_hand_reference(swin_cr, pixels):
    model = swin_cr.model
    assert _geometry(swin_cr) == EXPECTED_GEOMETRY and swin_cr.spec.residual_norm == "post"
    blocks = [block for stage in model.stages for block in stage.blocks]
    inputs = []  # a post-norm block's attention branch is applied to its input (B, H, W, C) itself
    handles = [block.register_forward_pre_hook(lambda mod, args: inputs.append(args[0])) for block in blocks]
    try:
        plain = model(pixels)
    finally:
        for handle in handles:
            handle.remove()
    record = capture_attention(swin_cr, pixels)
    torch.testing.assert_close(record.logits, plain, atol=1e-5, rtol=1e-5)
    for layer, (block, x) in enumerate(zip(blocks, inputs)):
        _, _, _, window, shift, heads = EXPECTED_GEOMETRY[layer]
        want = hand_windows(x, window, shift, _cr_scores(block.attn), pad_first=False)
        assert record.windows[layer].shape == want.shape == (2, 16 if layer < 2 else 4, heads, 16, 16)
        _assert_windows_equal(record.windows[layer], want)
    assert (record.windows[1] == 0).any() and (record.windows[3] == 0).any()


def test_swinv2_cr_corner_map_is_the_row_of_window_zero(swin_cr, pixels):
    record = capture_attention(swin_cr, pixels[:1])
    want = torch.zeros(1, 16, 16)
    want[:, :4, :4] = record.windows[0][:, 0, 1, 0].view(1, 4, 4)  # pixel (0, 0): cell (0, 0), window 0, slot 0
    torch.testing.assert_close(attention_map(record, 0, head=1, query=(0, 0)), want, atol=1e-7, rtol=0)


def test_swinv2_cr_bias_image_is_what_the_module_adds_per_pair(swin_cr):
    import analysis

    for layer, block in enumerate(b for stage in swin_cr.model.stages for b in stage.blocks):
        (wh, ww), heads = block.window_size, block.attn.num_heads
        with torch.no_grad():
            added = block.attn._relative_positional_encodings()[0]  # (heads, Wt, Wt), the module's own
        image = analysis.relative_position_bias(swin_cr, layer)
        assert image.shape == (heads, 2 * wh - 1, 2 * ww - 1)
        assert_bias_image_is_per_pair(image, added, (wh, ww))


# --------------------------------------------------------------------------- torchvision


def _torchvision_swin(v2: bool, seed: int = 0):
    from torchvision.models.swin_transformer import PatchMergingV2, SwinTransformer, SwinTransformerBlockV2

    torch.manual_seed(seed)
    extra = dict(block=SwinTransformerBlockV2, downsample_layer=PatchMergingV2) if v2 else {}
    model = SwinTransformer(
        patch_size=[4, 4], embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=[4, 4], num_classes=7, **extra
    )
    return _perturb(model, seed + 1)


def _recorded_calls(tv, pixels) -> tuple[torch.Tensor, list[dict]]:
    """torchvision's logits, and the arguments of every ``shifted_window_attention`` call."""
    import torchvision.models.swin_transformer as module

    original = module.shifted_window_attention
    signature = inspect.signature(original)
    calls = []

    def recording(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        calls.append({name: value for name, value in bound.arguments.items()})
        return original(*args, **kwargs)

    module.shifted_window_attention = recording
    try:
        with torch.no_grad():
            logits = tv(pixels)
    finally:
        module.shifted_window_attention = original
    return logits, calls


def _torchvision_reference(call: dict) -> torch.Tensor:
    """``softmax(q·kᵀ·d^−½ + bias + M)`` (v2: ``τ·cos(q, k)``, key bias zeroed) from one call's inputs."""
    x, heads = call["input"], call["num_heads"]
    window, shift = list(call["window_size"]), list(call["shift_size"])
    padded = (-(-x.shape[1] // window[0]) * window[0], -(-x.shape[2] // window[1]) * window[1])
    shift = [0 if window[i] >= padded[i] else shift[i] for i in range(2)]  # no shift where one window covers the axis
    weight, bias = call["qkv_weight"].double(), call["qkv_bias"].double()
    logit_scale = call["logit_scale"]
    if logit_scale is not None:
        length = bias.numel() // 3
        bias = torch.cat([bias[:length], torch.zeros(length, dtype=torch.float64), bias[2 * length :]])
    relative = call["relative_position_bias"].double()  # (1, heads, Wt, Wt)

    def scores(tokens):
        q, k, _ = (_heads(part, heads) for part in F.linear(tokens, weight, bias).chunk(3, dim=-1))
        if logit_scale is None:
            raw = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
        else:
            tau = torch.clamp(logit_scale.double(), max=math.log(100.0)).exp()
            raw = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2) * tau
        return raw + relative

    return hand_windows(x, window, shift, scores, pad_first=True)


@pytest.mark.parametrize("v2", [False, True], ids=["swin", "swin_v2"])
def test_torchvision_windows_equal_shifted_window_attention_recomputed(v2, pixels):
    tv = _torchvision_swin(v2)
    vit = load_vit(tv, img_size=64)
    assert vit.source_library == "torchvision" and _geometry(vit) == EXPECTED_GEOMETRY
    assert vit.spec.family == ("SwinTransformerV2" if v2 else "SwinTransformer")
    logits, calls = _recorded_calls(tv, pixels)
    record = capture_attention(vit, pixels)
    torch.testing.assert_close(record.logits, logits, atol=1e-5, rtol=1e-5)
    assert len(calls) == len(record.windows) == 4
    for got, call in zip(record.windows, calls):
        _assert_windows_equal(got, _torchvision_reference(call))
    assert (record.windows[3] == 0).any()


def test_torchvision_swin_shares_torchvision_parameters():
    tv = _torchvision_swin(v2=True)
    vit = load_vit(tv, img_size=64)
    theirs = {p.data_ptr() for p in tv.parameters()}
    ours = {p.data_ptr() for p in vit.model.parameters()}
    assert ours == theirs  # every parameter shared, none copied, none left over
    block = vit.model.layers[1].blocks[1]
    assert block.attn.cpb_mlp is tv.features[3][1].attn.cpb_mlp and block.mlp is tv.features[3][1].mlp


def test_torchvision_swin_by_name_reads_its_geometry():
    vit = load_vit("torchvision:swin_t", pretrained=False, device="cpu")
    got = [(g.grid_size, g.stride, g.window_size, g.shift) for g in vit.spec.layer_geometry]
    grids = [(56, 4), (56, 4), (28, 8), (28, 8)] + [(14, 16)] * 6 + [(7, 32)] * 2
    shifts = [0, 3] * 5 + [0, 0]  # the last stage's 7x7 grid is one window: no shift
    assert got == [((g, g), (s, s), (7, 7), (h, h)) for (g, s), h in zip(grids, shifts)]
    assert vit.data_config["input_size"] == (3, 224, 224)


def test_torchvision_swin_grid_that_is_not_whole_windows_is_refused():
    tv = _torchvision_swin(v2=False)
    with pytest.raises(
        UnsupportedModelError, match=r"stage 1 .* 6x6 grid, not a whole number of its 4x4 windows.*pads before"
    ):
        load_vit(tv, img_size=48)


# --------------------------------------------------------------------------- Hugging Face


HF_SMALL = dict(image_size=64, patch_size=4, embed_dim=32, depths=[2, 2], num_heads=[2, 4], window_size=4, num_labels=5)


def _hf_swin(kind: str, tmp_path=None, **extra):
    torch.manual_seed(0)
    config_class, model_class = {
        "swin": ("SwinConfig", "SwinForImageClassification"),
        "swinv2": ("Swinv2Config", "Swinv2ForImageClassification"),
    }[kind]
    config = getattr(transformers, config_class)(**{**HF_SMALL, **extra})
    config._attn_implementation = "eager"  # so output_attentions returns the softmax weights
    model = _perturb(getattr(transformers, model_class)(config), 2)
    if tmp_path is not None:
        model.save_pretrained(tmp_path)
    return model


def _hf_attentions(model, pixels) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits and every layer's ``(B·windows, heads, Wt, Wt)`` eager probabilities (transformers
    returns only each stage's last layer in ``outputs.attentions``: read every layer's own
    ``output_attentions`` result, and check those against it)."""
    backbone = getattr(model, model.config.model_type)
    per_layer = []
    handles = [
        layer.attention.register_forward_hook(lambda mod, args, out: per_layer.append(out[1]))
        for stage in backbone.encoder.layers
        for layer in stage.blocks
    ]
    try:
        with torch.no_grad():
            out = model(pixel_values=pixels, output_attentions=True)
    finally:
        for handle in handles:
            handle.remove()
    depths = [len(stage.blocks) for stage in backbone.encoder.layers]
    last = [per_layer[sum(depths[: s + 1]) - 1] for s in range(len(depths))]
    assert all(torch.equal(a, b) for a, b in zip(out.attentions, last, strict=True))
    return out.logits, per_layer


@pytest.mark.parametrize("kind", ["swin", "swinv2"])
def test_hf_windows_equal_output_attentions(kind, tmp_path, pixels, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = _hf_swin(kind, tmp_path)
    vit = load_vit(tmp_path, device="cpu")
    assert vit.source_library == "transformers" and _geometry(vit) == EXPECTED_GEOMETRY
    assert vit.class_names == [f"LABEL_{i}" for i in range(5)]
    logits, expected = _hf_attentions(model, pixels)
    record = capture_attention(vit, pixels)
    torch.testing.assert_close(record.logits, logits, atol=1e-5, rtol=1e-5)
    for got, want in zip(record.windows, expected, strict=True):
        batch_major = want.view(got.shape)  # transformers: (B·windows, ...), batch-major, row-major windows
        _assert_windows_equal(got, batch_major)
    assert (record.windows[1] == 0).any() and (record.windows[3] == 0).any()


def test_hf_module_object_shares_its_parameters_and_gives_the_same_logits(pixels):
    model = _hf_swin("swin")
    vit = load_vit(model)
    assert {p.data_ptr() for p in vit.model.parameters()} == {p.data_ptr() for p in model.parameters()}
    logits, _ = _hf_attentions(model, pixels)
    torch.testing.assert_close(capture_attention(vit, pixels).logits, logits, atol=1e-5, rtol=1e-5)


def test_hf_swin_repo_id_loads_from_the_local_cache_offline(tmp_path, monkeypatch, pixels):
    import huggingface_hub.constants as hub_constants

    snapshot = tmp_path / "models--someone--tiny-swin" / "snapshots" / "0123abcd"
    model = _hf_swin("swinv2", snapshot)
    (tmp_path / "models--someone--tiny-swin" / "refs").mkdir()
    (tmp_path / "models--someone--tiny-swin" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    vit = load_vit("hf:someone/tiny-swin", device="cpu")
    logits, _ = _hf_attentions(model, pixels)
    torch.testing.assert_close(capture_attention(vit, pixels).logits, logits, atol=1e-5, rtol=1e-5)


def test_hf_swin_refusals_name_the_reason(tmp_path):
    with pytest.raises(UnsupportedModelError, match="absolute position embeddings"):
        load_vit(_hf_swin("swin", use_absolute_embeddings=True))
    with pytest.raises(UnsupportedModelError, match=r"6x6 grid, not a whole number of its 4x4 windows"):
        load_vit(_hf_swin("swin", image_size=48))
    with pytest.raises(ModelLoadError, match="built for 64x64 inputs"):
        load_vit(_hf_swin("swin"), img_size=128)


def test_hf_swin_without_transformers_says_how_to_install_it(tmp_path, monkeypatch):
    _hf_swin("swin", tmp_path)
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    with pytest.raises(ModelLoadError, match="pip install transformers"):
        load_vit(tmp_path, device="cpu")


# --------------------------------------------------------------------------- what stays out (issue 23 item 6)


def _small_refused_model(family: str) -> torch.nn.Module:
    import timm
    from timm.models.mvitv2 import MultiScaleVit, MultiScaleVitCfg

    if family == "hiera":
        return timm.create_model("hiera_tiny_224", pretrained=False, embed_dim=16, num_heads=1, stages=(1, 1, 1, 1))
    if family == "mvitv2":
        config = MultiScaleVitCfg(depths=(1, 1), embed_dim=(16, 32), num_heads=1, stride_q=((1, 1), (2, 2)))
        return MultiScaleVit(config, img_size=(64, 64), num_classes=3)
    return timm.create_model("maxvit_nano_rw_256", pretrained=False, img_size=64, num_classes=3)


REFUSED = {  # family -> (a timm name, words naming its structure)
    "hiera": ("hiera_tiny_224", r"mask-unit attention pools its queries"),
    "mvitv2": ("mvitv2_tiny", r"pooling attention: queries, keys and values are pooled"),
    "maxvit": ("maxvit_tiny_tf_224", r"block attention \(local windows\) with grid attention"),
}


def _assert_lists_the_supported_families(message: str) -> None:
    supported = message.split("Supported:", 1)[1]
    for family in ("vit_*", "swin_*", "swinv2_cr_*", "samvit_*", "Swin/Swinv2", "swin_v2_t/s/b"):
        assert family in supported, family


@pytest.mark.parametrize("family", sorted(REFUSED))
def test_hierarchical_families_that_stay_out_are_refused_naming_their_structure(family):
    name, words = REFUSED[family]
    with pytest.raises(UnsupportedModelError, match=words) as by_name:
        load_vit(name, pretrained=False, device="cpu")
    _assert_lists_the_supported_families(str(by_name.value))
    model = _small_refused_model(family)  # the same reason for a model object a notebook holds
    with pytest.raises(UnsupportedModelError, match=words) as by_object:
        load_vit(model)
    _assert_lists_the_supported_families(str(by_object.value))
