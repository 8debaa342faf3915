"""Masked autoencoders: mae_reconstruct against the Hugging Face model's own forward (logits, loss,
mask drawn from noise, eager attention), on tiny random ViTMAEForPreTraining saved to a folder."""

from __future__ import annotations

import threading

import pytest
import torch

transformers = pytest.importorskip("transformers")

from analysis.base.errors import AnalysisError, MissingDecoderError, UnsupportedModelError  # noqa: E402
from analysis.mae import (  # noqa: E402
    draw_mask,
    draw_noise,
    load_mae,
    mae_reconstruct,
    visible_attention_distance,
    visible_rollout,
)

NATIVE = (32, 32)
PATCH = 8


def tiny_config(norm_pix_loss: bool) -> transformers.ViTMAEConfig:
    return transformers.ViTMAEConfig(
        image_size=NATIVE[0],
        patch_size=PATCH,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        decoder_hidden_size=24,
        decoder_num_hidden_layers=2,
        decoder_num_attention_heads=3,
        decoder_intermediate_size=48,
        norm_pix_loss=norm_pix_loss,
        mask_ratio=0.75,
    )


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[bool, str]:
    """``{norm_pix_loss: save_pretrained folder}`` of two tiny random MAEs."""
    out = {}
    for norm in (True, False):
        torch.manual_seed(11 if norm else 12)
        model = transformers.ViTMAEForPreTraining(tiny_config(norm))
        with torch.no_grad():  # random (not zero, as transformers builds them) positions and mask token, so they matter
            model.vit.embeddings.position_embeddings.normal_()
            model.decoder.decoder_pos_embed.normal_()
            model.decoder.mask_token.normal_(std=0.5)
        folder = tmp_path_factory.mktemp(f"mae_norm{int(norm)}")
        model.save_pretrained(folder)
        out[norm] = str(folder)
    return out


def source_model(folder: str, **kwargs):
    """The reference: the same weights, loaded independently with transformers."""
    return transformers.ViTMAEForPreTraining.from_pretrained(folder, **kwargs).eval()


def pixels_of(size: tuple[int, int], batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(seed))


def source_forward(model, pixels: torch.Tensor, noise: torch.Tensor, mask_ratio: float, **kwargs):
    model.config.mask_ratio = mask_ratio
    with torch.no_grad():
        return model(
            pixel_values=pixels, noise=noise, interpolate_pos_encoding=tuple(pixels.shape[-2:]) != NATIVE, **kwargs
        )


@pytest.mark.parametrize("norm_pix_loss", [True, False])
@pytest.mark.parametrize("size", [NATIVE, (32, 48)], ids=["square", "non-square"])
def test_a_given_mask_reproduces_the_models_own_logits_loss_and_reconstruction(folders, norm_pix_loss, size):
    mae = load_mae(folders[norm_pix_loss], device="cpu")
    assert mae.norm_pix_loss is norm_pix_loss and mae.spec.patch_size == (PATCH, PATCH)
    reference = source_model(folders[norm_pix_loss])
    pixels = pixels_of(size)
    batch, num_patches = pixels.shape[0], (size[0] // PATCH) * (size[1] // PATCH)
    noise = torch.rand(batch, num_patches, generator=torch.Generator().manual_seed(5))
    own = source_forward(reference, pixels, noise, 0.75)
    mask = own.mask > 0.5  # (B, N): the model's own random mask, visible tokens in noise order

    result = mae_reconstruct(mae, pixels, mask=mask)

    assert torch.equal(result.mask, mask)
    torch.testing.assert_close(result.predictions, own.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(result.loss, own.loss, atol=1e-5, rtol=0)
    # pixel space: the model's own patchify/unpatchify, un-normalised with the true patch statistics
    target = reference.patchify(pixels, interpolate_pos_encoding=True)  # (B, N, p·p·3)
    patch_pixels = own.logits
    if norm_pix_loss:
        mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
        patch_pixels = own.logits * (var + 1e-6) ** 0.5 + mean
    expected = reference.unpatchify(patch_pixels, original_image_size=size)
    torch.testing.assert_close(result.reconstruction, expected, atol=1e-5, rtol=0)
    # composite and per-patch loss, patch by patch
    gw = size[1] // PATCH
    for b in range(batch):
        for n in range(num_patches):
            r, c = divmod(n, gw)
            window = (b, slice(None), slice(r * PATCH, (r + 1) * PATCH), slice(c * PATCH, (c + 1) * PATCH))
            source = result.reconstruction if mask[b, n] else pixels
            assert torch.equal(result.composite[window], source[window])
            patch_target = target[b, n]
            if norm_pix_loss:
                patch_target = (patch_target - patch_target.mean()) / (patch_target.var() + 1e-6) ** 0.5
            expected_loss = ((own.logits[b, n] - patch_target) ** 2).mean()
            torch.testing.assert_close(result.patch_loss[b, n], expected_loss, atol=1e-5, rtol=0)
    for b in range(batch):
        torch.testing.assert_close(result.image_loss[b], result.patch_loss[b][mask[b]].mean(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75, 0.9])
def test_a_seed_draws_the_mask_the_models_own_noise_path_draws(folders, ratio):
    mae = load_mae(folders[True], device="cpu")
    reference = source_model(folders[True])
    pixels = pixels_of(NATIVE, batch=3, seed=1)
    noise = draw_noise(3, 16, seed=7)
    own = source_forward(reference, pixels, noise, ratio)
    mask = draw_mask(3, 16, ratio, seed=7)
    assert torch.equal(mask, own.mask > 0.5)
    assert int((~mask).sum(1)[0]) == int(16 * (1 - ratio))
    result = mae_reconstruct(mae, pixels, mask_ratio=ratio, seed=7)
    assert torch.equal(result.mask, mask)
    torch.testing.assert_close(result.loss, own.loss, atol=1e-5, rtol=0)
    again = mae_reconstruct(mae, pixels, mask_ratio=ratio, seed=7)  # deterministic
    assert torch.equal(again.reconstruction, result.reconstruction)
    assert not torch.equal(mae_reconstruct(mae, pixels, mask_ratio=ratio, seed=8).mask, mask)


def test_a_seed_hides_a_superset_at_a_higher_ratio():
    low, high = draw_mask(2, 64, 0.5, seed=3), draw_mask(2, 64, 0.9, seed=3)
    assert bool((high | ~low).all()) and int(high.sum()) > int(low.sum())


@pytest.mark.parametrize("size", [NATIVE, (32, 48)], ids=["square", "non-square"])
def test_visible_token_attention_equals_eager_output_attentions(folders, size):
    mae = load_mae(folders[False], device="cpu")
    eager = source_model(folders[False], attn_implementation="eager")
    pixels = pixels_of(size, seed=2)
    batch, num_patches = 2, (size[0] // PATCH) * (size[1] // PATCH)
    noise = torch.rand(batch, num_patches, generator=torch.Generator().manual_seed(9))
    own = source_forward(eager, pixels, noise, 0.75, output_attentions=True)
    attentions = torch.stack(own.attentions)  # (L, B, heads, 1 + V, 1 + V), tokens in the model's noise order
    visible = num_patches - int((own.mask[0] > 0.5).sum())
    kept = torch.argsort(noise, dim=1)[:, :visible]  # (B, V) patch index of each encoder token

    record = mae_reconstruct(mae, pixels, mask=own.mask > 0.5).attention

    assert record.attentions.shape == attentions.shape
    for b in range(batch):
        order = torch.argsort(kept[b])  # model token order -> ascending patch order
        assert torch.equal(record.visible_patches[b], kept[b][order])
        tokens = torch.cat([torch.zeros(1, dtype=torch.long), 1 + order])
        expected = attentions[:, b][:, :, tokens][:, :, :, tokens]
        torch.testing.assert_close(record.attentions[:, b], expected, atol=1e-5, rtol=0)
    # a query's attention back on the image grid: NaN where the patch was hidden
    query = int(record.visible_patches[0, 0])
    grid = record.key_grid(1, query, image=0, head=2)
    assert grid.shape == (size[0] // PATCH, size[1] // PATCH)
    flat = grid.reshape(-1)
    assert torch.isnan(flat[own.mask[0] > 0.5]).all()
    row = record.token_of_patch(0, query)
    torch.testing.assert_close(flat[record.visible_patches[0]], record.attentions[1, 0, 2, row, 1:])
    with pytest.raises(AnalysisError, match="hidden"):
        record.key_grid(1, int((own.mask[0] > 0.5).nonzero()[0, 0]))


def test_distance_and_rollout_on_the_visible_set_equal_explicit_loops(folders):
    mae = load_mae(folders[False], device="cpu")
    result = mae_reconstruct(mae, pixels_of(NATIVE), mask_ratio=0.5, seed=4)
    record = result.attention
    distance = visible_attention_distance(record)  # (B, L, heads)
    rollout = visible_rollout(record)  # (B, 1 + V, 1 + V)
    for b in range(2):
        patches = record.visible_patches[b].tolist()
        centres = [((p // 4 + 0.5) * PATCH, (p % 4 + 0.5) * PATCH) for p in patches]
        for layer in range(2):
            for head in range(4):
                total = 0.0
                for qi, (qy, qx) in enumerate(centres):
                    row = record.attentions[layer, b, head, 1 + qi, 1:].double()
                    weighted = sum(
                        float(row[ki]) * ((qy - ky) ** 2 + (qx - kx) ** 2) ** 0.5 for ki, (ky, kx) in enumerate(centres)
                    )
                    total += weighted / float(row.sum())
                assert abs(float(distance[b, layer, head]) - total / len(centres)) < 1e-9
        product = torch.eye(1 + len(patches), dtype=torch.float64)
        for layer in range(2):
            mixed = 0.5 * record.attentions[layer, b].double().mean(0) + 0.5 * torch.eye(
                1 + len(patches), dtype=torch.float64
            )
            product = (mixed / mixed.sum(-1, keepdim=True)) @ product
        torch.testing.assert_close(rollout[b], product)
        # the class token's rollout row on the image grid: NaN exactly where a patch was hidden
        grid = record.grid_of(rollout[b, 0, 1:], image=b).reshape(-1)
        assert torch.equal(torch.isnan(grid), result.mask[b])
        torch.testing.assert_close(grid[record.visible_patches[b]], rollout[b, 0, 1:].float())
    with pytest.raises(AnalysisError, match="one value per visible patch"):
        record.grid_of(torch.ones(3))


def test_the_call_leaves_no_hook_and_restores_the_ratio(folders):
    mae = load_mae(folders[True], device="cpu")
    modules = list(mae.model.modules())
    mae_reconstruct(mae, pixels_of(NATIVE), mask_ratio=0.5)
    assert mae.model.vit.embeddings.config.mask_ratio == 0.75
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in modules)
    bad = torch.zeros(2, 16, dtype=torch.bool)
    bad[0, :3] = True
    with pytest.raises(AnalysisError):  # refused before the forward; nothing changed
        mae_reconstruct(mae, pixels_of(NATIVE), mask=bad)
    assert mae.model.vit.embeddings.config.mask_ratio == 0.75


def test_a_forward_that_raises_leaves_no_hook_and_restores_the_ratio(folders, monkeypatch):
    mae = load_mae(folders[True], device="cpu")

    def broken(*args, **kwargs):
        raise RuntimeError("decoder failed")

    monkeypatch.setattr(mae.model.decoder, "forward", broken)
    with pytest.raises(RuntimeError, match="decoder failed"):
        mae_reconstruct(mae, pixels_of(NATIVE), mask_ratio=0.5)
    assert mae.model.vit.embeddings.config.mask_ratio == 0.75
    assert not any(m._forward_pre_hooks for m in mae.model.modules())


def test_threads_sharing_one_model_each_get_their_own_mask(folders):
    mae = load_mae(folders[True], device="cpu")
    pixels = pixels_of(NATIVE, batch=1)
    expected = {ratio: mae_reconstruct(mae, pixels, mask_ratio=ratio, seed=1).loss for ratio in (0.25, 0.9)}
    results, errors = {}, []

    def work(ratio):
        try:
            for _ in range(5):
                results.setdefault(ratio, []).append(mae_reconstruct(mae, pixels, mask_ratio=ratio, seed=1).loss)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(ratio,)) for ratio in expected]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    for ratio, losses in results.items():
        assert all(torch.equal(loss, expected[ratio]) for loss in losses)


@pytest.mark.parametrize(
    "mask, reason",
    [
        (torch.zeros(2, 15, dtype=torch.bool), "16 patches"),
        (torch.ones(2, 16, dtype=torch.bool), "hides every patch"),
        (torch.tensor([[True] * 8 + [False] * 8, [True] * 9 + [False] * 7]), "same number of visible patches"),
        (torch.zeros(2, 16), "boolean"),
    ],
    ids=["wrong length", "all hidden", "unequal visible counts", "not boolean"],
)
def test_a_bad_mask_gets_a_typed_error_that_says_what_is_needed(folders, mask, reason):
    mae = load_mae(folders[True], device="cpu")
    with pytest.raises(AnalysisError, match=reason):
        mae_reconstruct(mae, pixels_of(NATIVE), mask=mask)


@pytest.mark.parametrize("ratio", [1.0, 0.97, -0.1])
def test_a_ratio_that_hides_everything_or_is_out_of_range_is_refused(folders, ratio):
    mae = load_mae(folders[True], device="cpu")
    with pytest.raises(AnalysisError, match="mask_ratio"):
        mae_reconstruct(mae, pixels_of(NATIVE), mask_ratio=ratio)


def test_a_model_without_a_decoder_is_refused_naming_where_to_get_one(folders, tmp_path):
    encoder = transformers.ViTMAEModel(tiny_config(True))
    encoder.save_pretrained(tmp_path / "encoder")
    for source in (str(tmp_path / "encoder"), encoder, "vit_base_patch16_224.mae"):
        with pytest.raises(MissingDecoderError, match="hf:facebook/vit-mae-base"):
            load_mae(source, device="cpu")
    with pytest.raises(MissingDecoderError, match="decoder"):
        mae_reconstruct(encoder, pixels_of(NATIVE))
    import timm

    timm_encoder = timm.create_model("vit_base_patch16_224.mae", pretrained=False, depth=1)
    with pytest.raises(MissingDecoderError, match="hf:facebook/vit-mae-base"):
        load_mae(timm_encoder)
    with pytest.raises(UnsupportedModelError, match="not a masked autoencoder"):
        load_mae(timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=1))


def test_load_vit_points_an_mae_folder_to_load_mae(folders):
    from analysis import load_vit

    with pytest.raises(UnsupportedModelError, match="load_mae"):
        load_vit(folders[True], device="cpu")
