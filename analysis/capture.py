"""Capture every layer's attention probabilities in one forward pass.

timm's attention modules compute ``softmax(q·kᵀ·scale)`` only on their unfused path; with
fused attention (``F.scaled_dot_product_attention``, the default) the weights never
exist. We therefore never rely on ``fused_attn`` (nor on timm's global
``set_fused_attn``, which only affects models built after the call). Instead each block's
attention adapter (:mod:`analysis.adapters`, one per attention family) reads what the
module itself uses, q and k after q/k norm and RoPE and the relative-position bias, and
we compute

    P = softmax(q · kᵀ · scale + M)        # (B, heads, T, T), in float32

By default that very ``P`` then gives the call's output, ``P·v``, in place of the fused
kernel: the scores are computed once, so a capture costs about a plain forward, and the
logits equal an uncaptured forward's to float rounding (~1e-6 relative). With
``exact_logits=True`` the fused kernel runs untouched beside the capture and the model's
output is bit-identical. Layers that are not requested keep the fused kernel either way.

A record's maps go straight into their final buffer; on the CPU a large one reuses the
memory of a record already dropped (:mod:`analysis.record_memory`), so a loop of captures
does not fault in fresh pages for every batch.

Hooks are registered per call and removed in ``finally``; they only react to the thread
that registered them, so one model can be shared by many threads (browser sessions),
each capturing its own input at the same time. Nothing is stored on the modules.
"""

from __future__ import annotations

import contextlib
import numbers
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn as nn

from .adapters import AttentionInputs, block_sites, pool_site
from .adapters.probabilities import attention_probabilities  # the one softmax rule; re-exported here
from .checks import check_float_dtype, check_index, check_int, check_pixels
from .devices import autocast_context
from .errors import AnalysisError
from .oom import run_with_oom_fallback
from .record_memory import record_buffer
from .spec import ViTSpec
from .windowed import WindowedAttentionRecord, concatenate_windowed, window_probabilities, windowed_message

__all__ = ["AttentionRecord", "capture_attention", "attention_taps", "attention_probabilities", "require_every_layer"]

# (layer index, probabilities (B, heads, Q, T)) -> None
AttentionSink = Callable[[int, torch.Tensor], None]


@dataclass(frozen=True)
class AttentionRecord:
    """Attention captured from one forward pass.

    Attributes:
        attentions: ``(L, B, heads, Q, T)`` softmax probabilities. ``Q == T`` (every query
            token) unless the capture asked for ``query_tokens``; rows sum to one over keys.
        logits: ``(B, classes)`` the model's output for the same forward pass.
        spec: the token geometry of *this* input (differs from the model's default for
            ``dynamic_img_size`` models fed another resolution).
        layers: model layer index of each entry along ``L``.
        query_tokens: token index of each row along ``Q``, or ``None`` for all ``T`` tokens.
        pool_attention: ``(B, heads, probes, T)`` attention of an attention-pooling head
            (SigLIP/PE ``map`` pooling: learned probe queries over the output tokens), else ``None``.
    """

    attentions: torch.Tensor
    logits: torch.Tensor
    spec: ViTSpec
    layers: tuple[int, ...]
    query_tokens: tuple[int, ...] | None = None
    pool_attention: torch.Tensor | None = None

    def layer_position(self, layer: int) -> int:
        """Position along ``L`` of model layer ``layer`` (negative indices count from the end)."""
        layer = check_index("layer", layer, self.spec.num_layers, "layers")
        try:
            return self.layers.index(layer)
        except ValueError:
            raise AnalysisError(
                f"Layer {layer} was not captured (captured: {list(self.layers)}). "
                "Capture it with capture_attention(..., layers=None) for all layers."
            ) from None

    def select_layers(self, layers: Sequence[int]) -> "AttentionRecord":
        """The same record over some of its layers, in the order given. Consecutive layers are
        a view of the maps (nothing copied); other selections gather their maps. Every analysis
        that takes a record takes the result."""
        positions = [self.layer_position(layer) for layer in layers]
        if not positions:
            raise AnalysisError("select_layers needs at least one layer.")
        first = positions[0]
        if positions == list(range(first, first + len(positions))):
            attentions = self.attentions[first : first + len(positions)]
        else:
            attentions = self.attentions[torch.as_tensor(positions, dtype=torch.long)]
        return replace(self, attentions=attentions, layers=tuple(self.layers[p] for p in positions))

    def query_rows(self, tokens: Sequence[int]) -> list[int]:
        """Positions along ``Q`` of the given token indices."""
        if self.query_tokens is None:
            return list(tokens)
        lookup = {t: i for i, t in enumerate(self.query_tokens)}
        missing = [t for t in tokens if t not in lookup]
        if missing:
            raise AnalysisError(
                f"Query tokens {missing[:5]} were not captured (only {len(self.query_tokens)} query rows "
                "were kept). Capture again with query_tokens=None for every query."
            )
        return [lookup[t] for t in tokens]


_CHUNK_BYTES = 4 << 20  # probabilities per piece of attend_and_record: small enough to stay in cache


def attend_and_record(inputs: AttentionInputs, out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P, P·v)`` for one fused attention call: ``P = softmax(scale·q·kᵀ + M)`` in float32 as
    :func:`attention_probabilities` (into ``out`` when given), and the call's output ``P·v`` in
    ``v``'s dtype, computed a few images at a time so each piece of ``P`` is multiplied with
    ``v`` while it is still in cache. ``P (B, heads, T, T)``, ``P·v (B, heads, T, d)``."""
    q, k, v, mask = inputs.q, inputs.k, inputs.v, inputs.mask
    batch, heads, queries, _ = q.shape
    tokens = k.shape[2]
    if out is None:
        out = torch.empty(batch, heads, queries, tokens, dtype=torch.float32, device=q.device)
    if v.shape[1] != heads:  # grouped-query values, repeated per head
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    output = torch.empty(batch, heads, queries, v.shape[-1], dtype=v.dtype, device=v.device)
    step = max(1, _CHUNK_BYTES // max(1, heads * queries * tokens * 4))
    per_image_mask = mask is not None and mask.ndim == 4 and mask.shape[0] == batch and batch > 1
    for start in range(0, batch, step):
        piece = slice(start, start + step)
        probs = attention_probabilities(q[piece], k[piece], inputs.scale, mask=mask[piece] if per_image_mask else mask,
                                        is_causal=inputs.is_causal, out=out[piece])
        with torch.autocast(v.device.type, enabled=False):
            torch.matmul(probs.to(v.dtype), v[piece], out=output[piece])
    return out, output


def _probabilities_from(inputs: AttentionInputs, rows: torch.Tensor | None, out: torch.Tensor | None) -> torch.Tensor:
    """Probabilities ``(B, heads, Q, T)`` of one reported attention call."""
    if inputs.probs is None:
        return attention_probabilities(
            inputs.q, inputs.k, inputs.scale, rows, mask=inputs.mask, is_causal=inputs.is_causal, out=out
        )
    probs = inputs.probs if rows is None else inputs.probs.index_select(2, rows)
    if out is None:
        return probs.float()
    out.copy_(probs)
    return out


@contextlib.contextmanager
def attention_taps(
    model: nn.Module,
    layers: Sequence[int],
    sink: AttentionSink,
    *,
    query_tokens: Sequence[int] | None = None,
    buffer_for: Callable[[int, tuple[int, ...], torch.device], torch.Tensor | None] | None = None,
    pool_sink: Callable[[torch.Tensor], None] | None = None,
    differentiable: bool = False,
    reuse: bool = False,
) -> Iterator[None]:
    """Within the block, every forward of ``model`` *by this thread* reports the attention
    probabilities of ``layers`` to ``sink(layer, probs)`` with probs ``(B, heads, Q, T)``,
    read by each block's attention adapter (:mod:`analysis.adapters`).

    ``buffer_for(layer, shape, device)`` may return a float32 tensor of that shape to
    compute the probabilities into (``None``: a new tensor). ``pool_sink(probs)`` receives
    an attention-pooling head's ``(B, heads, probes, T)`` probabilities, if the model has one.
    ``differentiable=True`` (under autograd): the reported probabilities are the very tensors
    the blocks multiply with ``v`` (fused calls become explicit for this thread and this
    block only), so gradients with respect to them are exact; no buffers are used.
    ``reuse=True``: each fused call's output is computed as ``P·v`` from the very probabilities
    reported (all query rows are computed, then the requested rows are reported), instead of
    running the fused kernel beside them: the scores are computed once, and the logits equal
    an uncaptured forward to float rounding (about 1e-6 relative) rather than bit for bit.
    Hooks are removed on exit, also when the forward raises.
    """
    owner = threading.get_ident()
    handles = []
    rows_cache: dict[torch.device, torch.Tensor] = {}
    sites = {site.layer: site for site in block_sites(model)}
    if query_tokens is not None and any(sites[layer].adapter.windowed for layer in layers):
        raise AnalysisError(windowed_message("query_tokens (rows of attention over all tokens)", type(model).__name__))

    def rows_on(device: torch.device) -> torch.Tensor | None:
        if query_tokens is None:
            return None
        if device not in rows_cache:
            rows_cache[device] = torch.as_tensor(list(query_tokens), dtype=torch.long, device=device)
        return rows_cache[device]

    def emitter(layer: int):
        def emit(inputs: AttentionInputs) -> torch.Tensor | None:
            reference = inputs.q if inputs.probs is None else inputs.probs
            rows = rows_on(reference.device)
            fused = inputs.probs is None and not differentiable
            if reuse and fused and (rows is None or _row_range(query_tokens) is not None):
                out = None  # all rows, for the output; the requested rows reported as a view
                if rows is None and buffer_for is not None:
                    out = buffer_for(layer, (reference.shape[0], reference.shape[1], reference.shape[2], inputs.k.shape[2]),
                                     reference.device)
                full, output = attend_and_record(inputs, out)  # (B, heads, T, T), (B, heads, T, d)
                if rows is None:
                    sink(layer, full)
                else:
                    first, stop = _row_range(query_tokens)
                    sink(layer, full[:, :, first:stop])
                return output
            out = None
            if buffer_for is not None and not differentiable:
                queries = reference.shape[2] if rows is None else len(rows)
                tokens = inputs.k.shape[2] if inputs.probs is None else inputs.probs.shape[-1]
                out = buffer_for(layer, (reference.shape[0], reference.shape[1], queries, tokens), reference.device)
            sink(layer, _probabilities_from(inputs, rows, out))
            return None

        return emit

    def emit_pool(inputs: AttentionInputs) -> None:
        pool_sink(_probabilities_from(inputs, None, None))

    try:
        for layer in layers:
            site = sites[layer]
            handles.extend(site.adapter.tap(site.module, emitter(layer), owner, differentiable=differentiable,
                                            reuse=reuse and not differentiable))
        pool = pool_site(model) if pool_sink is not None else None
        if pool is not None:
            handles.extend(pool.adapter.tap(pool.module, emit_pool, owner))
        yield
    finally:
        for handle in handles:
            handle.remove()


def _row_range(tokens: Sequence[int] | None) -> tuple[int, int] | None:
    """``(first, stop)`` when ``tokens`` are consecutive and ascending (a slice, no copy), else None."""
    if not tokens:
        return None
    first = int(tokens[0])
    return (first, first + len(tokens)) if list(tokens) == list(range(first, first + len(tokens))) else None


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _resolve_layers(layers: Sequence[int] | int | None, num_layers: int) -> tuple[int, ...]:
    if layers is None:
        return tuple(range(num_layers))
    if isinstance(layers, numbers.Integral):
        layers = [layers]
    if isinstance(layers, (str, bytes)) or not hasattr(layers, "__iter__"):
        raise AnalysisError(f"layers must be None, a layer index or a list of them, got {layers!r}.")
    layers = list(layers)
    if not layers:
        raise AnalysisError(f"layers is empty: pass None for all {num_layers} layers, or some of 0..{num_layers - 1}.")
    return tuple(sorted({check_index("layer", layer, num_layers, "layers") for layer in layers}))


def require_every_layer(requested: Sequence[int], seen, what: str = "attention") -> None:
    """Refuse a forward pass in which some requested layer's tap never fired.

    Every capture (records, streamed distances, tokens, gradients) calls this after its
    forward: a layer whose adapter saw nothing would otherwise come back as zeros or a stale
    buffer and be read (or averaged in) as data. ``seen``: the layers the taps reported.
    """
    missing = [layer for layer in requested if layer not in seen]
    if missing:
        raise AnalysisError(
            f"The {what} of layers {missing} was never computed during the forward pass: this "
            "model's blocks did not run as their attention adapter expects, so it is not supported."
        )


def input_spec(vit, pixels: torch.Tensor) -> ViTSpec:
    """The spec for this input, checking its shape against the model."""
    check_pixels(pixels)
    height, width = int(pixels.shape[-2]), int(pixels.shape[-1])
    spec = vit.spec
    if spec.dynamic_img_size:
        ph, pw = spec.patch_size
        if spec.dynamic_img_pad:  # timm pads up to whole patches
            height, width = -(-height // ph) * ph, -(-width // pw) * pw
        elif height % ph or width % pw or height < ph or width < pw:
            raise AnalysisError(
                f"A {height}x{width} input is not a whole number of {ph}x{pw} patches: resize or crop it "
                "(or load the model with dynamic_img_pad=True)."
            )
        return spec.with_image_size(height, width)
    if (height, width) != spec.img_size:
        raise AnalysisError(
            f"The model expects {spec.img_size[0]}x{spec.img_size[1]} inputs, got {height}x{width}. "
            "Use vit.preprocess(image), or load the model with img_size=... or dynamic_img_size=True."
        )
    return spec


def capture_attention(
    vit,
    pixels: torch.Tensor,
    *,
    layers: Sequence[int] | int | None = None,
    query_tokens: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float32,
    precision: str = "auto",
    to_cpu: bool = True,
    exact_logits: bool = False,
) -> AttentionRecord:
    """Run one forward pass and return every requested layer's attention and the logits.

    Args:
        vit: a :class:`~analysis.loading.LoadedViT`.
        pixels: ``(B, 3, H, W)`` preprocessed input (any device; moved to the model's).
        layers: model layer indices to keep (``None``: all). Others keep the fused kernel.
        query_tokens: keep only these query rows (token indices; e.g. ``[0]`` for the class
            token) to save memory: attentions are then ``(L, B, heads, len(query_tokens), T)``.
        dtype: storage dtype of the kept maps (``torch.float16`` halves memory); the
            probabilities themselves are always computed in float32.
        precision: autocast for the forward: ``"auto"`` (bf16/fp16 on cuda, fp32 on cpu),
            ``"float32"``, ``"bfloat16"``, ``"float16"``.
        to_cpu: move the kept maps to CPU memory (default), else keep them on the device.
        exact_logits: ``False`` (default): each fused attention call's output is computed as
            ``P·v`` from the very probabilities recorded, so the scores are computed once and
            capture costs about a plain forward; the logits then equal an uncaptured forward's
            to float rounding (tested at 1e-5). ``True``: the fused kernel runs untouched
            beside the capture and the logits are bit-identical, at about 1.1x the cost.

    Returns:
        An :class:`AttentionRecord` with ``attentions (L, B, heads, Q, T)`` and ``logits``; for
        a windowed model (Swin) a :class:`~analysis.windowed.WindowedAttentionRecord` with one
        ``(B, windows, heads, Wt, Wt)`` tensor per layer (``query_tokens`` must be ``None``).
    """
    spec = input_spec(vit, pixels)
    layer_ids = _resolve_layers(layers, spec.num_layers)
    check_float_dtype("dtype", dtype)
    if query_tokens is not None and spec.is_windowed:
        raise AnalysisError("query_tokens is not defined for a windowed model (Swin): its windows are kept whole. "
                            "Pass query_tokens=None.")
    if query_tokens is not None:
        query_tokens = tuple(check_int("query token", t) for t in query_tokens)
        if not query_tokens:
            raise AnalysisError("query_tokens is empty: pass None for every query row, or some token indices.")
        bad = [t for t in query_tokens if not 0 <= t < spec.num_tokens]
        if bad:
            raise AnalysisError(f"Query tokens {bad} are outside 0..{spec.num_tokens - 1}.")
    options = dict(spec=spec, layer_ids=layer_ids, query_tokens=query_tokens, dtype=dtype, precision=precision,
                   reuse=not exact_logits)
    out_device = torch.device("cpu") if to_cpu else vit.device

    def on_device(piece: torch.Tensor) -> AttentionRecord:
        return _capture_once(vit.model, vit.device, piece, out_device=out_device, **options)

    def on_cpu(piece: torch.Tensor) -> AttentionRecord:
        return _capture_once(vit.cpu_model(), torch.device("cpu"), piece, out_device=torch.device("cpu"), **options)

    pieces = run_with_oom_fallback(on_device, pixels, on_cpu if vit.device.type != "cpu" else None)
    if len(pieces) == 1:
        return pieces[0]
    if spec.is_windowed:
        return concatenate_windowed(pieces, out_device)
    pools = [p.pool_attention for p in pieces]
    return AttentionRecord(
        attentions=torch.cat([p.attentions.to(out_device) for p in pieces], dim=1),
        logits=torch.cat([p.logits.to(out_device) for p in pieces], dim=0),
        spec=spec,
        layers=layer_ids,
        query_tokens=query_tokens,
        pool_attention=None if pools[0] is None else torch.cat([p.to(out_device) for p in pools], dim=0),
    )


def _capture_once(
    model: nn.Module,
    device: torch.device,
    pixels: torch.Tensor,
    *,
    spec: ViTSpec,
    layer_ids: tuple[int, ...],
    query_tokens: tuple[int, ...] | None,
    dtype: torch.dtype,
    precision: str,
    out_device: torch.device,
    reuse: bool = True,
) -> AttentionRecord:
    """One forward pass of ``model`` on ``device`` with taps on ``layer_ids``."""
    position = {layer: i for i, layer in enumerate(layer_ids)}
    pin = out_device.type == "cpu" and device.type == "cuda"
    store: dict[str, torch.Tensor | dict[int, torch.Tensor]] = {}
    seen: set[int] = set()

    def allocate(shape: tuple[int, ...]) -> torch.Tensor:
        if "maps" not in store:  # (L, B, heads, Q, T)
            full_shape = (len(layer_ids), *shape)
            if out_device.type == "cpu" and not pin:  # reuses a dropped record's memory
                store["maps"] = record_buffer(full_shape, dtype)
            else:  # pinned and device memory: torch's caching allocators reuse it
                store["maps"] = torch.empty(full_shape, dtype=dtype, device=out_device, pin_memory=pin)
        return store["maps"]

    def buffer_for(layer: int, shape: tuple[int, ...], where: torch.device) -> torch.Tensor | None:
        if spec.is_windowed or dtype != torch.float32 or not _same_device(where, out_device):
            return None  # computed on the device, then converted / transferred by keep()
        return allocate(shape)[position[layer]]

    def keep(layer: int, probs: torch.Tensor) -> None:  # probs (B, heads, Q, T)
        if spec.is_windowed:  # probs (B·windows, heads, Wt, Wt): one tensor per layer, stages differ in shape
            windows = window_probabilities(probs, spec.geometry(layer))  # (B, windows, heads, Wt, Wt)
            store.setdefault("maps", {})[layer] = windows.to(dtype=dtype, device=out_device)
            seen.add(layer)
            return
        target = allocate(tuple(probs.shape))[position[layer]]
        if probs.data_ptr() != target.data_ptr():
            target.copy_(probs, non_blocking=pin)
        seen.add(layer)

    def keep_pool(probs: torch.Tensor) -> None:  # (B, heads, probes, T)
        store["pool"] = probs.to(dtype=dtype, device=out_device)

    pixels = pixels.to(device, non_blocking=True)
    taps = attention_taps(
        model, layer_ids, keep, query_tokens=query_tokens, buffer_for=buffer_for, pool_sink=keep_pool, reuse=reuse
    )
    with torch.no_grad(), taps:
        with autocast_context(device, precision):
            logits = model(pixels)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    require_every_layer(layer_ids, seen)
    attentions = store["maps"]
    if spec.is_windowed:  # attentions: {layer: (B, windows, heads, Wt, Wt)}
        return WindowedAttentionRecord(windows=tuple(attentions[layer] for layer in layer_ids),
                                       logits=logits.float().to(out_device), spec=spec, layers=layer_ids)
    expected_tokens = spec.num_tokens
    if attentions.shape[2] != spec.num_heads:
        raise AnalysisError(f"Captured {attentions.shape[2]} attention maps per layer, expected {spec.num_heads} heads.")
    if attentions.shape[-1] != expected_tokens:
        raise AnalysisError(
            f"Captured {attentions.shape[-1]} tokens but the spec predicts {expected_tokens} "
            f"({spec.num_prefix_tokens} prefix + {spec.grid_size[0]}x{spec.grid_size[1]} patches)."
        )
    return AttentionRecord(
        attentions=attentions,
        logits=logits.float().to(out_device),
        spec=spec,
        layers=layer_ids,
        query_tokens=query_tokens,
        pool_attention=store.get("pool"),
    )
