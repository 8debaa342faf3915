"""load_vit from every source, preprocessing, and its typed errors."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

import analysis
from analysis import (
    CheckpointError,
    ModelLoadError,
    ModelPathNotFoundError,
    UnsupportedModelError,
    WeightsUnavailableError,
    capture_attention,
    load_vit,
)
from analysis.model.loading import DEMO_MODEL_DIR
from analysis.model.loading.files import looks_like_path
from analysis.robustness import load_cnn

ARCH = "vit_tiny_patch16_224"
SMALL = dict(img_size=32, depth=2, num_classes=3)


@pytest.fixture(scope="module")
def source_model():
    torch.manual_seed(1)
    return load_vit(ARCH, pretrained=False, **SMALL)


def _assert_same_weights(a, b):
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def test_hub_layout_folder_loads_names_and_normalisation(tmp_path, source_model):
    config = {
        "architecture": ARCH,
        "num_classes": 3,
        "model_args": {"img_size": 32, "depth": 2},
        "pretrained_cfg": {
            "mean": [0.1, 0.2, 0.3],
            "std": [0.5, 0.25, 0.125],
            "input_size": [3, 32, 32],
            "interpolation": "bilinear",
            "crop_pct": 1.0,
            "num_classes": 3,
        },
        "label_names": ["circle", "square", "star"],
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file(source_model.model.state_dict(), str(tmp_path / "model.safetensors"))
    for source in (str(tmp_path), f"local-dir:{tmp_path}"):
        vit = load_vit(source)
        assert vit.class_names == ["circle", "square", "star"]
        assert vit.spec.img_size == (32, 32)
        _assert_same_weights(vit, source_model)
        pixels = vit.preprocess(Image.new("RGB", (50, 40), (255, 0, 51)))
        assert pixels.shape == (1, 3, 32, 32)
        expected = torch.tensor([(1.0 - 0.1) / 0.5, (0.0 - 0.2) / 0.25, (0.2 - 0.3) / 0.125])
        torch.testing.assert_close(pixels[0, :, 5, 5], expected)
        assert vit.preprocessing.interpolation == "bilinear"


def test_single_file_state_dicts_load_exactly(tmp_path, source_model):
    state = source_model.model.state_dict()
    save_file(state, str(tmp_path / "w.safetensors"))
    torch.save({"state_dict": state, "epoch": 3}, tmp_path / "nested.pth")
    torch.save(state, tmp_path / "bare.pt")
    torch.save({"model": {f"module.{k}": v for k, v in state.items()}}, tmp_path / "ddp.pth")
    for name in ("w.safetensors", "nested.pth", "bare.pt", "ddp.pth"):
        vit = load_vit(tmp_path / name, arch=ARCH, img_size=32, depth=2)
        assert vit.num_classes == 3  # inferred from the head
        _assert_same_weights(vit, source_model)
        x = torch.randn(1, 3, 32, 32)
        torch.testing.assert_close(capture_attention(vit, x).logits, capture_attention(source_model, x).logits)


def test_single_file_needs_an_architecture(tmp_path, source_model):
    save_file(source_model.model.state_dict(), str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError, match="arch="):
        load_vit(tmp_path / "w.safetensors")


def test_wrong_keys_and_shapes_are_listed(tmp_path, source_model):
    state = dict(source_model.model.state_dict())
    state.pop("cls_token")
    state["extra.weight"] = torch.zeros(1)
    save_file(state, str(tmp_path / "bad.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing keys \(1\): cls_token.*unexpected keys \(1\): extra.weight"):
        load_vit(tmp_path / "bad.safetensors", arch=ARCH, img_size=32, depth=2)
    save_file(source_model.model.state_dict(), str(tmp_path / "w.safetensors"))
    with pytest.raises(CheckpointError, match="wrong shapes"):
        load_vit(tmp_path / "w.safetensors", arch="vit_small_patch16_224", img_size=32, depth=2)


def test_missing_file_and_folder_without_config(tmp_path):
    with pytest.raises(ModelPathNotFoundError, match=f"^The path '{tmp_path}/nope.safetensors' does not exist:"):
        load_vit(tmp_path / "nope.safetensors", arch=ARCH)
    with pytest.raises(CheckpointError, match="config.json"):
        load_vit(str(tmp_path))


@pytest.mark.parametrize(
    "source",
    [
        "./my_model",
        "../models/vit",
        "~/no_such_vit_folder_xyz",
        "/no/such/folder",
        "models/vit_b16",
        "models\\vit_b16",
        "C:\\models\\vit",
        "vit_weights.pth",
        "local-dir:no_such_folder",
        "local-dir:/no/such/folder",
    ],
)
def test_a_path_that_does_not_exist_says_so_not_unknown_model(source, monkeypatch, tmp_path):
    """Anything written as a path (a separator, a leading . or ~, a drive, a weights suffix,
    local-dir:) that names nothing is a ModelPathNotFoundError naming the path; never 'Unknown timm
    model'. Relative paths also show where they were looked up."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelPathNotFoundError) as caught:
        load_vit(source, pretrained=False)
    message = str(caught.value)
    given = source.removeprefix("local-dir:")
    assert message.startswith(f"The path {given!r} does not exist")
    assert "Unknown timm model" not in message and "config.json and model.safetensors" in message
    assert caught.value.path == Path(given).expanduser()
    if not Path(given).expanduser().is_absolute():
        assert str(tmp_path / Path(given)) in message
    for _name, load in (("CNN", lambda: load_cnn(source, pretrained=False)),):  # the comparison CNN's loader too
        with pytest.raises(ModelPathNotFoundError, match=f"^The path {re.escape(repr(given))} does not exist"):
            load()


@pytest.mark.parametrize(
    "name", ["vit_nonexistent_patch16_224", "vit_base_patch16_224.no_such_tag", "my_model", "resnet_50_typo"]
)
def test_a_model_name_that_is_not_a_path_is_still_an_unknown_model(name, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError) as caught:
        load_vit(name, pretrained=False)
    assert not isinstance(caught.value, ModelPathNotFoundError)
    assert re.match(r"Unknown timm model|'vit_base_patch16_224' has no pretrained tag", str(caught.value))


@pytest.mark.parametrize(
    "source, expected",
    [
        ("vit_base_patch16_224.augreg2_in21k_ft_in1k", False),
        ("hf-hub:timm/vit_base_patch16_224.augreg_in21k", False),
        ("hf:google/vit-base-patch16-224", False),
        ("torchvision:vit_b_16", False),
        ("demo", False),
        ("my_model", False),
        ("./m", True),
        ("~/m", True),
        ("/m", True),
        ("a/b", True),
        ("a\\b", True),
        ("D:/m", True),
        ("m.safetensors", True),
        ("M.PT", True),
        ("m.npz", True),
        ("local-dir:m", True),
        (".hidden", True),
    ],
)
def test_what_looks_like_a_path(source, expected):
    assert looks_like_path(source) is expected


class _Exploit:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_malicious_pickle_never_runs(tmp_path):
    marker = tmp_path / "pwned.txt"
    torch.save({"state_dict": {"x": _Exploit(str(marker))}}, tmp_path / "evil.pth")
    with pytest.raises(CheckpointError, match="weights_only"):
        load_vit(tmp_path / "evil.pth", arch=ARCH)
    assert not marker.exists()


def test_unknown_name_suggests_close_matches():
    with pytest.raises(ModelLoadError, match="vit_base_patch16_224"):
        load_vit("vit_base_patch16_22", pretrained=False)


def test_non_vits_are_refused():
    for name in ("resnet18", "convnext_atto"):
        with pytest.raises(UnsupportedModelError, match="Supported"):
            load_vit(name, pretrained=False)


def test_offline_pretrained_fails_fast_with_advice(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(WeightsUnavailableError, match="demo"):
        load_vit("vit_tiny_patch16_224.augreg_in21k_ft_in1k")
    with pytest.raises(WeightsUnavailableError):
        load_vit("hf-hub:timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k")
    assert time.monotonic() - start < 10


def test_overridden_img_size_wins_over_the_pretrained_default():
    vit = load_vit("vit_tiny_patch16_224", pretrained=False, img_size=96, depth=1)
    assert vit.spec.img_size == (96, 96) and vit.spec.grid_size == (6, 6)
    assert vit.preprocess(Image.new("RGB", (300, 200))).shape == (1, 3, 96, 96)
    assert vit.data_config["input_size"] == (3, 96, 96)
    assert vit.class_names is not None and len(vit.class_names) == 1000  # ImageNet-1k head


def test_preprocess_centre_crops_like_timm():
    vit = load_vit("vit_tiny_patch16_224", pretrained=False, img_size=(32, 64), depth=1)
    image = Image.fromarray(np.arange(100 * 300 * 3, dtype=np.uint8).reshape(100, 300, 3) % 251)
    crop = vit.model_input_image(image)
    assert crop.size == (64, 32)
    assert vit.preprocess(image).shape == (1, 3, 32, 64)


def test_device_auto_selection_and_bad_devices():
    vit = load_vit("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1)
    mps = getattr(torch.backends, "mps", None)
    expected = "cuda" if torch.cuda.is_available() else "mps" if mps is not None and mps.is_available() else "cpu"
    assert vit.device.type == expected
    assert next(vit.model.parameters()).device.type == expected
    with pytest.raises(ModelLoadError, match="device"):
        load_vit("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1, device="gpu")


def test_demo_model_loads_or_says_how_to_get_it(monkeypatch, tmp_path):
    vit = load_vit("demo")
    assert vit.class_names and vit.num_classes == len(vit.class_names)
    import analysis.model.loading as loading

    assert loading.DEMO_MODELS["demo"][0] == DEMO_MODEL_DIR
    folder, command = loading.DEMO_MODELS["demo"]
    monkeypatch.setitem(loading.DEMO_MODELS, "demo", (tmp_path / folder.name, command))
    with pytest.raises(ModelLoadError, match=r"git checkout -- assets/demo_vit.*python -m training\.train_demo_vit`"):
        load_vit("demo")


@pytest.mark.parametrize("crop_mode", ["center", "squash", "border"])
@pytest.mark.parametrize("img_size", [None, (96, 160), (160, 96)])
def test_preprocess_matches_timms_eval_transform(crop_mode, img_size):
    """Pixel for pixel the transform timm builds from the data config, on per-pixel noise (a
    one-pixel offset in the resize or the crop changes most pixels by tens of grey levels)."""
    import timm.data

    from analysis.base.preprocessing import Preprocessing

    kwargs = {"img_size": img_size} if img_size else {}
    vit = load_vit("deit_tiny_patch16_224", pretrained=False, depth=1, **kwargs)  # crop_pct 0.875
    config = {**vit.data_config, "crop_mode": crop_mode}
    ours = Preprocessing.from_data_config(config, vit.spec.img_size)
    transform = timm.data.create_transform(**config)
    std = torch.tensor(ours.std).view(1, 3, 1, 1)
    rng = np.random.RandomState(0)
    for size in ((800, 600), (600, 800), (333, 517), (517, 333), (100, 50), (224, 224)):
        image = Image.fromarray(rng.randint(0, 256, (size[1], size[0], 3), dtype=np.uint8))
        diff_in_levels = ((ours(image) - transform(image).unsqueeze(0)) * std * 255).abs()  # 8-bit levels
        assert diff_in_levels.max() <= 1.0, (size, float(diff_in_levels.max()))


def test_squash_models_use_squash():
    vit = load_vit("vit_medium_patch16_gap_384", pretrained=False, depth=1)
    assert vit.preprocessing.crop_mode == "squash"
    wide = Image.new("RGB", (800, 200), (0, 0, 0))
    wide.paste((255, 255, 255), (0, 0, 100, 200))  # a white band at the far left survives squashing
    assert vit.model_input_image(wide).getpixel((5, 192)) == (255, 255, 255)


def test_extreme_aspect_ratios_and_tiny_images_load_fast():
    vit = load_vit("vit_tiny_patch16_224", pretrained=False, depth=1)
    start = time.monotonic()
    for size in ((1, 1), (1, 20000), (20000, 2)):
        assert vit.preprocess(Image.new("RGB", size, (9, 9, 9))).shape == (1, 3, 224, 224)
    assert time.monotonic() - start < 2


def test_a_checkpoint_loads_at_another_resolution(tmp_path, source_model):
    """img_size= on a saved model resamples its position embedding, as timm does for hub weights."""
    from timm.layers import resample_abs_pos_embed

    save_file(source_model.model.state_dict(), str(tmp_path / "w.safetensors"))
    vit = load_vit(tmp_path / "w.safetensors", arch=ARCH, img_size=48, depth=2)
    assert vit.spec.grid_size == (3, 3)
    expected = resample_abs_pos_embed(source_model.model.pos_embed.detach(), new_size=[3, 3], num_prefix_tokens=1)
    torch.testing.assert_close(vit.model.pos_embed.detach(), expected)
    assert torch.equal(vit.model.blocks[0].attn.qkv.weight, source_model.model.blocks[0].attn.qkv.weight)


def test_attention_variants_are_refused():
    with pytest.raises(UnsupportedModelError, match="DiffAttention"):
        load_vit("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1, attn_layer="diff")


def test_img_size_must_be_whole_patches():
    with pytest.raises(UnsupportedModelError, match="not a multiple of the patch size"):
        load_vit("vit_tiny_patch16_224", pretrained=False, img_size=50, depth=1)


def test_bad_pretrained_tag_lists_the_valid_ones():
    with pytest.raises(ModelLoadError, match="augreg_in21k_ft_in1k"):
        load_vit("vit_tiny_patch16_224.bogus_tag")


def test_npz_head_size_is_read_from_the_file(tmp_path):
    from analysis.model.loading.checkpoints import npz_num_classes as _npz_num_classes

    np.savez(tmp_path / "in21k.npz", **{"head/bias": np.zeros(21843, np.float32), "head/kernel": np.zeros((2, 21843))})
    np.savez(tmp_path / "headless.npz", **{"embedding/bias": np.zeros(4, np.float32)})
    assert _npz_num_classes(tmp_path / "in21k.npz") == 21843
    assert _npz_num_classes(tmp_path / "headless.npz") == 0
    (tmp_path / "broken.npz").write_bytes(b"nope")
    with pytest.raises(CheckpointError):
        load_vit(tmp_path / "broken.npz", arch=ARCH)


def test_random_weights_are_the_same_on_every_load_and_leave_the_callers_random_stream_alone():
    """``pretrained=False`` (the app's ``random:``) builds under a fixed seed, so a model loaded
    again (e.g. after a cache eviction) is the one whose results were cached; the caller's RNG
    continues as if nothing had been drawn."""
    from analysis.robustness import load_cnn

    torch.manual_seed(123)
    first = load_vit("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1)
    after_load = torch.rand(3)
    torch.manual_seed(456)  # a different caller state: the weights must not depend on it
    second = load_vit("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1)
    torch.manual_seed(123)
    assert torch.equal(after_load, torch.rand(3))
    one, two = first.model.state_dict(), second.model.state_dict()
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    assert one["blocks.0.attn.qkv.weight"].std() > 0  # random, not zeros
    cnns = [load_cnn("resnet10t", pretrained=False).model.state_dict() for _ in range(2)]
    assert all(torch.equal(cnns[0][k], cnns[1][k]) for k in cnns[0])


@pytest.mark.parametrize("loader", ["load_clip", "load_mae"])
@pytest.mark.parametrize("source", ["./my_clip", "/no/such/folder", "local-dir:no_such_folder", "models/mae"])
def test_the_text_and_mae_loaders_say_a_missing_path_does_not_exist(loader, source, monkeypatch, tmp_path):
    """load_clip and load_mae (the Text prompts and Masked autoencoder pages' model fields) name a
    missing path as such, as load_vit does: not 'no text tower' or 'cannot open'."""
    from analysis.mae import load_mae

    load = {"load_clip": analysis.load_clip, "load_mae": load_mae}[loader]
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelPathNotFoundError) as caught:
        load(source)
    assert str(caught.value).startswith(f"The path {source.removeprefix('local-dir:')!r} does not exist")


@pytest.mark.parametrize(
    "model_args, what",
    [(dict(img_size=32, depth=400), "depth 400"), (dict(img_size=32, embed_dim=1_000_002, num_heads=2), "width 10^6")],
)
def test_a_config_larger_than_its_weights_is_refused_before_anything_is_built(tmp_path, monkeypatch, model_args, what):
    """A folder's config.json that describes a far larger model than its weights (a 2-block ViT-Ti)
    is refused with a typed error naming both sizes; the model is only ever built on the meta device
    (no memory), never for real. The folder with its own config still loads."""
    import analysis.model.loading.files as files

    torch.manual_seed(0)
    small = analysis.load_vit("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, num_classes=3)
    folder = tmp_path / "model"
    folder.mkdir()
    save_file(small.model.state_dict(), str(folder / "model.safetensors"))
    config = {"architecture": "vit_tiny_patch16_224", "num_classes": 3, "model_args": {"img_size": 32, "depth": 2}}
    (folder / "config.json").write_text(json.dumps(config))
    assert analysis.load_vit(str(folder)).spec.num_layers == 2

    devices = []
    build = files.create_timm_model

    def recorded(*args, **kwargs):
        devices.append(str(torch.get_default_device()))
        return build(*args, **kwargs)

    monkeypatch.setattr(files, "create_timm_model", recorded)
    (folder / "config.json").write_text(json.dumps({**config, "model_args": model_args}))
    started = time.perf_counter()
    with pytest.raises(
        analysis.CheckpointError, match=r"describes a vit_tiny_patch16_224 of [\d,.]+ M values, but model"
    ):
        analysis.load_vit(str(folder))
    assert devices == ["meta"], (what, devices)
    assert time.perf_counter() - started < 20, what


class _Values(torch.nn.Module):
    """A module of exactly ``count`` values (one buffer)."""

    def __init__(self, count: int):
        super().__init__()
        self.register_buffer("x", torch.empty(count))


def test_the_shared_check_counts_the_model_on_meta_against_the_files_plus_16_mebivalues(tmp_path):
    """values_beyond_weights, the part both config checks share: a file of 2·5 + 3 = 13 values, read
    twice (26); the model fits up to 26 + 16·2²⁰ values and is refused one value later; a model that
    cannot be built on meta is not this check's call; an unreadable header is a typed error."""
    import analysis.model.loading.files as files

    weights = tmp_path / "w.safetensors"
    save_file({"a": torch.zeros(2, 5), "b": torch.zeros(3)}, str(weights))
    limit = 26 + 16 * 2**20
    assert files.values_beyond_weights(lambda: _Values(limit), [weights, weights]) is None
    assert files.values_beyond_weights(lambda: _Values(limit + 1), [weights, weights]) == (limit + 1, 26)
    assert files.values_beyond_weights(lambda: torch.nn.Linear(5000, 4000), [weights]) == (5000 * 4000 + 4000, 13)

    def unbuildable():
        raise RuntimeError("no meta")

    assert files.values_beyond_weights(unbuildable, [weights]) is None
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 16)
    with pytest.raises(CheckpointError, match=r"^bad\.safetensors is not a readable safetensors file"):
        files.values_beyond_weights(lambda: _Values(1), [bad])


def test_the_timm_config_check_keeps_its_message_with_the_counts_of_real_builds(tmp_path):
    """check_config_fits_weights on a depth-400 ViT-Ti against a 13-value file: the message, written
    out, with the model's values extrapolated from real depth-1 and depth-2 builds (each block adds
    the same values)."""
    import timm

    import analysis.model.loading.files as files

    def values(depth: int) -> int:
        model = timm.create_model(ARCH, pretrained=False, img_size=32, depth=depth)
        return sum(t.numel() for t in model.state_dict().values())

    needed = values(1) + 399 * (values(2) - values(1))
    weights = tmp_path / "w.safetensors"
    save_file({"a": torch.zeros(2, 5), "b": torch.zeros(3)}, str(weights))
    with pytest.raises(CheckpointError) as caught:
        files.check_config_fits_weights(tmp_path, ARCH, weights, img_size=32, depth=400)
    assert str(caught.value) == (
        f"{tmp_path / 'config.json'} describes a {ARCH} of {needed / 1e6:,.1f} M values, but w.safetensors holds "
        f"{13 / 1e6:,.1f} M: the config does not fit its weights (check model_args: depth, embed_dim, ...). "
        "Nothing was built."
    )
