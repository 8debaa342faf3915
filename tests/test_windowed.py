"""Windowed attention (issue 23, first step): timm Swin v1 and v2, random weights, small sizes.

The references here write the window arithmetic out by hand: the cyclic shift as index
arithmetic on the grid, the partition as loops over windows, the relative-position index
and the shift mask's roll regions from their definitions. Nothing calls timm's
``window_partition`` or the project's :class:`~analysis.model.geometry.LayerGeometry` to build them.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import analysis
import analysis.robustness  # noqa: F401 - analysis.robustness.* below
from analysis import AnalysisError, attention_map, capture_attention, load_vit
from analysis.base.errors import UnsupportedModelError
from windowed_models import SWIN_SMALL_GEOMETRY, assert_bias_image_is_per_pair, small_pixels, small_sam, small_swin

# The stages of SWIN_SMALL: 64 px / patch 4 = 16x16 cells, then 8x8 after one patch merging.
EXPECTED_GEOMETRY = SWIN_SMALL_GEOMETRY  # (stage, grid, stride, window, shift, heads) per layer


@pytest.fixture(scope="module")
def swin():
    return small_swin(bias_seed=1)


@pytest.fixture(scope="module")
def swin_v2():
    return small_swin("swinv2_tiny_window8_256")


@pytest.fixture(scope="module")
def pixels():
    return small_pixels()


@pytest.fixture(scope="module")
def record(swin, pixels):
    return capture_attention(swin, pixels)


def _set_fused(model: torch.nn.Module, fused: bool) -> None:
    for module in model.modules():
        if hasattr(module, "fused_attn") and type(module).__name__ == "WindowAttention":
            module.fused_attn = fused


# --------------------------------------------------------------------------- the hand reference


def _block_inputs(model, pixels) -> list[torch.Tensor]:
    """What each block's attention branch is applied to, ``(B, H, W, C)``: ``norm1(x)`` for
    Swin v1 (pre-norm), ``x`` itself for v2 (post-norm)."""
    inputs = []
    handles = []
    for stage in model.layers:
        for block in stage.blocks:
            v2 = type(block).__name__ == "SwinTransformerV2Block"
            handles.append(
                block.register_forward_pre_hook(
                    lambda mod, args, v2=v2: inputs.append(args[0].detach() if v2 else mod.norm1(args[0]).detach())
                )
            )
    try:
        with torch.no_grad():
            model(pixels)
    finally:
        for handle in handles:
            handle.remove()
    return inputs


def _roll_region(position: int, side: int, window: int, shift: int) -> int:
    """Swin's three roll regions along one axis of the shifted grid: [0, side−window),
    [side−window, side−shift), [side−shift, side)."""
    if shift == 0:
        return 0
    return 0 if position < side - window else (1 if position < side - shift else 2)


def _relative_index(wh: int, ww: int) -> torch.Tensor:
    """``(Wt, Wt)``: slot i = (yi, xi), slot j = (yj, xj) -> (yi−yj+wh−1)·(2ww−1) + (xi−xj+ww−1)."""
    index = torch.empty(wh * ww, wh * ww, dtype=torch.long)
    for i in range(wh * ww):
        for j in range(wh * ww):
            (yi, xi), (yj, xj) = divmod(i, ww), divmod(j, ww)
            index[i, j] = (yi - yj + wh - 1) * (2 * ww - 1) + (xi - xj + ww - 1)
    return index


@torch.no_grad()
def reference_windows(model, pixels) -> list[torch.Tensor]:
    """Per layer ``(B, windows, heads, Wt, Wt)`` float64, recomputed by hand from each block's
    own weights: v1 ``softmax(scale·q·kᵀ + B + M)``, v2 ``softmax(τ·cos(q, k) + 16σ(cpb) + M)``,
    with masked pairs −∞ (exactly 0)."""
    out = []
    blocks = [block for stage in model.layers for block in stage.blocks]
    for block, x in zip(blocks, _block_inputs(model, pixels)):
        attn = block.attn
        x = x.double()
        batch, height, width, channels = x.shape
        (wh, ww), (sh, sw), heads = block.window_size, block.shift_size, attn.num_heads
        # the cyclic shift, written out: shifted[y, x] = x[(y + sh) mod H, (x + sw) mod W]
        rows = (torch.arange(height) + sh) % height
        cols = (torch.arange(width) + sw) % width
        shifted = x[:, rows][:, :, cols]
        # padded with zero tokens up to whole windows (after the shift, as timm does)
        padded_h, padded_w = -(-height // wh) * wh, -(-width // ww) * ww
        shifted = F.pad(shifted, (0, 0, 0, padded_w - width, 0, padded_h - height))
        index = _relative_index(wh, ww)
        if hasattr(attn, "cpb_mlp"):  # v2: continuous position bias from the module's own MLP and table
            table = attn.cpb_mlp(attn.relative_coords_table).view(-1, heads).double()
            bias = 16 * torch.sigmoid(table[index.view(-1)].view(wh * ww, wh * ww, heads).permute(2, 0, 1))
            qkv_bias = torch.cat([attn.q_bias, torch.zeros_like(attn.v_bias), attn.v_bias]).double()
        else:
            bias = (
                attn.relative_position_bias_table.double()[index.view(-1)]
                .view(wh * ww, wh * ww, heads)
                .permute(2, 0, 1)
            )
            qkv_bias = attn.qkv.bias.double()
        layer = torch.empty(batch, (padded_h // wh) * (padded_w // ww), heads, wh * ww, wh * ww, dtype=torch.float64)
        for a in range(padded_h // wh):  # the partition, written out: row-major windows
            for b in range(padded_w // ww):
                tokens = shifted[:, a * wh : (a + 1) * wh, b * ww : (b + 1) * ww].reshape(batch, wh * ww, channels)
                qkv = F.linear(tokens, attn.qkv.weight.double(), qkv_bias).view(batch, wh * ww, 3, heads, -1)
                q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)  # (B, heads, Wt, d)
                if hasattr(attn, "cpb_mlp"):
                    tau = torch.clamp(attn.logit_scale.double(), max=math.log(100.0)).exp()  # (heads, 1, 1)
                    scores = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2) * tau
                else:
                    scores = q @ k.transpose(-1, -2) * attn.scale
                scores = scores + bias
                region = [
                    (_roll_region(a * wh + i // ww, padded_h, wh, sh), _roll_region(b * ww + i % ww, padded_w, ww, sw))
                    for i in range(wh * ww)
                ]
                masked = torch.tensor([[region[i] != region[j] for j in range(wh * ww)] for i in range(wh * ww)])
                scores = scores.masked_fill(masked, float("-inf"))
                layer[:, a * (padded_w // ww) + b] = scores.softmax(-1)
        out.append(layer)
    return out


@pytest.fixture(scope="module")
def sam():
    return small_sam()


@torch.no_grad()
def reference_sam_windows(model, pixels) -> list[torch.Tensor]:
    """Per layer ``(B, windows, heads, Wt, Wt)`` float64: ``softmax(scale·q·kᵀ + B)`` with
    ``B[(i,j),(k,l)] = q_(i,j)·R_h[i−k+h−1] + q_(i,j)·R_w[j−l+w−1]`` written out per pair, in
    zero-padded ``w×w`` windows (global blocks: one window of the whole grid)."""
    inputs = []
    handles = [
        block.register_forward_pre_hook(lambda mod, args: inputs.append(mod.norm1(args[0]).detach()))
        for block in model.blocks
    ]
    try:
        model(pixels)
    finally:
        for handle in handles:
            handle.remove()
    out = []
    for block, x in zip(model.blocks, inputs):
        attn, x = block.attn, x.double()
        batch, height, width, channels = x.shape
        side_h, side_w = (block.window_size,) * 2 if block.window_size else (height, width)
        padded_h, padded_w = -(-height // side_h) * side_h, -(-width // side_w) * side_w
        x = F.pad(x, (0, 0, 0, padded_w - width, 0, padded_h - height))
        heads, tokens = attn.num_heads, side_h * side_w
        rel_h, rel_w = attn.rel_pos_h.double(), attn.rel_pos_w.double()  # (2h−1, d), (2w−1, d)
        layer = torch.empty(
            batch, (padded_h // side_h) * (padded_w // side_w), heads, tokens, tokens, dtype=torch.float64
        )
        for a in range(padded_h // side_h):
            for b in range(padded_w // side_w):
                window = x[:, a * side_h : (a + 1) * side_h, b * side_w : (b + 1) * side_w].reshape(
                    batch, tokens, channels
                )
                qkv = F.linear(window, attn.qkv.weight.double(), attn.qkv.bias.double()).view(
                    batch, tokens, 3, heads, -1
                )
                q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)  # (B, heads, Wt, d)
                bias = torch.empty(batch, heads, tokens, tokens, dtype=torch.float64)
                for i in range(tokens):
                    for j in range(tokens):
                        (qi, qj), (ki, kj) = divmod(i, side_w), divmod(j, side_w)
                        bias[:, :, i, j] = (
                            q[:, :, i] * (rel_h[qi - ki + side_h - 1] + rel_w[qj - kj + side_w - 1])
                        ).sum(-1)
                scores = q @ k.transpose(-1, -2) * attn.scale + bias
                layer[:, a * (padded_w // side_w) + b] = scores.softmax(-1)
        out.append(layer)
    return out


# --------------------------------------------------------------------------- capture


def test_loading_reads_each_layers_geometry(swin):
    spec = swin.spec
    assert spec.is_windowed and spec.num_layers == 4 and spec.num_prefix_tokens == 0
    got = [(g.stage, g.grid_size, g.stride, g.window_size, g.shift, g.num_heads) for g in spec.layer_geometry]
    assert got == EXPECTED_GEOMETRY


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
def test_captured_windows_equal_the_hand_reference(swin, pixels, fused):
    _set_fused(swin.model, fused)
    try:
        record = capture_attention(swin, pixels)
        reference = reference_windows(swin.model, pixels)
    finally:
        _set_fused(swin.model, False)
    assert len(record.windows) == 4
    for layer, (got, want) in enumerate(zip(record.windows, reference)):
        _, grid, _, window, _, heads = EXPECTED_GEOMETRY[layer]
        windows = (grid[0] // window[0]) * (grid[1] // window[1])
        assert got.shape == (2, windows, heads, 16, 16)
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
        assert torch.equal(got == 0, want == 0)  # masked pairs exactly 0, and only those
    assert (record.windows[1] == 0).any() and (record.windows[3] == 0).any()  # the shifted layers do mask


def test_swin_v2_windows_equal_the_hand_reference(swin_v2, pixels):
    record = capture_attention(swin_v2, pixels)
    reference = reference_windows(swin_v2.model, pixels)
    for got, want in zip(record.windows, reference):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
        assert torch.equal(got == 0, want == 0)
    assert swin_v2.spec.residual_norm == "post"


def test_a_grid_that_is_not_whole_windows_is_padded_as_the_module_does():
    # 48 px: stage 1 is 6x6 cells in 4x4 windows, padded to 8x8 (2x2 windows) after the shift
    vit = small_swin(bias_seed=2, img_size=48)
    geometry = vit.spec.geometry(3)
    assert (geometry.grid_size, geometry.padded_grid, geometry.num_windows) == ((6, 6), (8, 8), 4)
    pixels = torch.randn(1, 3, 48, 48, generator=torch.Generator().manual_seed(4))
    record = capture_attention(vit, pixels)
    for got, want in zip(record.windows, reference_windows(vit.model, pixels)):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
        assert torch.equal(got == 0, want == 0)
    cells = geometry.window_cells()  # padding slots are −1, every cell appears once
    assert sorted(cells[cells >= 0].tolist()) == list(range(36)) and int((cells < 0).sum()) == 64 - 36
    # a map leaves out the keys at padding slots: the query's row restricted to real cells
    ((window, slot),) = (cells == 35).nonzero().tolist()  # the bottom-right cell's window and slot
    row = record.windows[3][0, window, :, slot].mean(dim=0)  # (Wt,)
    got = attention_map(record, 3, query=35)
    torch.testing.assert_close(got.sum(), row[cells[window] >= 0].sum(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
def test_sam_windows_and_global_blocks_equal_the_hand_reference(sam, pixels, fused):
    got = [(g.grid_size, g.stride, g.window_size, g.num_windows, g.is_global) for g in sam.spec.layer_geometry]
    assert got == [((8, 8), (8, 8), (3, 3), 9, False), ((8, 8), (8, 8), (8, 8), 1, True)] * 2
    for block in sam.model.blocks:
        block.attn.fused_attn = fused
    try:
        with torch.no_grad():
            plain = sam.model(pixels)
        record = capture_attention(sam, pixels)
        reference = reference_sam_windows(sam.model, pixels)
    finally:
        for block in sam.model.blocks:
            block.attn.fused_attn = False
    torch.testing.assert_close(record.logits, plain, atol=1e-5, rtol=1e-5)
    for got, want in zip(record.windows, reference):
        torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    # a global block's map is the query's whole row; a windowed one is the row on its window's cells
    torch.testing.assert_close(attention_map(record, 1, head=0, query=9), record.windows[1][:, 0, 0, 9].view(2, 8, 8))
    corner = attention_map(record, 0, head=1, query=(63, 63))  # cell (7, 7): window (2, 2), slot (1, 1)
    want = torch.zeros(2, 8, 8)
    want[:, 6:8, 6:8] = record.windows[0][:, 8, 1, 4].view(2, 3, 3)[:, :2, :2]  # slots of row/column 8 are padding
    torch.testing.assert_close(corner, want, atol=1e-7, rtol=0)


@pytest.mark.parametrize("fused", [False, True], ids=["explicit", "fused"])
def test_logits_equal_an_uncaptured_forward(swin, pixels, fused):
    _set_fused(swin.model, fused)
    try:
        with torch.no_grad():
            plain = swin.model(pixels)
        record = capture_attention(swin, pixels)
    finally:
        _set_fused(swin.model, False)
    torch.testing.assert_close(record.logits, plain, atol=1e-5, rtol=1e-5)


def test_some_layers_and_half_precision_storage(swin, pixels, record):
    some = capture_attention(swin, pixels, layers=[3, 1], dtype=torch.float16)
    assert some.layers == (1, 3)
    for got, want in zip(some.windows, (record.windows[1], record.windows[3])):
        assert got.dtype == torch.float16
        torch.testing.assert_close(got.float(), want, atol=1e-3, rtol=0)
    torch.testing.assert_close(attention_map(some, 3, query=5), attention_map(record, 3, query=5), atol=1e-3, rtol=0)


# --------------------------------------------------------------------------- attention_map


def _cell_of_slot(a: int, b: int, i: int, j: int, grid, window, shift) -> tuple[int, int]:
    """The grid cell in slot (i, j) of window (a, b): the shifted position, rolled back."""
    return ((a * window[0] + i + shift[0]) % grid[0], (b * window[1] + j + shift[1]) % grid[1])


def _hand_map(record, layer: int, head, cell: tuple[int, int]) -> torch.Tensor:
    """``(B, gh, gw)``: find the query's window and slot by looping over every slot of every
    window, then put its row back on the grid slot by slot."""
    _, grid, _, window, shift, heads = EXPECTED_GEOMETRY[layer]
    windows = record.windows[layer].double()  # (B, windows, heads, Wt, Wt)
    rows = windows[:, :, head] if head is not None else windows.mean(dim=2)  # (B, windows, Wt, Wt)
    per_row = grid[1] // window[1]
    out = torch.zeros(windows.shape[0], *grid, dtype=torch.float64)
    for a in range(grid[0] // window[0]):
        for b in range(per_row):
            slots = [(i, j) for i in range(window[0]) for j in range(window[1])]
            for q, (i, j) in enumerate(slots):
                if _cell_of_slot(a, b, i, j, grid, window, shift) == cell:
                    for k, (ki, kj) in enumerate(slots):
                        out[:, (a * window[0] + ki + shift[0]) % grid[0], (b * window[1] + kj + shift[1]) % grid[1]] = (
                            rows[:, a * per_row + b, q, k]
                        )
    return out


def test_map_of_a_query_at_the_image_corner(record):
    # layer 0: no shift; pixel (0, 0) is cell (0, 0), slot 0 of window 0, which covers cells [0, 4)².
    got = attention_map(record, 0, head=1, query=(0, 0))
    want = torch.zeros(2, 16, 16, dtype=torch.float64)
    want[:, :4, :4] = record.windows[0][:, 0, 1, 0].double().view(2, 4, 4)
    torch.testing.assert_close(got.double(), want, atol=1e-7, rtol=0)
    torch.testing.assert_close(got.double(), _hand_map(record, 0, 1, (0, 0)), atol=1e-7, rtol=0)
    assert torch.equal(attention_map(record, 0, head=1, query=0), got)


def test_map_of_a_query_in_a_shifted_window_across_the_border(record):
    # layer 1 is shifted by 2: cell (15, 0) sits in the last window, which after the roll holds
    # rows 14, 15, 0, 1 and columns 14, 15, 0, 1. Its roll region keeps rows 14-15, columns 0-1.
    for head in (0, 1, None):
        got = attention_map(record, 1, head=head, query=15 * 16 + 0).double()
        torch.testing.assert_close(got, _hand_map(record, 1, head, (15, 0)), atol=1e-7, rtol=0)
        outside = torch.ones(16, 16, dtype=torch.bool)
        outside[14:16, 0:2] = False
        assert (got[:, outside] == 0).all()
        torch.testing.assert_close(got.sum(dim=(1, 2)), torch.ones(2, dtype=torch.float64), atol=1e-6, rtol=0)
    # the bottom-right input pixel on stage 1 (stride 8): cell (7, 7), the shifted window's corner
    got = attention_map(record, 3, query=(63, 63)).double()
    torch.testing.assert_close(got, _hand_map(record, 3, None, (7, 7)), atol=1e-7, rtol=0)
    assert got.shape == (2, 8, 8) and (got[:, :6] == 0).all() and (got[:, :, :6] == 0).all()


def test_mean_query_averages_every_cells_map(record):
    got = attention_map(record, 3, head=2, query="mean").double()
    want = sum(_hand_map(record, 3, 2, (r, c)) for r in range(8) for c in range(8)) / 64
    torch.testing.assert_close(got, want, atol=1e-7, rtol=0)
    # the default query (None) is the mean over every cell: a windowed model has no class token
    torch.testing.assert_close(attention_map(record, 3, head=2).double(), want, atol=1e-7, rtol=0)


def test_bad_queries_are_refused_by_name(record):
    for query, words in [("cls", "no class"), (256, "16x16"), ((64, 0), "inside the 64x64"), ((1.5, 2), "integers")]:
        with pytest.raises(AnalysisError, match=words):
            attention_map(record, 0, query=query)
    with pytest.raises(AnalysisError, match="head=4"):
        attention_map(record, 0, head=4)


def test_vit_pixel_query_is_the_patch_that_contains_it():
    vit = load_vit("vit_tiny_patch16_224", pretrained=False, device="cpu", img_size=(48, 80), depth=2)
    record = capture_attention(vit, torch.randn(1, 3, 48, 80))
    # patch (2, 4) of the 3x5 grid covers pixels y in [32, 48), x in [64, 80)
    for pixel in [(32, 64), (47, 79), (40, 70)]:
        assert torch.equal(attention_map(record, 1, query=pixel), attention_map(record, 1, query=2 * 5 + 4))
    assert torch.equal(attention_map(record, 1, query=(0, 0)), attention_map(record, 1, query=0))
    with pytest.raises(AnalysisError, match="inside the 48x80"):
        attention_map(record, 1, query=(48, 0))
    assert not vit.spec.is_windowed and vit.spec.layer_geometry == ()
    geometry = vit.spec.geometry(0)  # a ViT: one global window over the patch grid, prefix first
    assert geometry.is_global and geometry.num_windows == 1 and geometry.window_tokens == vit.spec.num_tokens


# --------------------------------------------------------------------------- what is refused, and why


def _refused(call, *, error=AnalysisError):
    with pytest.raises(error) as caught:
        call()
    message = str(caught.value)
    assert (
        "windowed attention" in message
        and "not yet supported for Swin" in message
        and "What works for windowed models today" in message
    )
    return message


def test_analyses_refuse_windowed_models_with_the_reason(swin, pixels, record):
    # rollout and explanations: tests/test_windowed_rollout_explain.py
    with pytest.raises(AnalysisError, match="attention mass is not defined for this SwinTransformer: it has no prefix"):
        analysis.attention_mass(record, [0])  # not "not yet": windows do not define it (the Tokens page says so)
    _refused(lambda: analysis.pooling_attention_map(record))
    _refused(lambda: record.attentions)
    with pytest.raises(AnalysisError, match="only as a relative-position bias"):  # a Swin has no absolute table
        analysis.position_embedding_similarity(swin)
    with pytest.raises(AnalysisError, match="query_tokens"):
        capture_attention(swin, pixels, query_tokens=[0])


def test_the_one_uniform_distance_refuses_a_windowed_model_naming_the_per_layer_one(swin):
    with pytest.raises(
        AnalysisError, match=r"no single uniform-attention distance.*uniform_attention_distance_by_layer"
    ):
        analysis.uniform_attention_distance(swin.spec)


def test_families_not_covered_are_still_refused_with_their_structure():
    for name, words in [
        ("mvitv2_tiny", "pooling attention"),
        ("hiera_tiny_224", "mask-unit"),
        ("maxvit_tiny_tf_224", "grid attention"),
    ]:
        with pytest.raises(UnsupportedModelError, match=words):
            load_vit(name, pretrained=False, device="cpu")


def test_patch_embedding_filters_are_the_stem_convolution(swin, sam):
    for vit in (swin, sam):
        assert torch.equal(analysis.patch_embedding_filters(vit), vit.model.patch_embed.proj.weight.detach())


def test_pieces_of_a_batch_concatenate_to_the_batchs_record(swin, pixels, record, out_of_memory_above):
    """A capture that runs out of memory for the whole batch is run image by image; the
    pieces join into the batch's record."""
    assert out_of_memory_above(1) == []
    joined = capture_attention(swin, pixels)
    assert joined.layers == record.layers
    for got, want in zip(joined.windows, record.windows):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(joined.logits, record.logits, atol=1e-5, rtol=0)
    assert joined.layer_windows(-1) is joined.windows[3]


def test_a_geometry_that_is_not_the_modules_is_caught(record):
    from dataclasses import replace

    from analysis.records.windowed import window_probabilities

    shifted = record.spec.geometry(1)  # the shift mask of layer 1, put on layer 0's unmasked windows
    flat = record.windows[0].flatten(0, 1)  # (B·windows, heads, Wt, Wt)
    with pytest.raises(AnalysisError, match="shift mask"):
        window_probabilities(flat, shifted)
    with pytest.raises(AnalysisError, match="geometry predicts"):
        window_probabilities(flat, replace(shifted, num_heads=4))


# --------------------------------------------------------------------------- mean attention distance


def _slot_layout(grid, window, shift):
    """Every window's slots, by hand: ``[(window index, slot, cell (r, c) or None for padding)]``.

    Windows are row-major over the grid padded up to whole windows; slot (i, j) of window
    (a, b) sits at (a·wh + i, b·ww + j) of the shifted, padded grid, which is padding past the
    grid's last row or column and otherwise holds cell ((y + sh) mod gh, (x + sw) mod gw)."""
    (gh, gw), (wh, ww), (sh, sw) = grid, window, shift
    rows, cols = -(-gh // wh), -(-gw // ww)
    layout = []
    for a in range(rows):
        for b in range(cols):
            for i in range(wh):
                for j in range(ww):
                    y, x = a * wh + i, b * ww + j
                    cell = ((y + sh) % gh, (x + sw) % gw) if y < gh and x < gw else None
                    layout.append((a * cols + b, i * ww + j, cell, (y, x)))
    return layout, rows * wh, cols * ww


def _centre_distance(cell_q, cell_k, stride) -> float:
    """Distance in input pixels between two cell centres ((r + ½)·sy, (c + ½)·sx)."""
    return math.hypot((cell_q[0] - cell_k[0]) * stride[0], (cell_q[1] - cell_k[1]) * stride[1])


def _hand_distance(windows, grid, stride, window, shift, renormalize=True) -> torch.Tensor:
    """``(B, heads)``: for every real query slot, Σ over the real key slots of its window of
    P·distance (divided by the attention on real keys when ``renormalize``), averaged over
    the real queries. Padding slots: never queries; as keys, left out like prefix tokens."""
    windows = windows.double()
    layout, _, _ = _slot_layout(grid, window, shift)
    by_window = {}
    for w, slot, cell, _ in layout:
        by_window.setdefault(w, []).append((slot, cell))
    total, queries = torch.zeros(windows.shape[0], windows.shape[2], dtype=torch.float64), 0
    for w, slots in by_window.items():
        for q, cell_q in slots:
            if cell_q is None:
                continue
            weighted = torch.zeros_like(total)
            mass = torch.zeros_like(total)
            for k, cell_k in slots:
                if cell_k is None:
                    continue
                weighted += windows[:, w, :, q, k] * _centre_distance(cell_q, cell_k, stride)
                mass += windows[:, w, :, q, k]
            total += weighted / mass if renormalize else weighted
            queries += 1
    assert queries == grid[0] * grid[1]
    return total / queries


def _hand_uniform(grid, stride, window, shift) -> float:
    """Uniform attention over each real query's real, unmasked keys (same roll region on
    both axes of the shifted, padded grid), averaged over the real queries."""
    layout, padded_h, padded_w = _slot_layout(grid, window, shift)
    by_window = {}
    for w, _slot, cell, (y, x) in layout:
        region = (_roll_region(y, padded_h, window[0], shift[0]), _roll_region(x, padded_w, window[1], shift[1]))
        by_window.setdefault(w, []).append((cell, region))
    values = []
    for slots in by_window.values():
        for cell_q, region_q in slots:
            if cell_q is None:
                continue
            keys = [
                _centre_distance(cell_q, cell_k, stride)
                for cell_k, region_k in slots
                if cell_k is not None and region_k == region_q
            ]
            values.append(sum(keys) / len(keys))
    return sum(values) / len(values)


def test_swin_distance_equals_loops_over_windows_queries_and_keys(swin, record):
    uniform = analysis.uniform_attention_distance_by_layer(swin.spec)
    assert uniform.shape == (4,) and uniform.dtype == torch.float64
    for renormalize in (True, False):
        got = analysis.mean_attention_distance(record, renormalize=renormalize, per_image=True)  # (B, L, 4)
        assert got.shape == (2, 4, 4)
        for layer, (_, grid, stride, window, shift, heads) in enumerate(EXPECTED_GEOMETRY):
            want = _hand_distance(record.windows[layer], grid, stride, window, shift, renormalize)
            torch.testing.assert_close(got[:, layer, :heads], want, atol=1e-9, rtol=1e-9)
            assert torch.isnan(got[:, layer, heads:]).all()  # stage 0 has 2 heads of the widest stage's 4
    for layer, (_, grid, stride, window, shift, _) in enumerate(EXPECTED_GEOMETRY):
        assert float(uniform[layer]) == pytest.approx(_hand_uniform(grid, stride, window, shift), abs=1e-9)
    # the shift changes the reference: masked pairs shorten each query's reach
    assert float(uniform[1]) < float(uniform[0]) and float(uniform[3]) < float(uniform[2])
    averaged = analysis.mean_attention_distance(record)
    torch.testing.assert_close(
        averaged, analysis.mean_attention_distance(record, per_image=True).mean(0), equal_nan=True
    )


def test_distance_of_a_padded_shifted_grid_leaves_padding_keys_out():
    # 48 px: stage 1 is 6x6 cells in 4x4 windows, padded to 8x8 after the shift; padding keys take attention
    vit = small_swin(bias_seed=2, img_size=48)
    record = capture_attention(vit, torch.randn(1, 3, 48, 48, generator=torch.Generator().manual_seed(4)))
    geometry = vit.spec.geometry(3)
    assert (geometry.grid_size, geometry.shift, geometry.stride) == ((6, 6), (2, 2), (8, 8))
    padding_keys = (geometry.window_cells() < 0)[None, :, None, None, :]  # (1, windows, 1, 1, Wt)
    padding_mass = record.windows[3] * padding_keys
    for renormalize in (True, False):
        got = analysis.mean_attention_distance(record, renormalize=renormalize)
        want = _hand_distance(record.windows[3], (6, 6), (8, 8), (4, 4), (2, 2), renormalize)[0]
        torch.testing.assert_close(got[3], want, atol=1e-9, rtol=1e-9)
    uniform = analysis.uniform_attention_distance_by_layer(vit.spec)
    assert float(uniform[3]) == pytest.approx(_hand_uniform((6, 6), (8, 8), (4, 4), (2, 2)), abs=1e-9)
    assert float(padding_mass.sum()) > 0  # the padding keys did carry attention that the rule leaves out


def test_sam_distance_over_windowed_and_global_blocks_equals_loops(sam, pixels):
    record = capture_attention(sam, pixels)
    got = analysis.mean_attention_distance(record, per_image=True)  # (B, 4, 2)
    uniform = analysis.uniform_attention_distance_by_layer(sam.spec)
    layers = [((8, 8), (8, 8), (3, 3)), ((8, 8), (8, 8), (8, 8))] * 2  # windowed 3x3 (padded to 9x9), global
    for layer, (grid, stride, window) in enumerate(layers):
        want = _hand_distance(record.windows[layer], grid, stride, window, (0, 0))
        torch.testing.assert_close(got[:, layer], want, atol=1e-9, rtol=1e-9)
        assert float(uniform[layer]) == pytest.approx(_hand_uniform(grid, stride, window, (0, 0)), abs=1e-9)
    # a global block's reference is the ViT one on the same 8x8 grid of 8 px patches
    vit_like = analysis.ViTSpec(
        patch_size=(8, 8),
        grid_size=(8, 8),
        num_prefix_tokens=0,
        num_layers=1,
        num_heads=1,
        embed_dim=8,
        img_size=(64, 64),
        has_class_token=False,
    )
    assert float(uniform[1]) == pytest.approx(analysis.uniform_attention_distance(vit_like), abs=1e-9)
    assert analysis.distance_unit_length(sam, "patches") == 8.0  # one cell size: SAM has patch units


def test_distance_units_of_a_swin(swin):
    assert analysis.distance_unit_length(swin, "px") == 1.0
    assert analysis.distance_unit_length(swin, "image") == 64.0
    with pytest.raises(AnalysisError, match=r"different cell size on each stage \(4x4, 8x8 px"):
        analysis.distance_unit_length(swin, "patches")


def test_vit_uniform_reference_by_layer_is_the_one_number():
    vit = load_vit("vit_tiny_patch16_224", pretrained=False, device="cpu", img_size=(48, 80), depth=3)
    got = analysis.uniform_attention_distance_by_layer(vit.spec)
    want = analysis.uniform_attention_distance(vit.spec)
    assert got.dtype == torch.float64 and torch.equal(got, torch.full((3,), want, dtype=torch.float64))


# --------------------------------------------------------------------------- relative-position bias


def test_swin_v1_bias_image_is_the_bias_the_module_adds_per_offset(swin):
    for layer, block in enumerate(b for stage in swin.model.layers for b in stage.blocks):
        attn = block.attn
        image = analysis.relative_position_bias(swin, layer)
        (wh, ww), heads = block.window_size, attn.num_heads
        assert image.shape == (heads, 2 * wh - 1, 2 * ww - 1)
        seen = torch.zeros(2 * wh - 1, 2 * ww - 1, dtype=torch.bool)
        for i in range(wh * ww):  # every (query slot, key slot) pair of a window
            for j in range(wh * ww):
                (yi, xi), (yj, xj) = divmod(i, ww), divmod(j, ww)
                dy, dx = yi - yj, xi - xj
                added = attn.relative_position_bias_table[attn.relative_position_index[i, j]]  # (heads,)
                assert torch.equal(image[:, dy + wh - 1, dx + ww - 1], added.detach())
                seen[dy + wh - 1, dx + ww - 1] = True
        assert seen.all()
    assert analysis.relative_position_bias(swin, -1).shape == (4, 7, 7)


def test_swin_v2_bias_image_is_what_the_module_adds_in_its_forward(swin_v2):
    # With k = 0 (zero input: v2 has no k bias) the cosine term is 0, so what the module hands its
    # softmax is exactly τ·0 + 16·sigmoid(cpb) = the bias, read here from the module's own forward.
    for layer, block in enumerate(b for stage in swin_v2.model.layers for b in stage.blocks):
        attn = block.attn
        (wh, ww), heads = block.window_size, attn.num_heads
        scores = []
        handle = attn.softmax.register_forward_hook(
            lambda mod, args, out, scores=scores: scores.append(args[0].detach())
        )
        try:
            with torch.no_grad():
                attn(torch.zeros(1, wh * ww, attn.qkv.in_features))
        finally:
            handle.remove()
        added = scores[0][0]  # (heads, Wt, Wt)
        image = analysis.relative_position_bias(swin_v2, layer)
        assert image.shape == (heads, 2 * wh - 1, 2 * ww - 1)
        assert_bias_image_is_per_pair(image, added, (wh, ww))
        assert float(image.min()) > 0 and float(image.max()) < 16  # 16·sigmoid


def _decomposed_bias_by_hand(q, rows, cols, height, width):
    """``(B, Wt, Wt)``: B[(i,j),(k,l)] = q_(i,j)·rows[i−k+h−1] + q_(i,j)·cols[j−l+w−1], pair by pair."""
    out = torch.empty(q.shape[0], height * width, height * width)
    for a in range(height * width):
        for b in range(height * width):
            (i, j), (k, l) = divmod(a, width), divmod(b, width)  # noqa: E741 - the docstring's (k,l)
            out[:, a, b] = (q[:, a] * (rows[i - k + height - 1] + cols[j - l + width - 1])).sum(-1)
    return out


def test_sam_decomposed_tables_give_the_bias_the_module_computes(sam):
    from timm.models.vision_transformer_sam import get_decomposed_rel_pos_bias

    generator = torch.Generator().manual_seed(7)
    for layer, side in [(0, 3), (1, 8)]:  # a windowed and a global block
        attn = sam.model.blocks[layer].attn
        tables = analysis.decomposed_relative_position(sam, layer)
        assert tables.rows.shape == (2 * side - 1, attn.head_dim) == tables.cols.shape
        q = torch.randn(2, side * side, attn.head_dim, generator=generator)
        with torch.no_grad():
            module = get_decomposed_rel_pos_bias(q, attn.rel_pos_h, attn.rel_pos_w, (side, side), (side, side))
        torch.testing.assert_close(
            _decomposed_bias_by_hand(q, tables.rows, tables.cols, side, side), module, atol=1e-5, rtol=1e-5
        )
    # a table of another length is resized as the module resizes it (linear interpolation)
    attn = sam.model.blocks[0].attn
    original = attn.rel_pos_h
    try:
        attn.rel_pos_h = torch.nn.Parameter(torch.randn(9, attn.head_dim, generator=generator))
        rows = analysis.decomposed_relative_position(sam, 0).rows
        q = torch.randn(1, 9, attn.head_dim, generator=generator)
        with torch.no_grad():
            module = get_decomposed_rel_pos_bias(q, attn.rel_pos_h, attn.rel_pos_w, (3, 3), (3, 3))
        torch.testing.assert_close(
            _decomposed_bias_by_hand(q, rows, analysis.decomposed_relative_position(sam, 0).cols, 3, 3),
            module,
            atol=1e-5,
            rtol=1e-5,
        )
        assert rows.shape == (5, attn.head_dim)
    finally:
        attn.rel_pos_h = original


def test_bias_functions_refuse_the_wrong_kind_of_model_by_name(swin, sam):
    with pytest.raises(AnalysisError, match="decomposed_relative_position"):
        analysis.relative_position_bias(sam, 0)
    with pytest.raises(AnalysisError, match=r"relative_position_bias\(vit, layer\)"):
        analysis.decomposed_relative_position(swin, 0)
    with pytest.raises(AnalysisError, match="layer=4 does not exist"):
        analysis.relative_position_bias(swin, 4)
    vit = load_vit("vit_tiny_patch16_224", pretrained=False, device="cpu", img_size=32, depth=1)
    for function in (analysis.relative_position_bias, analysis.decomposed_relative_position):
        with pytest.raises(
            AnalysisError, match="no relative-position bias of this kind; use position_embedding_similarity"
        ):
            function(vit, 0)
    # which reading each layer has, as the Position page asks it
    from analysis.embedding.relative_position import relative_position_kind

    assert [relative_position_kind(swin, layer) for layer in range(swin.spec.num_layers)] == ["bias"] * 4
    assert {relative_position_kind(sam, layer) for layer in range(sam.spec.num_layers)} == {"decomposed"}
    assert relative_position_kind(vit, 0) is None
