"""The norm, score, per-head and MLP hook points, ``stop_at_layer`` and the TransformerLens
aliases, against plain forward hooks written here on the real submodules and hand
computations on the model's own weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from analysis import AnalysisError, capture_attention, load_vit
from analysis.engine.activations import HOOK_POINTS, TRANSFORMERLENS_NAMES, run_with_cache, run_with_hooks
from analysis.engine.activations.points import MODEL_POINTS
from families import family_pixels
from windowed_models import small_pixels, small_sam, small_swin


def _plain_hooks(model, pre: dict | None = None, post: dict | None = None):
    """Run ``model`` once with plain hooks: ``pre = {key: module}`` keeps each module's first
    input, ``post = {key: module}`` its output. Returns ``(seen, output)``."""
    seen, handles = {}, []
    for key, module in (pre or {}).items():
        handles.append(
            module.register_forward_pre_hook(lambda m, a, key=key: seen.__setitem__(key, a[0].detach().clone()))
        )
    for key, module in (post or {}).items():
        handles.append(module.register_forward_hook(lambda m, a, o, key=key: seen.__setitem__(key, o.detach().clone())))
    try:
        with torch.no_grad():
            output = model(*_current_input)
    finally:
        for handle in handles:
            handle.remove()
    return seen, output


_current_input: list = []


def _run_plain(model, pixels, pre=None, post=None):
    _current_input[:] = [pixels]
    return _plain_hooks(model, pre, post)


def _rms_vit():
    torch.manual_seed(0)
    return load_vit("vit_tiny_patch16_224", pretrained=False, device="cpu", img_size=48, depth=2, norm_layer="rmsnorm")


def _model(kind, family_vits):
    if kind == "swin":
        return small_swin(bias_seed=1), small_pixels()
    if kind == "sam":
        return small_sam(), small_pixels()
    if kind == "rms":
        return _rms_vit(), family_pixels("vit")
    return family_vits[kind], family_pixels(kind)


def _blocks(model):
    from analysis.model.adapters import model_blocks

    return [block for _, block in model_blocks(model)]


@pytest.mark.parametrize("kind", ["vit", "rms", "eva02", "dinov3_plus", "swin", "sam"])
def test_norm_outputs_and_scales_equal_plain_hooks_and_the_norm_formula(kind, family_vits):
    """``ln*.out`` is the norm's output; ``ln*.scale`` ``s`` satisfies ``out = (x − mean x)·s·w + b``
    (LayerNorm) or ``out = x·s·w`` (RMSNorm) with ``x`` the norm's input read by a plain hook."""
    vit, pixels = _model(kind, family_vits)
    blocks = _blocks(vit.model)
    pre, post = {}, {}
    for layer, block in enumerate(blocks):
        for which, norm in (("ln1", block.norm1), ("ln2", block.norm2)):
            pre[layer, which], post[layer, which] = norm, norm
    if not isinstance(getattr(vit.model, "norm", torch.nn.Identity()), torch.nn.Identity):
        pre["final"], post["final"] = vit.model.norm, vit.model.norm
    inputs, _ = _run_plain(vit.model, pixels, pre=pre)
    outputs, _ = _run_plain(vit.model, pixels, post=post)
    names = [
        f"blocks.{layer}.{which}.{part}"
        for layer in range(len(blocks))
        for which in ("ln1", "ln2")
        for part in ("out", "scale")
    ] + (["ln_final.out", "ln_final.scale"] if "final" in pre else [])
    cache = run_with_cache(vit, pixels, names=names, precision="float32")
    for key, norm in pre.items():
        prefix = "ln_final" if key == "final" else f"blocks.{key[0]}.{key[1]}"
        x, out, scale = inputs[key], cache[f"{prefix}.out"], cache[f"{prefix}.scale"]
        torch.testing.assert_close(out, outputs[key], rtol=0, atol=0)
        assert scale.shape == (*x.shape[:-1], 1)
        weight = norm.weight.detach() if norm.weight is not None else 1.0
        if isinstance(norm, torch.nn.LayerNorm):
            rebuilt = (x - x.mean(-1, keepdim=True)) * scale * weight + norm.bias.detach()
        else:
            rebuilt = x * scale * weight
        torch.testing.assert_close(rebuilt, out, rtol=1e-4, atol=1e-5, msg=f"{kind} {prefix}")


def test_the_rms_norm_scale_is_one_over_the_root_mean_square(family_vits):
    vit = _rms_vit()
    pixels = family_pixels("vit")
    inputs, _ = _run_plain(vit.model, pixels, pre={"n": vit.model.blocks[1].norm2})
    scale = run_with_cache(vit, pixels, names="blocks.1.ln2.hook_scale")["blocks.1.ln2.scale"]
    eps = vit.model.blocks[1].norm2.eps
    torch.testing.assert_close(
        scale, 1 / torch.sqrt((inputs["n"] ** 2).mean(-1, keepdim=True) + eps), rtol=1e-6, atol=0
    )


def test_a_replaced_scale_rescales_the_norm_output(family_vits):
    """Doubling ``ln1.scale`` gives the output ``(out − b)·2 + b``, as a plain hook on the norm
    making that edit does."""
    vit, pixels = family_vits["vit"], family_pixels("vit")
    norm = vit.model.blocks[0].norm1
    handle = norm.register_forward_hook(lambda m, a, o: (o - m.bias) * 2 + m.bias)
    try:
        with torch.no_grad():
            expected = vit.model(pixels)
    finally:
        handle.remove()
    got = run_with_hooks(vit, pixels, {"blocks.0.ln1.scale": lambda s: s * 2}, precision="float32")
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    untouched = run_with_hooks(vit, pixels, {}, precision="float32")
    assert not torch.allclose(got, untouched, atol=1e-3)


def test_the_scores_equal_a_hand_computation_from_the_block_input(family_vits):
    """``attn.scores = scale·q·kᵀ`` with q, k computed here from the norm output (plain hook)
    through the module's own ``qkv`` weights."""
    vit, pixels = family_vits["vit"], family_pixels("vit")
    seen, _ = _run_plain(vit.model, pixels, post={layer: block.norm1 for layer, block in enumerate(vit.model.blocks)})
    cache = run_with_cache(vit, pixels, names=["blocks.0.attn.scores", "blocks.1.attn.hook_attn_scores"])
    for layer, block in enumerate(vit.model.blocks):
        attn, h = block.attn, seen[layer]
        batch, tokens, _width = h.shape
        with torch.no_grad():
            q, k, _ = attn.qkv(h).reshape(batch, tokens, 3, attn.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        expected = q @ k.transpose(-2, -1) * attn.scale
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.scores"], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["vit", "eva02", "beit", "relpos_rpn", "rope_mixed", "pe_core", "naflex"])
def test_the_softmax_of_the_scores_is_the_captured_attention(family, family_vits):
    vit, pixels = family_vits[family], family_pixels(family)
    layers = vit.spec.num_layers
    cache = run_with_cache(vit, pixels, names=[f"blocks.{layer}.attn.scores" for layer in range(layers)])
    record = capture_attention(vit, pixels, exact_logits=True)
    torch.testing.assert_close(cache.logits, record.logits, rtol=1e-5, atol=1e-5)
    for layer in range(layers):
        torch.testing.assert_close(
            F.softmax(cache[f"blocks.{layer}.attn.scores"], -1), record.attentions[layer], rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize("family", ["vit", "dinov2_registers", "eva02", "beit"])
def test_each_heads_result_is_its_share_of_the_projection_and_they_add_up_to_attn_out(family, family_vits):
    """``attn.result[..., h, :] = z_h · W_O[:, h·d:(h+1)·d]ᵀ`` (z read by a plain pre-hook on the
    projection), ``Σ_h result_h + b_O`` is the projection's output (plain hook), and that is
    ``attn.out`` up to the block's layer scale (none, timm's ``ls1``, or BEiT's ``gamma_1``)."""
    vit, pixels = family_vits[family], family_pixels(family)
    block = vit.model.blocks[1]
    proj = block.attn.proj
    zs, _ = _run_plain(vit.model, pixels, pre={"z": proj})
    outs, _ = _run_plain(vit.model, pixels, post={"proj": proj})
    cache = run_with_cache(vit, pixels, names=["blocks.1.attn.result", "blocks.1.attn.out"], precision="float32")
    heads = vit.spec.num_heads
    z = zs["z"].unflatten(-1, (heads, -1))  # (B, T, heads, d)
    weight = proj.weight.detach()
    expected = torch.stack(
        [z[:, :, h] @ weight[:, h * z.shape[-1] : (h + 1) * z.shape[-1]].T for h in range(heads)], dim=2
    )
    result = cache["blocks.1.attn.result"]
    assert result.shape == (*z.shape[:3], weight.shape[0])
    torch.testing.assert_close(result, expected, rtol=1e-5, atol=1e-5)
    summed = result.sum(2) + proj.bias.detach()
    torch.testing.assert_close(summed, outs["proj"], rtol=1e-5, atol=1e-5)
    if getattr(block, "gamma_1", None) is not None:
        summed = block.gamma_1.detach() * summed
    elif hasattr(block, "ls1"):
        with torch.no_grad():
            summed = block.ls1(summed)
    torch.testing.assert_close(summed, cache["blocks.1.attn.out"], rtol=1e-5, atol=1e-5)


def test_zeroing_a_heads_result_equals_zeroing_its_z(family_vits):
    vit, pixels = family_vits["vit"], family_pixels("vit")

    def zero(tensor):  # (B, T, heads, ·)
        tensor = tensor.clone()
        tensor[:, :, 1] = 0
        return tensor

    by_z = run_with_hooks(vit, pixels, {"blocks.1.attn.z": zero}, precision="float32")
    by_result = run_with_hooks(vit, pixels, {"blocks.1.attn.hook_result": zero}, precision="float32")
    torch.testing.assert_close(by_result, by_z, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(by_z, run_with_hooks(vit, pixels, {}, precision="float32"), atol=1e-4)


@pytest.mark.parametrize("kind", ["vit", "eva02", "dinov3_plus", "swin"])
def test_the_mlp_hidden_units_equal_plain_hooks_and_the_activation(kind, family_vits):
    """``mlp.pre`` is the first linear layer's output (plain hook), ``mlp.post = act(pre)`` (a
    GluMlp: ``act(first half)·second half``; a SwiGLU: ``act(fc1_g x)·fc1_x x``)."""
    vit, pixels = _model(kind, family_vits)
    mlp = _blocks(vit.model)[1].mlp
    first = getattr(mlp, "fc1_g", None) or mlp.fc1
    post = {"pre": first}
    if hasattr(mlp, "fc1_x"):
        post["linear"] = mlp.fc1_x
    seen, _ = _run_plain(vit.model, pixels, post=post)
    cache = run_with_cache(vit, pixels, names=["blocks.1.mlp.hook_pre", "blocks.1.mlp.post"], precision="float32")
    torch.testing.assert_close(cache["blocks.1.mlp.pre"], seen["pre"], rtol=0, atol=0)
    with torch.no_grad():
        if "linear" in post:
            expected = mlp.act(seen["pre"]) * seen["linear"]
        elif type(mlp).__name__ == "GluMlp":
            a, b = seen["pre"].chunk(2, dim=-1)
            expected = a * mlp.act(b) if mlp.gate_last else mlp.act(a) * b
        else:
            expected = mlp.act(seen["pre"])
    torch.testing.assert_close(cache["blocks.1.mlp.post"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind, stop", [("vit", 1), ("vit", 0), ("vit", 2), ("swin", 3)])
def test_stop_at_layer_returns_that_layers_stream_and_runs_nothing_after(kind, stop, family_vits):
    vit, pixels = _model(kind, family_vits)
    blocks = _blocks(vit.model)
    later = blocks[stop].norm1 if stop < len(blocks) else vit.model.norm  # the first thing after the stop
    calls = []
    reference, _ = _run_plain(
        vit.model, pixels, pre={"in": blocks[0]}, post={"out": blocks[stop - 1]} if stop else None
    )
    handle = later.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        cache = run_with_cache(vit, pixels, stop_at_layer=stop)
    finally:
        handle.remove()
    assert calls == [], "a block after the stop ran"
    assert cache.logits is None
    torch.testing.assert_close(cache.residual, reference["out" if stop else "in"], rtol=1e-5, atol=1e-5)
    assert {int(name.split(".")[1]) for name in cache} == set(range(stop))
    if stop:
        torch.testing.assert_close(cache[f"blocks.{stop - 1}.resid_post"], cache.residual, rtol=0, atol=0)
    with pytest.raises(AnalysisError, match="not reached with stop_at_layer"):
        run_with_cache(
            vit,
            pixels,
            names=[f"blocks.{stop}.resid_pre" if stop < len(blocks) else "ln_final.out"],
            stop_at_layer=stop,
        )
    for name, module in vit.model.named_modules():
        assert not module._forward_hooks and not module._forward_pre_hooks, name


def test_transformerlens_names_are_aliases_of_the_table(family_vits):
    vit, pixels = family_vits["vit"], family_pixels("vit")
    assert set(TRANSFORMERLENS_NAMES) == {p.suffix for p in HOOK_POINTS} | {p.suffix for p in MODEL_POINTS} - {
        "pool.probs"
    }
    lens = [f"blocks.1.{TRANSFORMERLENS_NAMES[p.suffix]}" for p in HOOK_POINTS] + ["ln_final.hook_normalized"]
    ours = [f"blocks.1.{p.suffix}" for p in HOOK_POINTS] + ["ln_final.out"]
    by_lens, by_ours = run_with_cache(vit, pixels, names=lens), run_with_cache(vit, pixels, names=ours)
    assert list(by_lens) == ours  # kept under the table's names
    for a, b in zip(lens, ours):
        assert torch.equal(by_lens[a], by_ours[b])
    with pytest.raises(AnalysisError, match="TransformerLens names are accepted"):
        run_with_cache(vit, pixels, names=["blocks.1.attn.hook_nonsense"])
