"""One query parser: :func:`analysis.records.queries.resolve_query` is what every reader of "which query
token(s)" uses, and each former parser gives the results it gave before, on every query form.

The three parsers it replaced are kept below as they were (``_old_*``), the reference: the view's
``query_row``, the analyses' ``query_rows_for``, the notebook widget's (``view_query``, for a ViT); and the
query part of ``patch_similarity``. Pixel queries ``(y, x)`` are new to ``query_row`` and
``patch_similarity`` (the first failed on them, the second ignored them): they are checked
against the patch computed by hand, ``⌊y/ph⌋·gw + ⌊x/pw⌋``.
"""

from __future__ import annotations

import numbers

import pytest
import torch

import analysis
from analysis.base.errors import AnalysisError
from analysis.records.queries import parse_prefix_query, patch_of_pixel, query_rows_for, resolve_query
from analysis.tokens.features import patch_similarity
from analysis.views.attention_view import query_row, view_query
from conftest import make_vit, random_pixels

KINDS = ("class_token", "registers", "distilled", "no_class_token", "non_square")


@pytest.fixture(scope="module")
def models():
    return {kind: make_vit(kind) for kind in KINDS}


# --------------------------------------------------------------------------- the former parsers


def _old_query_row(query, spec) -> int:
    token = parse_prefix_query(query)
    if token is not None:
        return token
    if query == "cls":
        return 0
    if query == "mean":
        return spec.num_tokens
    return spec.num_prefix_tokens + int(query)


def _old_query_rows_for(record, query) -> list[int]:
    spec = record.spec
    query = ("cls" if spec.has_class_token else "mean") if query is None else query
    prefix = spec.num_prefix_tokens
    if isinstance(query, tuple):
        return record.query_rows([prefix + patch_of_pixel(spec, query)])
    token = parse_prefix_query(query)
    if token is not None:
        if not 0 <= token < prefix:
            raise AnalysisError("prefix")
        return record.query_rows([token])
    if isinstance(query, str):
        if query == "cls":
            if not spec.has_class_token:
                raise AnalysisError("cls")
            return record.query_rows([0])
        if query == "mean":
            return record.query_rows(range(prefix, prefix + spec.num_patches))
        raise AnalysisError("form")
    if isinstance(query, bool) or not isinstance(query, numbers.Integral):
        raise AnalysisError("type")
    if not 0 <= int(query) < spec.num_patches:
        raise AnalysisError("outside")
    return record.query_rows([prefix + int(query)])


def _old_widget_query(spec, query):
    if query is None:
        return "cls" if spec.has_class_token and not spec.is_windowed else "mean"
    if isinstance(query, tuple):
        return patch_of_pixel(spec, query)
    return query


def _old_similarity_vector(tokens, spec, query, image=0):
    patches = spec.split_prefix(tokens, 1)[1][image].double()
    token = parse_prefix_query(query)
    if token is not None:
        return tokens[image, token].double()
    if query == "cls":
        return tokens[image, 0].double()
    if query == "mean":
        return patches.mean(0)
    return patches[int(query)]


def _valid_queries(spec) -> list:
    """Every form a model accepts: its prefix tokens, the class token, the mean, patches at the
    corners and inside, and input pixels (corners of the input and inside a patch)."""
    height, width = spec.img_size
    queries: list = [None, "mean", 0, spec.num_patches - 1, spec.num_patches // 2 + 1]
    queries += [f"prefix:{i}" for i in range(spec.num_prefix_tokens)]
    queries += ["cls"] if spec.has_class_token else []
    queries += [(0, 0), (height - 1, width - 1), (height // 2 + 3, width // 3 + 1)]
    return queries


def _invalid_queries(spec) -> list:
    queries: list = [
        spec.num_patches,
        -1,
        "middle",
        1.5,
        True,
        f"prefix:{spec.num_prefix_tokens}",
        (spec.img_size[0], 0),
    ]
    return queries + ([] if spec.has_class_token else ["cls"])


def _by_hand(spec, pixel) -> int:
    (ph, pw), gw = spec.patch_size, spec.grid_size[1]
    return pixel[0] // ph * gw + pixel[1] // pw


# --------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("kind", KINDS)
def test_the_analyses_rows_are_as_before_on_every_query_form(models, kind):
    vit = models[kind]
    record = analysis.capture_attention(vit, random_pixels(vit, batch=1))
    for query in _valid_queries(vit.spec):
        assert query_rows_for(record, query) == _old_query_rows_for(record, query), query
    for query in _invalid_queries(vit.spec):
        with pytest.raises(AnalysisError):
            _old_query_rows_for(record, query)
        with pytest.raises(AnalysisError):
            query_rows_for(record, query)


@pytest.mark.parametrize("kind", KINDS)
def test_the_views_row_is_as_before_and_a_pixel_is_its_patch(models, kind):
    spec = models[kind].spec
    for query in _valid_queries(spec):
        if query is None:
            continue  # the view always passes its query; the former parser took None for a patch index
        if isinstance(query, tuple):
            assert query_row(query, spec) == spec.num_prefix_tokens + _by_hand(spec, query)
        else:
            assert query_row(query, spec) == _old_query_row(query, spec), query
    assert query_row(None, spec) == (0 if spec.has_class_token else spec.num_tokens)


@pytest.mark.parametrize("kind", KINDS)
def test_the_widgets_query_is_as_before_on_every_query_form(models, kind):
    spec = models[kind].spec
    for query in _valid_queries(spec):
        assert view_query(spec, spec.num_layers - 1, query) == _old_widget_query(spec, query), query


@pytest.mark.parametrize("kind", KINDS)
def test_patch_similaritys_query_is_as_before_and_a_pixel_is_its_patch(models, kind):
    vit = models[kind]
    tokens = torch.randn(2, vit.spec.num_tokens, 8, generator=torch.Generator().manual_seed(2))
    patches = vit.spec.split_prefix(tokens, 1)[1][1].double()
    for query in _valid_queries(vit.spec):
        if query is None:
            continue  # the former parser refused None
        if isinstance(query, tuple):
            vector = patches[_by_hand(vit.spec, query)]
        else:
            vector = _old_similarity_vector(tokens, vit.spec, query, image=1)
        expected = torch.nn.functional.cosine_similarity(patches, vector[None], dim=-1, eps=1e-12)
        got = patch_similarity(tokens, vit.spec, query, image=1)
        torch.testing.assert_close(got, expected.float().reshape(vit.spec.grid_size), rtol=0, atol=0)


def test_the_resolved_query_names_its_tokens_and_canonical_form(models):
    spec = models["registers"].spec  # a class token and four registers
    prefix, patches = spec.num_prefix_tokens, spec.num_patches
    assert resolve_query(spec, None) == resolve_query(spec, "cls")
    assert resolve_query(spec, "cls").tokens == (0,)
    assert resolve_query(spec, "prefix:3").tokens == (3,) and resolve_query(spec, "prefix:3").query == "prefix:3"
    mean = resolve_query(spec, "mean")
    assert mean.mean and mean.tokens == tuple(range(prefix, prefix + patches)) and mean.patch is None
    pixel = resolve_query(spec, (20, 30))
    assert pixel.query == pixel.patch == _by_hand(spec, (20, 30)) and pixel.tokens == (prefix + pixel.patch,)
    gap = models["no_class_token"].spec
    assert resolve_query(gap, None).mean
    with pytest.raises(AnalysisError, match="no class token"):
        resolve_query(gap, "cls")
