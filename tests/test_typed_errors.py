"""Every public function, given bad arguments, raises one of the project's typed errors.

A bare ``KeyError``/``IndexError``/``TypeError`` from deep inside torch tells a notebook user
nothing; ours say what was wrong and what to pass instead.
"""

from __future__ import annotations

import re

import pytest
import torch

import analysis
from analysis import (
    VitExplorerError,
    attention_map,
    attention_mass,
    attention_rollout,
    attention_rollout_by_layer,
    capture_attention,
    capture_tokens,
    class_label,
    class_probabilities,
    corresponding_layer,
    corresponding_query,
    dataset_attention_distance,
    decomposed_relative_position,
    distance_in_units,
    distance_unit_length,
    explain,
    feature_pca,
    high_norm_tokens,
    label_space,
    load_clip,
    load_image,
    load_vit,
    logit_lens,
    masked_image,
    mean_attention_distance,
    outlier_patches,
    patch_embedding_components,
    patch_similarity,
    pooling_attention_map,
    position_embedding_similarity,
    read_image_archive,
    relative_position_bias,
    representation_similarity,
    rollout_maps,
    rotary_position_features,
    scale_by_peak,
    shared_label_space,
    similarity_by_distance,
    similarity_distance_bins,
    token_norms,
    top_classes,
    top_mass_mask,
    uniform_attention_distance,
    uniform_attention_distance_by_layer,
    uniform_distance_reference,
    upsample_map,
)
from conftest import make_vit


@pytest.fixture(scope="module")
def vit():
    return make_vit("registers")


@pytest.fixture(scope="module")
def pixels(vit):
    height, width = vit.spec.img_size
    return torch.randn(1, 3, height, width)


@pytest.fixture(scope="module")
def record(vit, pixels):
    return capture_attention(vit, pixels)


class Context:
    def __init__(self, vit, pixels, record):
        self.vit, self.pixels, self.record = vit, pixels, record
        self.layers, self.heads, self.patches = vit.spec.num_layers, vit.spec.num_heads, vit.spec.num_patches
        self.partial = capture_attention(vit, pixels, layers=[0], query_tokens=[0])


@pytest.fixture(scope="module")
def context(vit, pixels, record):
    return Context(vit, pixels, record)


CASES = [
    # capture
    ("layers empty", "layers is empty", lambda c: capture_attention(c.vit, c.pixels, layers=[])),
    ("layer too high", "layer=2 does not exist", lambda c: capture_attention(c.vit, c.pixels, layers=[c.layers])),
    ("layer too low", "layer=-3 does not exist", lambda c: capture_attention(c.vit, c.pixels, layers=[-c.layers - 1])),
    ("layer not an int", "must be an integer", lambda c: capture_attention(c.vit, c.pixels, layers=["0"])),
    ("layer a float", "must be an integer", lambda c: capture_attention(c.vit, c.pixels, layers=[0.5])),
    ("query token out of range", "outside", lambda c: capture_attention(c.vit, c.pixels, query_tokens=[10_000])),
    ("query token negative", "outside", lambda c: capture_attention(c.vit, c.pixels, query_tokens=[-1])),
    ("query tokens empty", "query_tokens is empty", lambda c: capture_attention(c.vit, c.pixels, query_tokens=[])),
    ("dtype not a dtype", "floating torch dtype", lambda c: capture_attention(c.vit, c.pixels, dtype="float16")),
    ("dtype an integer type", "floating torch dtype", lambda c: capture_attention(c.vit, c.pixels, dtype=torch.int64)),
    ("precision unknown", "precision must be", lambda c: capture_attention(c.vit, c.pixels, precision="fp8")),
    ("pixels not a tensor", "torch.Tensor", lambda c: capture_attention(c.vit, c.pixels.numpy())),
    ("pixels wrong rank", r"\(B, 3, H, W\)", lambda c: capture_attention(c.vit, c.pixels[0])),
    ("pixels integer", "floating point", lambda c: capture_attention(c.vit, (c.pixels * 100).long())),
    ("pixels wrong size", "expects 56x56", lambda c: capture_attention(c.vit, c.pixels[..., :-1, :-1])),
    ("empty batch", "no image", lambda c: capture_attention(c.vit, c.pixels[:0])),
    (
        "rollout of something other than a record",
        "takes the record that capture_attention",
        lambda c: rollout_maps(c.vit),
    ),
    # maps
    ("map layer out of range", "layer=2 does not exist", lambda c: attention_map(c.record, c.layers)),
    ("map layer not captured", "not captured", lambda c: attention_map(c.partial, 1)),
    ("map layer not an int", "layer must be an integer", lambda c: attention_map(c.record, "last")),
    ("rows layer out of range", "layer=2 does not exist", lambda c: analysis.attention_rows(c.record, c.layers)),
    ("rows of a record without every query", "were not captured", lambda c: analysis.attention_rows(c.partial, 0)),
    ("map head out of range", "head=6 does not exist", lambda c: attention_map(c.record, 0, head=c.heads)),
    ("map head negative", "head=-7 does not exist", lambda c: attention_map(c.record, 0, head=-c.heads - 1)),
    ("map head not an int", "head must be an integer", lambda c: attention_map(c.record, 0, head="mean")),
    ("map query out of range", "outside the 4x4 grid", lambda c: attention_map(c.record, 0, query=c.patches)),
    ("map query unknown", "query must be", lambda c: attention_map(c.record, 0, query="dist")),
    ("map query float", "query must be", lambda c: attention_map(c.record, 0, query=1.5)),
    ("map query row not captured", "not captured", lambda c: attention_map(c.partial, 0, query=3)),
    ("map of a non-record", "AttentionRecord", lambda c: attention_map(torch.zeros(3), 0)),
    ("pooling map of a non-record", "AttentionRecord", lambda c: pooling_attention_map(torch.zeros(3))),
    ("scaling with an unknown negative rule", "negative must be", lambda c: scale_by_peak([[1.0]], negative="abs")),
    ("scaling a 1-d map", r"\(\.\.\., h, w\)", lambda c: scale_by_peak([1.0, 2.0])),
    ("corresponding layer not an int", "layer must be an integer", lambda c: corresponding_layer("last", c.layers, 12)),
    (
        "corresponding layer of a model without layers",
        "to_layers must be at least 1",
        lambda c: corresponding_layer(0, c.layers, 0),
    ),
    (
        "corresponding query outside the grid",
        "outside the 4x4 grid",
        lambda c: corresponding_query(16, (4, 4), (2, 2), True),
    ),
    ("corresponding query of a float", "query must be", lambda c: corresponding_query(1.5, (4, 4), (2, 2), True)),
    ("corresponding query to a bad grid", "to_grid must be a", lambda c: corresponding_query(0, (4, 4), 2, True)),
    (
        "similarity by distance of a flat grid",
        r"\(gh, gw, gh, gw\)",
        lambda c: similarity_by_distance(torch.ones(4, 4).numpy()),
    ),
    (
        "similarity by distance in zero units",
        "must be positive",
        lambda c: similarity_by_distance(torch.ones(2, 2, 2, 2).numpy(), unit=0),
    ),
    (
        "distance bins of a flat grid",
        r"\(gh, gw, gh, gw\)",
        lambda c: similarity_distance_bins(torch.ones(4, 4).numpy()),
    ),
    (
        "distance bins of zero width",
        "must be positive",
        lambda c: similarity_distance_bins(torch.ones(2, 2, 2, 2).numpy(), bin_width=0),
    ),
    # rollout
    ("rollout fusion unknown", "head_fusion", lambda c: attention_rollout(c.record, head_fusion="median")),
    ("rollout discard above 1", "discard_ratio", lambda c: attention_rollout(c.record, discard_ratio=1.5)),
    ("rollout discard negative", "discard_ratio", lambda c: attention_rollout(c.record, discard_ratio=-0.1)),
    ("rollout start out of range", "start_layer", lambda c: attention_rollout(c.record, start_layer=c.layers)),
    ("rollout end before start", "end_layer", lambda c: attention_rollout(c.record, start_layer=1, end_layer=0)),
    ("rollout query out of range", "outside the 4x4 grid", lambda c: attention_rollout(c.record, query=c.patches)),
    ("rollout of partial rows", "every query row", lambda c: attention_rollout(c.partial)),
    (
        "rollout by layer start out of range",
        "start_layer",
        lambda c: attention_rollout_by_layer(c.record, start_layer=-c.layers - 1),
    ),
    (
        "rollout maps by layer with an end layer",
        "end_layer=None",
        lambda c: rollout_maps(c.record, end_layer=2, by_layer=True),
    ),
    # representation similarity
    ("similarity kernel", "linear", lambda c: representation_similarity(c.vit, "demo:8", kernel="rbf")),
    (
        "similarity minibatch too small",
        "batch_size",
        lambda c: representation_similarity(c.vit, "demo:8", batch_size=3),
    ),
    ("similarity of a missing folder", "neither a folder", lambda c: representation_similarity(c.vit, "/no/such")),
    ("similarity of one image", "at least 2 images", lambda c: representation_similarity(c.vit, "demo:1")),
    # distance
    ("distance of partial rows", "not captured", lambda c: mean_attention_distance(c.partial)),
    ("distance of a non-record", "takes the record that capture_attention", lambda c: mean_attention_distance(None)),
    ("uniform distance of a non-spec", "ViTSpec", lambda c: uniform_attention_distance((8, 8))),
    ("uniform distance by layer of a non-spec", "ViTSpec", lambda c: uniform_attention_distance_by_layer((8, 8))),
    ("uniform distance reference of a non-spec", "ViTSpec", lambda c: uniform_distance_reference((8, 8))),
    ("distance unit unknown", "distance unit", lambda c: distance_unit_length(c.vit, "inches")),
    ("distance unit of a non-spec", "ViTSpec", lambda c: distance_unit_length((16, 16), "patches")),
    ("distance in units, unknown unit", "distance unit", lambda c: distance_in_units(3.0, c.vit, "cm")),
    ("upsample unknown mode", "upsampling mode", lambda c: upsample_map([[1.0]], (4, 4), mode="cubic")),
    ("upsample a 1-d map", r"\(gh, gw\)", lambda c: upsample_map([1.0, 2.0], (4, 4))),
    ("upsample to zero rows", "at least 1", lambda c: upsample_map([[1.0]], (0, 4))),
    ("mask a grey image", r"\(H, W, 3\)", lambda c: masked_image([[0, 0]], [[1.0]])),
    ("tokens of an unknown kind", "kind must be", lambda c: capture_tokens(c.vit, c.pixels, kind="mlp")),
    ("tokens of a missing layer", "layer=99 does not exist", lambda c: capture_tokens(c.vit, c.pixels, layers=[99])),
    ("logit lens of a headless model", "has none", lambda c: logit_lens(c.vit, c.pixels)),
    ("logit lens of a non-tensor", "torch.Tensor", lambda c: logit_lens(c.vit, "image.png")),
    ("pca of wrong-length tokens", "T=21", lambda c: feature_pca(torch.ones(1, 3, 4), c.vit.spec)),
    (
        "pca with zero components",
        "n_components",
        lambda c: feature_pca(torch.ones(1, c.vit.spec.num_tokens, 4), c.vit.spec, n_components=0),
    ),
    (
        "similarity to an unknown query",
        "query must be",
        lambda c: patch_similarity(torch.ones(1, c.vit.spec.num_tokens, 4), c.vit.spec, "corner"),
    ),
    ("norms of a vector", r"\(\.\.\., T, D\)", lambda c: token_norms(torch.ones(3))),
    ("outliers of 2-d norms", r"\(L, B, T\)", lambda c: high_norm_tokens(torch.ones(3, 4), 1)),
    (
        "probability rule unknown",
        "Unknown probability rule 'tanh'",
        lambda c: class_probabilities(torch.ones(1, 3), "tanh"),
    ),
    (
        "top classes of a batch, not one image's scores",
        "shape \\(classes,\\)",
        lambda c: top_classes(torch.ones(2, 3), 1),
    ),
    (
        "a class index past the model's classes",
        "not one of the model's 2 classes",
        lambda c: class_label(["cat", "dog"], 2),
    ),
    (
        "outlier patches of an image not in the batch",
        "outside the batch",
        lambda c: outlier_patches(high_norm_tokens(torch.ones(2, 1, 5), 1), image=1),
    ),
    (
        "outlier patches of stage grids",
        "windowed",
        lambda c: outlier_patches(
            analysis.tokens.HighNormTokens(
                thresholds=torch.zeros(1),
                mask=(torch.zeros(1, 4, dtype=torch.bool),),
                fraction=torch.zeros(1),
                first_layer=None,
            )
        ),
    ),
    ("attention mass of a non-record", "AttentionRecord", lambda c: attention_mass(None, [0])),
    ("explain unknown method", "Unknown explanation method", lambda c: explain(c.vit, c.pixels, method="lrp")),
    (
        "explain with an option of another method",
        "does not accept steps",
        lambda c: explain(c.vit, c.pixels, method="chefer", steps=3),
    ),
    (
        "explain with a misspelt option",
        "takes only steps, baseline",
        lambda c: explain(c.vit, c.pixels, method="integrated_gradients", step=3),
    ),
    ("explain a non-tensor", "torch.Tensor", lambda c: explain(c.vit, [[0.0]], method="chefer")),
    ("top mass above one", "mass must be", lambda c: top_mass_mask([[0.5, 0.5]], 1.2)),
    ("top mass of negative maps", "non-negative", lambda c: top_mass_mask([[0.5, -0.5]], 0.6)),
    ("dataset empty list", "No images", lambda c: dataset_attention_distance(c.vit, [])),
    ("dataset batch zero", "batch_size", lambda c: dataset_attention_distance(c.vit, [c.pixels], batch_size=0)),
    ("dataset batch float", "batch_size", lambda c: dataset_attention_distance(c.vit, [c.pixels], batch_size=2.5)),
    ("dataset single path", "wrap a single image", lambda c: dataset_attention_distance(c.vit, "assets/samples")),
    ("dataset on_error unknown", "on_error", lambda c: dataset_attention_distance(c.vit, [b"x"], on_error="ignore")),
    ("dataset bad image", "not an image", lambda c: dataset_attention_distance(c.vit, [b"not an image"])),
    # model-only analyses
    ("position grid zero", "grid_size", lambda c: position_embedding_similarity(c.vit, grid_size=(0, 4))),
    ("position grid not a pair", "grid_size", lambda c: position_embedding_similarity(c.vit, grid_size=5)),
    ("position kind unknown", "kind must be", lambda c: position_embedding_similarity(c.vit, kind="sinusoid")),
    ("rope on a table model", "no rotary", lambda c: rotary_position_features(c.vit)),
    ("window bias of a ViT", "position_embedding_similarity", lambda c: relative_position_bias(c.vit, 0)),
    ("window bias of a non-model", "LoadedViT", lambda c: relative_position_bias(None, 0)),
    (
        "decomposed positions of a ViT",
        "position_embedding_similarity",
        lambda c: decomposed_relative_position(c.vit, 0),
    ),
    ("components zero", "n_components", lambda c: patch_embedding_components(c.vit, 0)),
    ("components not an int", "n_components", lambda c: patch_embedding_components(c.vit, "all")),
    # inputs
    ("image empty bytes", "empty", lambda c: load_image(b"")),
    ("image missing file", "No image file", lambda c: load_image("no/such/image.png")),
    ("image of a wrong type", "Cannot read an image", lambda c: load_image(3)),
    ("archive not a zip", "not a readable zip", lambda c: read_image_archive(b"nope")),
    # loading
    ("model empty name", "empty name", lambda c: load_vit("", pretrained=False)),
    ("model unknown name", "Unknown timm model", lambda c: load_vit("vit_nonexistent_patch16_224", pretrained=False)),
    ("model of a wrong type", "load_vit takes", lambda c: load_vit(3.5)),
    ("model not a ViT", "not a Vision Transformer", lambda c: load_vit("resnet18", pretrained=False)),
    ("model device unknown", "Unknown device", lambda c: load_vit("demo", device="tpu9")),
    ("model file missing", "^The path 'weights.safetensors' does not exist", lambda c: load_vit("weights.safetensors")),
    ("model folder missing", "^The path './no_such_folder' does not exist", lambda c: load_vit("./no_such_folder")),
    ("label space of a non-model", "label_space takes a loaded model", lambda c: label_space(3)),
    (
        "shared label space of a non-model",
        "label_space takes a loaded model",
        lambda c: shared_label_space(c.vit, "demo"),
    ),
    ("two-tower model empty name", "load_clip takes", lambda c: load_clip("")),
    ("two-tower model of a wrong type", "load_clip takes", lambda c: load_clip(3.5)),
    ("two-tower model image-only", "image-only", lambda c: load_clip("demo")),
    ("two-tower model image-only object", "image-only", lambda c: load_clip(c.vit)),
    ("two-tower model device unknown", "Unknown device", lambda c: load_clip("demo", device="tpu9")),
]


@pytest.mark.parametrize("name, reason, call", CASES, ids=[name for name, _, _ in CASES])
def test_bad_arguments_raise_a_typed_error(context, name, reason, call):
    """Each case names the reason its message must give (a regular expression), so a case
    that fails for some other reason than the one it was written for fails here."""
    with pytest.raises(VitExplorerError) as info:
        call(context)
    assert isinstance(info.value, ValueError)  # every typed error is also a ValueError
    assert re.search(reason, str(info.value)), f"{name}: {info.value!r} does not say {reason!r}"


def test_every_public_function_is_walked():
    """A new public function must get bad-argument cases here."""
    walked = {
        "load_vit",
        "capture_attention",
        "attention_map",
        "attention_rollout",
        "attention_rollout_by_layer",
        "mean_attention_distance",
        "uniform_attention_distance",
        "uniform_attention_distance_by_layer",
        "uniform_distance_reference",
        "relative_position_bias",
        "decomposed_relative_position",
        "dataset_attention_distance",
        "distance_unit_length",
        "distance_in_units",
        "upsample_map",
        "masked_image",
        "top_mass_mask",
        "explain",
        "capture_tokens",
        "logit_lens",
        "token_norms",
        "high_norm_tokens",
        "attention_mass",
        "feature_pca",
        "patch_similarity",
        "position_embedding_similarity",
        "rotary_position_features",
        "patch_embedding_components",
        "load_image",
        "load_clip",
        "read_image_archive",
        "pooling_attention_map",
        "scale_by_peak",
        "corresponding_layer",
        "corresponding_query",
        "similarity_by_distance",
        "similarity_distance_bins",
        "rollout_maps",
        "attention_rows",
        "label_space",
        "shared_label_space",
        "outlier_patches",
        "class_probabilities",
        "top_classes",
        "class_label",
        "representation_similarity",
    }
    source = open(__file__).read()
    for name in walked:
        assert f"{name}(" in source.split("CASES = [")[1], name
    not_walked = {
        "position_encoding_kinds",
        "patch_embedding_filters",
        "asset_path",
    }  # asset_path joins names onto the assets
    # folder (whether the path exists is its caller's question, answered with the caller's own typed error)
    functions = {
        n for n in analysis.__all__ if callable(getattr(analysis, n)) and not isinstance(getattr(analysis, n), type)
    }
    assert functions <= walked | not_walked, functions - walked - not_walked
