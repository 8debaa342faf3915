"""Read and edit a ViT's activations in flight, by name: :func:`run_with_cache` and :func:`run_with_hooks`.

The same discipline as :func:`analysis.capture_attention` (TransformerLens's
``run_with_cache(names_filter=...)`` / ``run_with_hooks(fwd_hooks=...)``, on the real modules):

* hooks are registered for one call, react only to the calling thread and are removed in
  ``finally``; the model is never modified, so one loaded model serves many threads;
* the attention points (``attn.q``, ``.k``, ``.v``, ``.probs``) go through each block's attention
  adapter (:mod:`analysis.adapters`), the one path every capture uses: ``probs`` is
  ``softmax(scale·q·kᵀ + M)`` in float32 as the module computes it, and when ``probs`` is read
  or any of them is replaced, the call's output is ``P·v`` from those very tensors (equal to the
  fused kernel's to float rounding; a block where nothing is asked keeps its fused kernel);
* ``attn.z`` is the input of the attention's output projection, ``attn.out`` / ``mlp.out`` the
  outputs of the block's ``drop_path1`` / ``drop_path2`` (what each branch adds to the stream).

A hook is ``fn(activation) -> replacement | None``: ``None`` keeps the activation; a tensor of
the same shape replaces it for the rest of the forward pass. Replacing ``resid_mid`` makes the
attention branch add ``new − resid_pre``, so the stream equals ``new`` to float rounding.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

import torch
import torch.nn as nn

from ..adapters.base import AttentionInputs, _attend
from ..adapters.registry import AttentionSite, block_sites, model_blocks
from ..capture import attend_and_record, input_spec
from ..checks import check_float_dtype
from ..devices import autocast_context
from ..errors import AnalysisError
from ..oom import run_with_oom_fallback
from ..spec import ViTSpec
from ..windowed import refuse_windowed
from .cache import ActivationCache
from .points import forward_order, hook_point_names, parse_hook_name

__all__ = ["run_with_cache", "run_with_hooks", "Hook", "NamesFilter"]

#: ``fn(activation)`` → a replacement of the same shape, or ``None`` to keep the activation.
Hook = Callable[[torch.Tensor], "torch.Tensor | None"]
#: ``None`` (every point), one name, a list of names (kept in that order), or ``fn(name) -> bool``.
NamesFilter = "None | str | Iterable[str] | Callable[[str], bool]"

_ATTENTION_POINTS = ("attn.q", "attn.k", "attn.v", "attn.probs")


def run_with_cache(
    vit,
    pixels: torch.Tensor,
    names=None,
    *,
    hooks: Mapping[str, Hook] | None = None,
    dtype: torch.dtype = torch.float32,
    precision: str = "auto",
    to_cpu: bool = True,
) -> ActivationCache:
    """One forward pass that keeps the activations at ``names`` (see :mod:`analysis.activations.points`).

    Args:
        vit: a :class:`~analysis.loading.LoadedViT` with global attention (windowed models: not yet).
        pixels: ``(B, 3, H, W)`` preprocessed input.
        names: ``None`` (every point of every block), a name, a list of names (the cache keeps
            that order), or a predicate ``fn(name) -> bool`` (TransformerLens's ``names_filter``).
            ``attn.q``/``.k``/``.v`` exist only on the fused attention path (the default): on a
            model built with ``fused_attn=False`` leave them out (a typed error says so).
        hooks: optional interventions ``{name: fn}`` applied in the same pass (see
            :func:`run_with_hooks`); a cached point that is also hooked holds the replacement.
        dtype: storage dtype of floating activations; ``precision``: autocast of the forward
            (``"auto"``: bf16/fp16 on cuda, fp32 on the CPU); ``to_cpu``: keep them in CPU memory.

    Without hooks, a batch that runs out of accelerator memory is split in halves (and a
    single image falls back to the CPU), as :func:`analysis.capture_attention` does.
    """
    refuse_windowed(vit, "run_with_cache")
    check_float_dtype("dtype", dtype)
    spec = input_spec(vit, pixels)
    kept = _select(names, spec.num_layers)
    hooks = _check_hooks(hooks, spec.num_layers)
    out_device = torch.device("cpu") if to_cpu else vit.device

    def once(model: nn.Module, device: torch.device, piece: torch.Tensor) -> ActivationCache:
        store: dict[str, torch.Tensor] = {}
        callbacks = {name: _callback(name, hooks.get(name), store if name in kept else None, dtype, out_device)
                     for name in {*kept, *hooks}}
        logits = _hooked_forward(model, device, piece, spec, callbacks, precision)
        missing = [name for name in kept if name not in store]
        if missing:
            raise AnalysisError(f"The forward pass never reached {missing[:4]}: this model's blocks do not run them.")
        return ActivationCache({name: store[name] for name in kept}, spec, logits.float().to(out_device))

    if hooks:  # interventions see the batch whole
        return once(vit.model, vit.device, pixels)
    pieces = run_with_oom_fallback(
        lambda piece: once(vit.model, vit.device, piece), pixels,
        (lambda piece: once(vit.cpu_model(), torch.device("cpu"), piece)) if vit.device.type != "cpu" else None,
    )
    if len(pieces) == 1:
        return pieces[0]
    return ActivationCache(
        {name: torch.cat([p[name].to(out_device) for p in pieces]) for name in kept}, spec,
        torch.cat([p.logits.to(out_device) for p in pieces]),
    )


def run_with_hooks(vit, pixels: torch.Tensor, hooks: Mapping[str, Hook], *, precision: str = "auto") -> torch.Tensor:
    """The logits ``(B, outputs)`` (float32, CPU) of a forward pass in which each ``hooks[name]``
    sees the activation at ``name`` and may replace it (``fn(activation) -> tensor | None``).

        >>> def zero_head_3(z):                     # z: (B, T, heads, d)
        ...     z = z.clone(); z[:, :, 3] = 0; return z
        >>> logits = run_with_hooks(vit, pixels, {"blocks.5.attn.z": zero_head_3})
    """
    refuse_windowed(vit, "run_with_hooks")
    spec = input_spec(vit, pixels)
    hooks = _check_hooks(hooks, spec.num_layers)
    callbacks = {name: _callback(name, fn, None, torch.float32, torch.device("cpu")) for name, fn in hooks.items()}
    return _hooked_forward(vit.model, vit.device, pixels, spec, callbacks, precision).float().cpu()


# --------------------------------------------------------------------------- names and callbacks


def _select(names, num_layers: int) -> list[str]:
    """The names to cache, validated, without repeats, in the order asked (a predicate or
    ``None``: forward order)."""
    everything = hook_point_names(num_layers)
    if names is None:
        return everything
    if callable(names):
        return [name for name in everything if names(name)]
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, Iterable):
        raise AnalysisError(f"names must be None, a name, a list of names or a predicate, got {names!r}.")
    chosen: list[str] = []
    for name in names:
        parse_hook_name(name, num_layers)
        if name not in chosen:
            chosen.append(name)
    return chosen


def _check_hooks(hooks: Mapping[str, Hook] | None, num_layers: int) -> dict[str, Hook]:
    if not hooks:
        return {}
    if not isinstance(hooks, Mapping):
        raise AnalysisError("hooks must be a mapping {name: fn}, e.g. {'blocks.0.attn.z': fn}.")
    for name, fn in hooks.items():
        parse_hook_name(name, num_layers)
        if not callable(fn):
            raise AnalysisError(f"The hook for {name!r} is not callable: pass fn(activation) -> tensor | None.")
    return dict(sorted(hooks.items(), key=lambda item: forward_order(item[0], num_layers)))


def _callback(name: str, hook: Hook | None, store: dict | None, dtype: torch.dtype, device: torch.device) -> Hook:
    """Apply ``hook`` (checked: same shape), then keep what the model continues with in ``store``."""

    def visit(value: torch.Tensor) -> torch.Tensor | None:
        replaced = None
        if hook is not None:
            replaced = hook(value)
            if replaced is not None:
                if not isinstance(replaced, torch.Tensor) or tuple(replaced.shape) != tuple(value.shape):
                    got = tuple(replaced.shape) if isinstance(replaced, torch.Tensor) else type(replaced).__name__
                    raise AnalysisError(
                        f"The hook on {name!r} returned {got}; it must return None or a tensor of the "
                        f"activation's shape {tuple(value.shape)}."
                    )
                replaced = replaced.to(dtype=value.dtype, device=value.device)
        if store is not None:
            current = (replaced if replaced is not None else value).detach()
            kept = current.to(device=device, dtype=dtype if current.is_floating_point() else current.dtype)
            store[name] = kept.clone() if kept.data_ptr() == current.data_ptr() else kept  # never the model's own tensor
        return replaced

    return visit


# --------------------------------------------------------------------------- the hooked forward pass


def _hooked_forward(
    model: nn.Module, device: torch.device, pixels: torch.Tensor, spec: ViTSpec, callbacks: dict[str, Hook],
    precision: str,
) -> torch.Tensor:
    """One forward pass of ``model`` with ``callbacks`` at their points; hooks removed on exit."""
    owner = threading.get_ident()
    wanted: dict[int, dict[str, Hook]] = {}
    for name, fn in callbacks.items():
        layer, point = parse_hook_name(name, spec.num_layers)
        wanted.setdefault(layer, {})[point.suffix] = fn
    blocks = [block for _, block in model_blocks(model)]
    sites = block_sites(model)
    explicit: list[int] = []
    handles: list = []  # every hook registered so far, also when a later block's check raises
    try:
        for layer, points in wanted.items():
            _block_hooks(layer, blocks[layer], sites[layer], points, owner, explicit, handles)
        with torch.no_grad(), autocast_context(device, precision):
            logits = model(pixels.to(device))
    finally:
        for handle in handles:
            handle.remove()
    if explicit:
        raise AnalysisError(
            f"Blocks {sorted(set(explicit))} ran their explicit attention path (fused_attn=False), where q, k and v "
            "are never passed out: read attn.q/k/v with the default fused attention (attn.probs works on both)."
        )
    return logits


def _branch_module(block: nn.Module, attribute: str, layer: int, point: str) -> nn.Module:
    module = getattr(block, attribute, None)
    if not isinstance(module, nn.Module):
        raise AnalysisError(
            f"Block {layer} ({type(block).__name__}) has no {attribute}, where its branch joins the residual "
            f"stream: {point} is not defined for it."
        )
    return module


def _block_hooks(layer: int, block: nn.Module, site: AttentionSite, points: dict[str, Hook], owner: int,
                 explicit: list[int], handles: list) -> None:
    """Register the hooks of one block for the points it was asked for (see the module
    docstring) into ``handles``, one at a time, so the caller removes every one of them even
    when a check here raises halfway."""

    def mine() -> bool:
        return threading.get_ident() == owner

    def visit(suffix: str, value: torch.Tensor) -> torch.Tensor | None:
        fn = points.get(suffix)
        return None if fn is None else fn(value)

    block_input: list[torch.Tensor] = []  # resid_pre of the running call, as the block received it

    if "resid_pre" in points or "resid_mid" in points:
        def pre(module, args, kwargs):
            if not mine():
                return None
            if not args:
                raise AnalysisError(f"Block {layer} was called without a positional input: resid_pre cannot be read.")
            replaced = visit("resid_pre", args[0])
            block_input[:] = [replaced if replaced is not None else args[0]]
            return None if replaced is None else ((replaced, *args[1:]), kwargs)

        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))

    if "attn.out" in points or "resid_mid" in points:
        def attention_branch(module, args, output):
            if not mine():
                return None
            replaced = visit("attn.out", output)
            added = replaced if replaced is not None else output
            if "resid_mid" in points:
                new_mid = visit("resid_mid", block_input[0] + added)
                if new_mid is not None:
                    replaced = new_mid - block_input[0]  # the block adds this to resid_pre
            return replaced

        handles.append(_branch_module(block, "drop_path1", layer, "attn.out").register_forward_hook(attention_branch))

    if "mlp.out" in points:
        def mlp_branch(module, args, output):
            return visit("mlp.out", output) if mine() else None

        handles.append(_branch_module(block, "drop_path2", layer, "mlp.out").register_forward_hook(mlp_branch))

    if "resid_post" in points:
        def post(module, args, output):
            if not mine():
                return None
            if not isinstance(output, torch.Tensor):
                raise AnalysisError(f"Block {layer} returned {type(output).__name__}, not the residual stream.")
            return visit("resid_post", output)

        handles.append(block.register_forward_hook(post))

    if "attn.z" in points:
        projection = getattr(site.module, "proj", None)
        if not isinstance(projection, nn.Module):
            raise AnalysisError(f"Block {layer}'s attention ({type(site.module).__name__}) has no output projection "
                                "'proj': attn.z is not defined for it.")
        heads = site.adapter.num_heads(site.module)

        def head_outputs(module, args):
            if not mine():
                return None
            flat = args[0]  # (B, T, heads·d)
            replaced = visit("attn.z", flat.unflatten(-1, (heads, flat.shape[-1] // heads)))  # (B, T, heads, d)
            return None if replaced is None else (replaced.flatten(-2), *args[1:])

        handles.append(projection.register_forward_pre_hook(head_outputs))

    if any(point in points for point in _ATTENTION_POINTS):
        handles.extend(site.adapter.tap(site.module, _attention_report(layer, points, visit, explicit), owner, reuse=True))


def _attention_report(layer: int, points: dict[str, Hook], visit, explicit: list[int]):
    """The adapter's report for the attention points of one block: returns the call's output
    ``P·v`` (fused path) or the replacement probabilities (explicit path), or None."""
    wants_qkv = any(point in points for point in ("attn.q", "attn.k", "attn.v"))

    def report(inputs: AttentionInputs) -> torch.Tensor | None:
        if inputs.probs is not None:  # explicit path: the module computed P itself
            if wants_qkv:
                explicit.append(layer)
                return None
            return visit("attn.probs", inputs.probs)
        q, k, v = (visit(f"attn.{part}", tensor) for part, tensor in (("q", inputs.q), ("k", inputs.k), ("v", inputs.v)))
        if "attn.probs" not in points and q is None and k is None and v is None:
            return None  # nothing changed, probabilities not asked: the module's own kernel runs
        inputs = replace(inputs, q=inputs.q if q is None else q, k=inputs.k if k is None else k,
                         v=inputs.v if v is None else v)
        probs, output = attend_and_record(inputs)  # (B, heads, T, T) float32, (B, heads, T, d)
        new_probs = visit("attn.probs", probs)
        return output if new_probs is None else _attend(new_probs, inputs.v)

    return report
