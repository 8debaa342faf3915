"""Read and edit a ViT's activations in flight, by name: :func:`run_with_cache` and :func:`run_with_hooks`.

The same discipline as :func:`analysis.capture_attention` (TransformerLens's
``run_with_cache(names_filter=...)`` / ``run_with_hooks(fwd_hooks=...)``, on the real modules):

* hooks are registered for one call, react only to the calling thread and are removed in
  ``finally``; the model is never modified, so one loaded model serves many threads;
* the attention points (``attn.q``, ``.k``, ``.v``, ``.probs``) go through each block's attention
  adapter (:mod:`analysis.model.adapters`), the one path every capture uses: ``probs`` is
  ``softmax(scale·q·kᵀ + M)`` in float32 as the module computes it, and when ``probs`` is read
  or any of them is replaced, the call's output is ``P·v`` from those very tensors (equal to the
  fused kernel's to float rounding; a block where nothing is asked keeps its fused kernel);
* ``attn.z`` is the input of the attention's output projection, ``attn.out`` / ``mlp.out`` the
  outputs of the modules through which each branch joins the stream (timm's ``drop_path1`` /
  ``drop_path2``; the adapter's :attr:`~analysis.model.adapters.base.AttentionAdapter.block_layout` says).

A hook is ``fn(activation) -> replacement | None``: ``None`` keeps the activation; a tensor of
the same shape replaces it for the rest of the forward pass. Replacing ``resid_mid`` makes the
attention branch add ``new − resid_pre``, so the stream equals ``new`` to float rounding.

**Gradient mode** (TransformerLens's ``run_with_cache(incl_bwd=True)``):
``run_with_cache(vit, pixels, names, grad_of=fn)`` runs the forward under autograd (no
``no_grad``), takes ``y = fn(output)`` (a scalar of the logits, e.g. ``lambda l: l[:, 7].sum()``)
and keeps ``∂y/∂a`` of every cached point ``a``: ``cache.grad("blocks.3.attn.probs")``, the shape
of ``cache["blocks.3.attn.probs"]``. ``torch.autograd.grad`` is used, so nothing is written to the
parameters' ``.grad``; the input is cloned with ``requires_grad`` when it has none (the loaded
models' parameters are frozen), so every point is in the graph. In this mode a hook's
replacement stays in the graph; the attention of a block whose ``attn.probs``/``attn.scores`` is
asked computes ``P = softmax(scale·q·kᵀ + M)`` by out-of-place float32 ops and its output as
``P·v`` from that very ``P`` (so ``∂y/∂P`` is the gradient of the attention the output was
computed from); points the block does not compute from otherwise are routed into the forward
(``resid_mid``: the branch adds ``mid − resid_pre``; ``attn.result``: the projection's output is
``Σ_h result_h + b_O``; ``ln*.scale``: see :mod:`.points`), which changes the output by float
rounding only. :func:`run_with_hooks` with ``differentiable=True`` returns the output in the
graph: its hooks see (and may replace) graph tensors, for any gradient the caller takes itself
(several scalars, as LeGrad does).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace

import torch
import torch.nn as nn

from ...base.arguments import check_float_dtype
from ...base.devices import autocast_context
from ...base.errors import AnalysisError
from ...base.module_hooks import add_forward_hook, add_forward_pre_hook
from ...base.oom import run_with_oom_fallback
from ...model.adapters.base import AttentionInputs
from ...model.adapters.base import attend as _attend
from ...model.adapters.probabilities import attend_and_record, attention_probabilities, attention_scores
from ...model.adapters.registry import AttentionSite, block_sites, pool_site
from ...model.geometry import ViTSpec, input_spec
from ...records.windowed import window_probabilities
from .cache import ActivationCache
from .modules import final_norm, norm_kind, normalisation_scale
from .points import MODEL_POINTS, POOL_NAME, canonical_name, forward_order, hook_point_names, parse_hook_name
from .store import ActivationStore

__all__ = ["run_with_cache", "run_with_hooks", "Hook", "NamesFilter", "hooks_around", "StopForward", "AROUND_POINTS"]

#: ``fn(activation)`` → a replacement of the same shape, or ``None`` to keep the activation.
Hook = Callable[[torch.Tensor], "torch.Tensor | None"]
#: ``None`` (every point), one name, a list of names (kept in that order), or ``fn(name) -> bool``.
NamesFilter = "None | str | Iterable[str] | Callable[[str], bool]"

_ATTENTION_POINTS = ("attn.q", "attn.k", "attn.v", "attn.scores", "attn.probs")
#: ``fn(output) -> scalar``: what gradient mode differentiates (``output``: the logits, or the
#: residual stream with ``stop_at_layer``).
Scalar = Callable[[torch.Tensor], torch.Tensor]


def run_with_cache(
    vit,
    pixels: torch.Tensor,
    names=None,
    *,
    hooks: Mapping[str, Hook] | None = None,
    dtype: torch.dtype = torch.float32,
    precision: str = "auto",
    to_cpu: bool = True,
    grad_of: Scalar | None = None,
    stop_at_layer: int | None = None,
) -> ActivationCache:
    """One forward pass that keeps the activations at ``names`` (see :mod:`analysis.engine.activations.points`).

    Without hooks and gradients, a batch that runs out of accelerator memory is split in halves
    (and a single image falls back to the CPU), as :func:`analysis.capture_attention` does.

    Parameters
    ----------
    vit : LoadedViT
        A :class:`~analysis.model.loading.LoadedViT` (windowed models: the points are laid out
        per stage grid and per window, see :mod:`analysis.engine.activations.points`).
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input.
    names : str, iterable of str, callable or None, default None
        ``None`` (every point of every block this model defines, ``ln_final.*`` when it
        has a final norm, and ``pool.probs`` when it has an attention-pooling head), a name, a
        list of names (the cache keeps that order; TransformerLens names are accepted), or a
        predicate ``fn(name) -> bool`` (TransformerLens's ``names_filter``).
        ``attn.q``/``.k``/``.v``/``.scores`` exist only on the fused attention path (the
        default): on a model built with ``fused_attn=False`` leave them out (a typed error says so).
    hooks : mapping of str to Hook or None, default None
        Optional interventions ``{name: fn}`` applied in the same pass (see
        :func:`run_with_hooks`); a cached point that is also hooked holds the replacement.
    dtype : torch.dtype, default torch.float32
        Storage dtype of floating activations (and their gradients).
    precision : str, default "auto"
        Autocast of the forward (``"auto"``: bf16/fp16 on cuda, fp32 on the CPU; or ``"float32"``,
        ``"bfloat16"``, ``"float16"``).
    to_cpu : bool, default True
        Keep the activations in CPU memory (else on the model's device).
    grad_of : Callable or None, default None
        Gradient mode (module docstring): ``fn(output) -> scalar``; the cache then
        also holds ``cache.grad(name)``, ``∂fn(output)/∂activation`` of every cached name.
    stop_at_layer : int or None, default None
        ``n`` in ``0..L``: run blocks ``0..n−1`` only and return: ``cache.residual`` is the stream
        after block ``n − 1`` (``n = 0``: block 0's input), ``cache.logits`` is ``None``; names
        of later blocks and of the model's head are refused (``names=None``: blocks ``< n``).

    Returns
    -------
    ActivationCache
        ``name → tensor`` in the order asked (each as the tables of :mod:`.points` give its shape, e.g.
        ``attn.probs`` ``(B, heads, T, T)``), with ``spec``, ``logits`` ``(B, outputs)`` float32 and, in
        gradient mode, :meth:`ActivationCache.grad`.

    Raises
    ------
    AnalysisError
        ``pixels`` does not fit the model; ``dtype`` is not floating; ``stop_at_layer`` is outside
        ``0..L``; ``grad_of`` is not callable or does not return one number in the graph; an unknown
        name, or one at or after ``stop_at_layer``; a hook that is not callable, given twice (a name and
        its alias) or returns a tensor of another shape; a point the model does not compute
        (``attn.q``/``.k``/``.v``/``.scores`` with ``fused_attn=False``).
    """
    check_float_dtype("dtype", dtype)
    spec = input_spec(vit, pixels)
    stop = _check_stop(stop_at_layer, spec.num_layers)
    if grad_of is not None and not callable(grad_of):
        raise AnalysisError(
            "grad_of must be a function fn(output) -> scalar tensor, e.g. lambda logits: logits[:, 3].sum()."
        )
    kept = _select(
        names,
        spec.num_layers,
        has_pool=pool_site(vit.model) is not None,
        defined=_defined_points(vit.model, spec.num_layers),
        stop=stop,
    )
    return cache_forward(
        vit,
        pixels,
        spec,
        kept,
        hooks=_check_hooks(hooks, spec.num_layers, stop),
        dtype=dtype,
        precision=precision,
        to_cpu=to_cpu,
        grad_of=grad_of,
        stop_at_layer=stop,
    )


def run_with_hooks(
    vit, pixels: torch.Tensor, hooks: Mapping[str, Hook], *, precision: str = "auto", differentiable: bool = False
) -> torch.Tensor:
    """The logits ``(B, outputs)`` (float32, CPU) of a forward pass in which each ``hooks[name]``
    sees the activation at ``name`` and may replace it (``fn(activation) -> tensor | None``).

    Parameters
    ----------
    vit : LoadedViT
        The loaded model.
    pixels : torch.Tensor
        ``(B, 3, H, W)`` preprocessed input.
    hooks : mapping of str to Hook
        ``{name: fn}`` (names of :mod:`.points` or their TransformerLens aliases), applied in forward order;
        ``fn`` returns ``None`` to keep the activation or a tensor of its shape to replace it.
    precision : str, default "auto"
        Autocast of the forward (``"auto"``: bf16/fp16 on cuda, fp32 on the CPU).
    differentiable : bool, default False
        The forward runs under autograd (gradient mode, module docstring):
        the hooks see the activations in the graph (a hook may keep them, to differentiate later),
        and the model's output is returned as it produced it, in the graph, on the model's device.

    Returns
    -------
    torch.Tensor
        ``(B, outputs)`` float32 on the CPU; with ``differentiable=True``, the output as the model
        produced it (its dtype, on its device, in the graph).

    Raises
    ------
    AnalysisError
        ``pixels`` does not fit the model; an unknown name; a hook that is not callable, given twice
        (a name and its alias), or returns a tensor of another shape.

    Examples
    --------
    >>> def zero_head_3(z):  # z: (B, T, heads, d)
    ...     z = z.clone(); z[:, :, 3] = 0; return z
    >>> logits = run_with_hooks(vit, pixels, {"blocks.3.attn.z": zero_head_3})  # the demo ViT: 6 classes
    >>> tuple(logits.shape)
    (1, 6)
    """
    spec = input_spec(vit, pixels)
    hooks = _check_hooks(hooks, spec.num_layers)
    store = ActivationStore([], spec.num_layers, torch.float32, torch.device("cpu"))
    output = _hooked_forward(vit.model, vit.device, pixels, spec, hooks, store, precision, grad=differentiable)
    return output if differentiable else output.float().cpu()


def visit_forward(
    model: nn.Module,
    device: torch.device,
    pixels: torch.Tensor,
    spec: ViTSpec,
    hooks: Mapping[str, Hook],
    *,
    precision: str = "auto",
    query_rows: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """The logits of one forward pass of ``model`` (``vit.model``, or its CPU copy for an
    out-of-memory fallback) on ``device`` in which read-only ``hooks`` see their points: the
    engine behind the streamed analyses (:func:`analysis.dataset_attention_distance`, token
    drop). ``query_rows``: ``attn.probs`` hooks see only these query rows (a view when consecutive)."""
    hooks = {name: _read_only(name, fn) for name, fn in _check_hooks(hooks, spec.num_layers).items()}
    store = ActivationStore([], spec.num_layers, torch.float32, torch.device("cpu"))
    return _hooked_forward(model, device, pixels, spec, hooks, store, precision, query_rows=query_rows)


def _read_only(name: str, fn: Hook) -> Hook:
    def visit(value: torch.Tensor) -> None:
        if fn(value) is not None:
            raise AnalysisError(
                f"The hook on {name!r} returned a tensor: visit_forward's hooks only read "
                "(use run_with_hooks to replace an activation)."
            )
        return None

    return visit


def cache_forward(
    vit,
    pixels: torch.Tensor,
    spec: ViTSpec,
    kept: list[str],
    *,
    hooks: dict[str, Hook] | None = None,
    dtype: torch.dtype = torch.float32,
    precision: str = "auto",
    to_cpu: bool = True,
    query_rows: tuple[int, ...] | None = None,
    exact: bool = False,
    stack: bool = False,
    grad_of: Scalar | None = None,
    stop_at_layer: int | None = None,
) -> ActivationCache:
    """The forward pass behind :func:`run_with_cache` and :func:`analysis.capture_attention`:
    ``kept`` (validated names, in order) on ``spec``'s input, with ``hooks`` (checked, in forward order).

    ``query_rows``: ``attn.probs`` keeps only these query rows (token indices). ``exact``: the
    attention's own fused kernel computes each call's output beside the recorded probabilities
    (bit-identical logits), instead of ``P·v`` from them. ``stack``: every point kind's layers
    are slices of one ``(L, …)`` tensor (:meth:`ActivationCache.stack` returns it, no copy).
    ``grad_of``, ``stop_at_layer``: as :func:`run_with_cache`.
    """
    hooks = hooks or {}
    if (query_rows is not None or exact) and (hooks or grad_of is not None):
        raise AnalysisError(
            "query_rows and exact apply to reading attention, not to interventions or gradients: "
            "pass no hooks and no grad_of."
        )
    out_device = torch.device("cpu") if to_cpu else vit.device

    def once(model: nn.Module, device: torch.device, piece: torch.Tensor) -> ActivationCache:
        pin = out_device.type == "cpu" and device.type == "cuda"
        store = ActivationStore(
            kept, spec.num_layers, dtype, out_device, stack=stack, pin=pin, track=grad_of is not None
        )
        output = _hooked_forward(
            model,
            device,
            piece,
            spec,
            hooks,
            store,
            precision,
            query_rows=query_rows,
            exact=exact,
            grad=grad_of is not None,
            stop_at_layer=stop_at_layer,
        )
        missing = [name for name in kept if name not in store]
        if missing:
            raise AnalysisError(
                f"The forward pass never reached {missing[:4]}: this model's blocks did not run them as their "
                "adapters expect, so they are not supported."
            )
        grads = _gradients(grad_of, output, store) if grad_of is not None else None
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # pinned copies are asynchronous
        output = output.detach().float().to(out_device)
        stopped = stop_at_layer is not None
        return ActivationCache(
            {name: store.values[name] for name in kept},
            spec,
            None if stopped else output,
            store.stacks,
            grads=grads,
            residual=output if stopped else None,
        )

    if hooks or grad_of is not None:  # interventions and gradients see the batch whole
        return once(vit.model, vit.device, pixels)
    pieces = run_with_oom_fallback(
        lambda piece: once(vit.model, vit.device, piece),
        pixels,
        (lambda piece: once(vit.cpu_model(), torch.device("cpu"), piece)) if vit.device.type != "cpu" else None,
    )
    return pieces[0] if len(pieces) == 1 else ActivationCache.concatenate(pieces, out_device)


def _gradients(grad_of: Scalar, output: torch.Tensor, store: ActivationStore) -> dict[str, torch.Tensor]:
    """``∂grad_of(output)/∂a`` of every kept name, stored as its activation is (a point the
    scalar does not depend on: zeros)."""
    with torch.enable_grad():
        scalar = grad_of(output)
    if not isinstance(scalar, torch.Tensor) or scalar.numel() != 1:
        got = tuple(scalar.shape) if isinstance(scalar, torch.Tensor) else type(scalar).__name__
        raise AnalysisError(
            f"grad_of returned {got}; it must return one number (a scalar tensor), e.g. "
            "lambda logits: logits[:, 3].sum()."
        )
    if not scalar.requires_grad:
        raise AnalysisError(
            "grad_of's value does not depend on the forward pass (no graph): compute it from the output it is given."
        )
    live = {name: value for name, value in store.live.items() if value.requires_grad}
    found = torch.autograd.grad(scalar.reshape(()), list(live.values()), allow_unused=True) if live else ()
    by_name = dict(zip(live, found))
    grads = {}
    for name in store.kept:
        gradient = by_name.get(name)
        value = store.values[name]
        grads[name] = (
            torch.zeros_like(value)
            if gradient is None
            else gradient.detach().to(device=store.device, dtype=value.dtype)
        )
    return grads


def _check_stop(stop_at_layer: int | None, num_layers: int) -> int | None:
    if stop_at_layer is None:
        return None
    if isinstance(stop_at_layer, bool) or not isinstance(stop_at_layer, int) or not 0 <= stop_at_layer <= num_layers:
        raise AnalysisError(
            f"stop_at_layer={stop_at_layer!r}: pass n in 0..{num_layers} to run blocks 0..n-1 "
            f"(this model has {num_layers}), or None for the whole model."
        )
    return stop_at_layer


class _Stopped(Exception):
    """Raised by the ``stop_at_layer`` hook of the calling thread, carrying the residual stream."""

    def __init__(self, residual: torch.Tensor) -> None:
        super().__init__("stopped")
        self.residual = residual


# --------------------------------------------------------------------------- names and callbacks


def _defined_points(model: nn.Module, num_layers: int) -> Callable[[str], bool]:
    """``name -> bool``: whether this model's block has that point (its attention adapter says;
    e.g. Swin computes its softmax itself, so it has no ``attn.q``/``.k``/``.v``)."""
    sites = {site.layer: site for site in block_sites(model)}

    def defined(name: str) -> bool:
        layer, point = parse_hook_name(name, num_layers)
        if layer == num_layers:
            return point.suffix == POOL_NAME or _final_norm_defines(model, point.suffix)
        site = sites.get(layer)
        return site is None or _block_defines(site, point.suffix)

    return defined


def _final_norm_defines(model: nn.Module, suffix: str) -> bool:
    norm = final_norm(model)
    return norm is not None and (suffix.endswith(".out") or norm_kind(norm) is not None)


def _block_defines(site: AttentionSite, suffix: str) -> bool:
    """Whether the block at ``site`` has the point ``suffix`` (the attention adapter says for the
    attention points; the block's submodules for the norm, MLP and per-head points)."""
    if suffix == "attn.scores":  # like q and k: only where the fused kernel receives them
        return site.adapter.defines(site, "attn.q")
    if suffix in ("ln1.out", "ln2.out", "ln1.scale", "ln2.scale"):
        norm = None if site.block is None else site.adapter.block_norm(site.block, suffix[:3])
        return norm is not None and (suffix.endswith(".out") or norm_kind(norm) is not None)
    if suffix in ("mlp.pre", "mlp.post"):
        return site.block is not None and site.adapter.mlp_layers(site.block) is not None
    if suffix == "attn.result":
        return isinstance(site.adapter.output_projection(site.module), nn.Linear)
    return site.adapter.defines(site, suffix)


def _select(
    names,
    num_layers: int,
    *,
    has_pool: bool = False,
    defined: Callable[[str], bool] | None = None,
    stop: int | None = None,
) -> list[str]:
    """The names to cache (the table's names), validated, without repeats, in the order asked (a
    predicate or ``None``: forward order, only the points this model defines; a name asked for
    explicitly that the model does not define is refused with the reason during the pass).
    ``stop``: only blocks before it."""
    model_level = [point.suffix for point in MODEL_POINTS if point.suffix != POOL_NAME or has_pool]
    everything = hook_point_names(num_layers if stop is None else stop) + (model_level if stop is None else [])
    if defined is not None:
        everything = [name for name in everything if defined(name)]
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
        _check_before_stop(name, num_layers, stop)
        name = canonical_name(name)
        if name not in chosen:
            chosen.append(name)
    return chosen


def _check_before_stop(name: str, num_layers: int, stop: int | None) -> None:
    layer, _ = parse_hook_name(name, num_layers)
    if stop is not None and layer >= stop:
        raise AnalysisError(
            f"{name!r} is not reached with stop_at_layer={stop}: the forward pass stops after block "
            f"{stop - 1}. Ask for points of blocks 0..{stop - 1}, or a later stop_at_layer."
        )


def _check_hooks(hooks: Mapping[str, Hook] | None, num_layers: int, stop: int | None = None) -> dict[str, Hook]:
    if not hooks:
        return {}
    if not isinstance(hooks, Mapping):
        raise AnalysisError("hooks must be a mapping {name: fn}, e.g. {'blocks.0.attn.z': fn}.")
    checked: dict[str, Hook] = {}
    for name, fn in hooks.items():
        _check_before_stop(name, num_layers, stop)
        if not callable(fn):
            raise AnalysisError(f"The hook for {name!r} is not callable: pass fn(activation) -> tensor | None.")
        if canonical_name(name) in checked:
            raise AnalysisError(
                f"Two hooks for {canonical_name(name)!r} (a name and its TransformerLens alias): pass one."
            )
        checked[canonical_name(name)] = fn
    return dict(sorted(checked.items(), key=lambda item: forward_order(item[0], num_layers)))


def _callback(name: str, hook: Hook | None, store: ActivationStore | None) -> Hook:
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
            store.keep(name, replaced if replaced is not None else value)
        return replaced

    return visit


# --------------------------------------------------------------------------- the hooked forward pass


def _hooked_forward(
    model: nn.Module,
    device: torch.device,
    pixels: torch.Tensor,
    spec: ViTSpec,
    hooks: dict[str, Hook],
    store: ActivationStore,
    precision: str,
    *,
    query_rows: tuple[int, ...] | None = None,
    exact: bool = False,
    grad: bool = False,
    stop_at_layer: int | None = None,
) -> torch.Tensor:
    """One forward pass of ``model`` with ``hooks`` applied and ``store.kept`` kept; every hook
    registered here is removed on exit, also when the forward raises. ``grad``: under autograd
    (gradient mode, module docstring). Returns the model's output, or with ``stop_at_layer=n``
    the residual stream after block ``n − 1``."""
    owner = threading.get_ident()
    wanted: dict[int, dict[str, Hook]] = {}
    for name in [*hooks, *(name for name in store.kept if name not in hooks)]:
        layer, point = parse_hook_name(name, spec.num_layers)
        suffix = "attn.probs" if name == POOL_NAME else point.suffix
        wanted.setdefault(layer, {})[suffix] = _callback(name, hooks.get(name), store if name in store.kept else None)
    sites = {site.layer: site for site in block_sites(model)}
    explicit: list[int] = []
    handles: list = []  # every hook registered so far, also when a later block's check raises
    try:
        for layer, points in wanted.items():
            if layer == spec.num_layers:  # the model's points: the final norm, an attention-pooling head
                _model_hooks(model, points, owner, handles, store, explicit, exact=exact, grad=grad)
                continue
            geometry = spec.window_geometry(layer)
            report = _attention_report(
                layer,
                f"blocks.{layer}.attn.probs",
                points,
                store,
                explicit,
                exact=exact,
                query_rows=query_rows,
                geometry=geometry,
                grad=grad,
            )
            _block_hooks(layer, sites[layer], points, owner, report, handles, grad=grad)
        if stop_at_layer is not None:
            handles.append(_stop_hook(model, sites, stop_at_layer, owner))
        pixels = pixels.to(device, non_blocking=True)
        if grad and not pixels.requires_grad:  # frozen parameters: the input connects the graph
            pixels = pixels.detach().clone().requires_grad_(True)
        try:
            with torch.enable_grad() if grad else torch.no_grad(), autocast_context(device, precision):
                logits = model(pixels)
        except _Stopped as stopped:
            logits = stopped.residual
    finally:
        for handle in handles:
            handle.remove()
    if explicit:
        raise AnalysisError(
            f"Blocks {sorted(set(explicit))} compute their softmax themselves (fused_attn=False: set by the user, "
            "or timm's default for Swin), so q, k, v and the scores never leave the module: read attn.probs, or "
            "attn.q/k/v/scores of a model built with fused attention."
        )
    return logits


def _stop_hook(model: nn.Module, sites: dict, stop: int, owner: int):
    """A hook ending this thread's forward pass with the residual stream after block ``stop − 1``
    (registered after the block's own hooks, so it sees their replacements)."""
    if stop == 0:

        def before_first(module, args):
            if threading.get_ident() == owner:
                raise _Stopped(args[0])

        return add_forward_pre_hook(sites[0].block, before_first)

    def after_last(module, args, output):
        if threading.get_ident() == owner:
            raise _Stopped(output)

    return add_forward_hook(sites[stop - 1].block, after_last)


def _model_hooks(
    model: nn.Module,
    points: dict[str, Hook],
    owner: int,
    handles: list,
    store: ActivationStore,
    explicit: list[int],
    *,
    exact: bool,
    grad: bool,
) -> None:
    """The hooks of the model-level points: ``ln_final.*`` on the final norm, ``pool.probs`` on an
    attention-pooling head."""
    if "attn.probs" in points:  # pool.probs
        pool = pool_site(model)
        if pool is None:
            raise AnalysisError(f"{POOL_NAME!r}: this model ({type(model).__name__}) has no attention-pooling head.")
        report = _attention_report(
            -1, POOL_NAME, {"attn.probs": points["attn.probs"]}, store, explicit, exact=exact, grad=grad
        )
        handles.extend(pool.adapter.tap(pool.module, report, owner, reuse=True))
    norm_points = {suffix.split(".", 1)[1]: fn for suffix, fn in points.items() if suffix.startswith("ln_final.")}
    if norm_points:
        norm = final_norm(model)
        if norm is None:
            raise AnalysisError(
                f"{type(model).__name__} has no norm after its last block (model.norm): ln_final is not "
                "defined for it (a model that pools first normalises the pooled vector)."
            )
        _norm_hook(norm, "ln_final", norm_points, owner, handles, grad)


def _norm_hook(norm: nn.Module, which: str, points: dict[str, Hook], owner: int, handles: list, grad: bool) -> None:
    """``{which}.scale`` and ``{which}.out`` on the norm module ``norm`` (``points`` keyed ``"scale"``/``"out"``).

    The scale ``s`` is computed from the norm's input (:func:`~.modules.normalisation_scale`). A
    replaced ``s'`` (and, in gradient mode, ``s`` itself, so that ``∂y/∂s`` exists) enters the
    output as ``out + (out − b)/s·(s' − s)``, i.e. ``(out − b)·s'/s + b``: unchanged when ``s' = s``;
    ``s`` is computed from the detached input, so the input's gradient is the norm's own."""
    if "scale" in points and norm_kind(norm) is None:
        raise AnalysisError(
            f"{which}.scale: the norm {type(norm).__name__} is neither a LayerNorm nor an RMSNorm over "
            f"the last axis, so its scale is not defined; read {which}.out."
        )

    def after(module, args, output):
        if threading.get_ident() != owner:
            return None
        out = output
        if "scale" in points:
            scale = normalisation_scale(module, args[0].detach())  # (…, 1) float32
            if grad:
                scale.requires_grad_(True)
            new = points["scale"](scale)
            if new is not None or grad:
                shift = getattr(module, "bias", None)
                centred = out.float() - shift.float() if isinstance(shift, torch.Tensor) else out.float()
                change = (scale if new is None else new.float()) - scale.detach()
                out = (out.float() + centred / scale.detach() * change).to(out.dtype)
        if "out" in points:
            new = points["out"](out)
            out = out if new is None else new
        return None if out is output else out

    handles.append(add_forward_hook(norm, after))


def _branch_module(site: AttentionSite, which: str, layer: int) -> nn.Module:
    """The module whose output the ``which`` (``"attn"``/``"mlp"``) branch of the block at ``site``
    adds to the residual stream, as its adapter's block layout says."""
    assert site.block is not None
    module = site.adapter.branch_output(site.block, which)
    if module is None:
        raise AnalysisError(
            f"Block {layer} ({type(site.block).__name__}) has no {site.adapter.block_layout.branch_attribute(which)}, "
            f"where its branch joins the residual stream: {which}.out is not defined for it."
        )
    return module


def _block_hooks(
    layer: int,
    site: AttentionSite,
    points: dict[str, Hook],
    owner: int,
    attention_report,
    handles: list,
    *,
    grad: bool = False,
) -> None:
    """Register the hooks of one block for the points it was asked for (see the module
    docstring) into ``handles``, one at a time, so the caller removes every one of them even
    when a check here raises halfway."""
    block = site.block
    assert block is not None  # a block's site holds its block (only a pooling head's has none)

    def mine() -> bool:
        return threading.get_ident() == owner

    def visit(suffix: str, value: torch.Tensor) -> torch.Tensor | None:
        fn = points.get(suffix)
        return None if fn is None else fn(value)

    block_input: list[torch.Tensor] = []  # resid_pre of the running call, as the block received it

    if "resid_pre" in points or "resid_mid" in points:

        def pre(module, args, kwargs=None):  # kwargs=None: see _kwargs_hook_race
            if not mine():
                return None
            if not args:
                raise AnalysisError(f"Block {layer} was called without a positional input: resid_pre cannot be read.")
            replaced = visit("resid_pre", args[0])
            block_input[:] = [replaced if replaced is not None else args[0]]
            return None if replaced is None else ((replaced, *args[1:]), kwargs)

        handles.append(add_forward_pre_hook(block, pre, with_kwargs=True))

    if "attn.out" in points or "resid_mid" in points:

        def attention_branch(module, args, output):
            if not mine():
                return None
            replaced = visit("attn.out", output)
            added = replaced if replaced is not None else output
            if "resid_mid" in points:
                if added.shape != block_input[0].shape:
                    raise AnalysisError(
                        f"Block {layer} ({type(block).__name__}) adds its attention branch as {tuple(added.shape)} to a "
                        f"{tuple(block_input[0].shape)} input (per window): resid_mid is not defined for it; read "
                        "resid_pre and attn.out."
                    )
                mid = block_input[0] + added
                new_mid = visit("resid_mid", mid)
                if new_mid is not None or grad:  # gradient mode: the stream is computed from resid_mid
                    replaced = (mid if new_mid is None else new_mid) - block_input[
                        0
                    ]  # the block adds this to resid_pre
            return replaced

        handles.append(add_forward_hook(_branch_module(site, "attn", layer), attention_branch))

    if "mlp.out" in points:

        def mlp_branch(module, args, output):
            return visit("mlp.out", output) if mine() else None

        handles.append(add_forward_hook(_branch_module(site, "mlp", layer), mlp_branch))

    if "resid_post" in points:

        def post(module, args, output):
            if not mine():
                return None
            if not isinstance(output, torch.Tensor):
                raise AnalysisError(f"Block {layer} returned {type(output).__name__}, not the residual stream.")
            return visit("resid_post", output)

        handles.append(add_forward_hook(block, post))

    for which in ("ln1", "ln2"):
        norm_points = {suffix.split(".", 1)[1]: fn for suffix, fn in points.items() if suffix.startswith(which + ".")}
        if norm_points:
            norm = site.adapter.block_norm(block, which)
            if norm is None:
                raise AnalysisError(
                    f"Block {layer} ({type(block).__name__}) has no {'first' if which == 'ln1' else 'second'} "
                    f"norm ({' or '.join(site.adapter.block_layout.norms.get(which, ())) or 'none named'}): {which}.* is not "
                    "defined for it."
                )
            _norm_hook(norm, which, norm_points, owner, handles, grad)

    if "attn.in" in points:

        def attention_input(module, args, kwargs=None):  # kwargs=None: see _kwargs_hook_race
            if not mine():
                return None
            if not args:
                raise AnalysisError(
                    f"Block {layer}'s attention was called without a positional input: attn.in cannot be read."
                )
            replaced = visit("attn.in", args[0])
            return None if replaced is None else ((replaced, *args[1:]), kwargs)

        handles.append(add_forward_pre_hook(site.module, attention_input, with_kwargs=True))

    if "mlp.pre" in points or "mlp.post" in points:
        layers = site.adapter.mlp_layers(block)
        if layers is None:
            raise AnalysisError(
                f"Block {layer} ({type(block).__name__}) has no MLP with fc1 and fc2: mlp.pre and "
                "mlp.post are not defined for it."
            )
        first, output_layer = layers
        if "mlp.pre" in points:
            handles.append(
                add_forward_hook(first, lambda module, args, output: visit("mlp.pre", output) if mine() else None)
            )
        if "mlp.post" in points:

            def hidden(module, args):
                if not mine():
                    return None
                replaced = visit("mlp.post", args[0])
                return None if replaced is None else (replaced, *args[1:])

            handles.append(add_forward_pre_hook(output_layer, hidden))

    if "attn.z" in points or "attn.result" in points:
        projection = site.adapter.output_projection(site.module)
        if projection is None:
            raise AnalysisError(
                f"Block {layer}'s attention ({type(site.module).__name__}) has no output projection "
                f"(its adapter, {site.adapter.name}, names none): attn.z is not defined for it."
            )
        heads = site.adapter.num_heads(site.module)

        def head_outputs(module, args):
            if not mine():
                return None
            flat = args[0]  # (B, T, heads·d); per window for a windowed model
            replaced = visit("attn.z", flat.unflatten(-1, (heads, flat.shape[-1] // heads)))  # (B, T, heads, d)
            return None if replaced is None else (replaced.flatten(-2), *args[1:])

        if "attn.z" in points:
            handles.append(add_forward_pre_hook(projection, head_outputs))
        if "attn.result" in points:
            if not isinstance(projection, nn.Linear):
                raise AnalysisError(
                    f"Block {layer}'s output projection is a {type(projection).__name__}, not a linear "
                    "layer: attn.result (each head's share of it) is not defined for it."
                )

            def head_results(module, args, output):
                if not mine():
                    return None
                z = args[0].unflatten(-1, (heads, args[0].shape[-1] // heads))  # (B, T, heads, d)
                weight = module.weight.unflatten(1, (heads, z.shape[-1]))  # (D, heads, d)
                result = torch.einsum("...hd,ehd->...he", z, weight.to(z.dtype))  # (B, T, heads, D)
                replaced = visit("attn.result", result)
                if replaced is None and not grad:
                    return None  # the projection's own output (gradient mode: computed from the point)
                summed = (result if replaced is None else replaced).sum(-2)
                if module.bias is not None:
                    summed = summed + module.bias.to(summed.dtype)
                return summed.to(output.dtype)

            handles.append(add_forward_hook(projection, head_results))

    if any(point in points for point in _ATTENTION_POINTS):
        handles.extend(site.adapter.tap(site.module, attention_report, owner, reuse=True))


def _attention_report(
    layer: int,
    probs_name: str,
    points: dict[str, Hook],
    store: ActivationStore,
    explicit: list[int],
    *,
    exact: bool = False,
    query_rows: tuple[int, ...] | None = None,
    geometry=None,
    grad: bool = False,
):
    """The adapter's report for the attention points of one block (or the pooling head):
    returns the call's output ``P·v`` (fused path), the replacement probabilities (explicit
    path), or None (the module's own kernel runs).

    ``P = softmax(scale·q·kᵀ + M)`` is computed once in float32 (:func:`attend_and_record`), into
    its place in ``store`` when it is only read. ``exact``: only ``P`` is computed and the fused
    kernel gives the output. ``query_rows``: ``attn.probs`` is those rows of ``P`` (consecutive:
    a view of the full ``P``; otherwise only they are computed, beside the fused kernel).
    ``geometry`` (windowed layers): ``attn.probs`` is ``(B, windows, heads, Wt, Wt)``.

    When ``attn.scores`` is asked, or ``attn.probs`` in gradient mode (``grad``), the scores
    ``S = scale·q·kᵀ + M`` are computed by out-of-place float32 ops (:func:`attention_scores`), each
    point visited (a replacement used from there on), and the call's output is ``softmax(S)·v``."""
    wants_qkv = any(point in points for point in ("attn.q", "attn.k", "attn.v", "attn.scores"))
    wants_probs = "attn.probs" in points
    wants_scores = "attn.scores" in points
    rows_range = _row_range(query_rows)
    rows_only = exact or (query_rows is not None and rows_range is None)  # P (or its rows) beside the fused kernel
    rows_cache: dict[torch.device, torch.Tensor] = {}

    def rows_on(device: torch.device) -> torch.Tensor | None:
        if query_rows is None:
            return None
        if device not in rows_cache:
            rows_cache[device] = torch.as_tensor(query_rows, dtype=torch.long, device=device)
        return rows_cache[device]

    def visit_probs(probs: torch.Tensor, rows_done: bool = False) -> torch.Tensor | None:
        """``probs`` (B, heads, Q, K) as the point shows it; a replacement mapped back to its layout."""
        shown = probs
        if query_rows is not None and not rows_done:
            if rows_range is not None:
                shown = probs[:, :, rows_range[0] : rows_range[1]]
            else:
                rows = rows_on(probs.device)
                assert rows is not None  # query_rows is set
                shown = probs.index_select(2, rows)
        if geometry is not None:
            shown = window_probabilities(probs, geometry)  # (B, windows, heads, Wt, Wt)
        replaced = points["attn.probs"](shown)
        if replaced is None and grad and geometry is not None:
            replaced = shown  # gradient mode: the windows shown are what the block multiplies with v
        if replaced is None or geometry is None:
            return replaced
        return replaced.reshape(probs.shape)

    def destination(shape: tuple[int, ...], device: torch.device) -> torch.Tensor | None:
        if geometry is not None:  # windowed: reshaped (and masked) on the way into the store
            return None
        return store.destination(probs_name, shape, device)

    def report(inputs: AttentionInputs) -> torch.Tensor | None:
        if inputs.probs is not None:  # explicit path: the module computed P itself
            if wants_qkv:
                explicit.append(layer)
                return None
            return visit_probs(inputs.probs) if wants_probs else None
        # a fused call: the listener read its q, k, v and scale
        assert inputs.q is not None and inputs.k is not None and inputs.v is not None and inputs.scale is not None
        q, k, v = (
            points[f"attn.{part}"](tensor) if f"attn.{part}" in points else None
            for part, tensor in (("q", inputs.q), ("k", inputs.k), ("v", inputs.v))
        )
        if not wants_probs and not wants_scores and q is None and k is None and v is None:
            return None  # nothing changed, probabilities not asked: the module's own kernel runs
        inputs = replace(
            inputs, q=inputs.q if q is None else q, k=inputs.k if k is None else k, v=inputs.v if v is None else v
        )
        assert inputs.q is not None and inputs.k is not None and inputs.v is not None and inputs.scale is not None
        if wants_scores or grad:  # out of place: the scores visited, every step in the graph
            scores = attention_scores(inputs.q, inputs.k, inputs.scale, mask=inputs.mask, is_causal=inputs.is_causal)
            if wants_scores:
                new_scores = points["attn.scores"](scores)
                scores = scores if new_scores is None else new_scores
            with torch.autocast(scores.device.type, enabled=False):
                probs = scores.softmax(-1)  # (B, heads, Q, K) float32
            if wants_probs:
                new_probs = visit_probs(probs)
                probs = probs if new_probs is None else new_probs
            return _attend(probs, inputs.v)
        batch, heads, queries, _ = inputs.q.shape
        keys = inputs.k.shape[2]
        if wants_probs and rows_only and q is None and k is None and v is None:
            rows = rows_on(inputs.q.device)
            out = destination((batch, heads, queries if rows is None else len(rows), keys), inputs.q.device)
            probs = attention_probabilities(
                inputs.q, inputs.k, inputs.scale, rows, mask=inputs.mask, is_causal=inputs.is_causal, out=out
            )
            visit_probs(probs, rows_done=True)  # read only (no hooks with exact or query rows)
            return None
        whole = wants_probs and query_rows is None
        out = destination((batch, heads, queries, keys), inputs.q.device) if whole else None
        probs, output = attend_and_record(inputs, out)  # (B, heads, T, T) float32, (B, heads, T, d)
        if not wants_probs:
            return output
        new_probs = visit_probs(probs)
        return output if new_probs is None else _attend(new_probs, inputs.v)

    return report


def _row_range(tokens: tuple[int, ...] | None) -> tuple[int, int] | None:
    """``(first, stop)`` when ``tokens`` are consecutive and ascending (a slice, no copy), else None."""
    if not tokens:
        return None
    first = int(tokens[0])
    return (first, first + len(tokens)) if list(tokens) == list(range(first, first + len(tokens))) else None


# --------------------------------------------------------------------------- hooks around a call the engine does not make
#
# Some analyses run the model themselves, not as one ``model(pixels)`` of the engine: MAE's
# reconstruction calls the model with its own noise and keywords, token drop shortens the
# sequence of whatever forward runs inside it (a capture, a probe), the rotary features stop a
# forward as soon as block ``i`` receives its rotary tensor. :func:`hooks_around` gives them
# named points with the engine's discipline: registered on entry, reacting to the calling thread
# only, removed on exit.
#
# ``_kwargs_hook_race``: every hook here is added and removed through :mod:`analysis.base.module_hooks`
# (one lock, held while a hook's exception travels out of the model). A forward that took its
# snapshot of a module's hooks before another thread removed one may still find that hook's
# "with kwargs" flag gone and call it as ``hook(module, args)``: every kwargs pre-hook here
# therefore takes ``kwargs=None`` and, for another thread, returns at once.

#: The points of :func:`hooks_around` (``{i}``: a block, or an encoder layer of the given sites).
AROUND_POINTS = {
    "embed.out": "(B, T, D): the token sequence after the position embedding (timm's patch_drop output, before "
    "norm_pre and the blocks); a replacement may keep fewer tokens (token drop)",
    "blocks.{i}.attn.rope": "the rotary tensor block i passes to its attention (its `rope` keyword), read only",
    "blocks.{i}.attn.probs": "(B, heads, T, T) float32: softmax(scale·q·kᵀ + M) of block i's attention, read only "
    "(the module's own fused kernel still computes its output)",
}


class StopForward(Exception):
    """Raised by a hook of :func:`hooks_around` to end the forward pass there (the rest of the
    model does not run); :func:`hooks_around` swallows it."""


@contextlib.contextmanager
def hooks_around(
    model: nn.Module, hooks: Mapping[str, Hook], *, sites: Sequence[AttentionSite] | None = None
) -> Iterator[None]:
    """Within the block, every forward of ``model`` run by the calling thread calls
    ``hooks[name](value)`` at the points of :data:`AROUND_POINTS`; other threads' forwards of the
    same model pass untouched. A hook may raise :class:`StopForward` to end the forward.

    Parameters
    ----------
    model : torch.nn.Module
        The timm model (``vit.model``).
    hooks : mapping of str to Hook
        ``{name: fn}`` with names of :data:`AROUND_POINTS`: ``"embed.out"`` (``(B, T, D)``; ``fn`` may
        return a replacement, fewer tokens allowed), ``"blocks.{i}.attn.rope"`` (the rotary tensor) and
        ``"blocks.{i}.attn.probs"`` (``(B, heads, T, T)`` float32); the last two are read only (``fn`` must
        return ``None``).
    sites : sequence of AttentionSite or None, default None
        The blocks (default :func:`block_sites` of ``model``; an MAE passes its encoder layers).

    Yields
    ------
    None
        The hooks are registered for the block's duration and removed on leaving it; a
        :class:`StopForward` raised inside the block is swallowed.

    Raises
    ------
    AnalysisError
        A hook that is not callable; a name not of :data:`AROUND_POINTS`, or a block outside the model;
        ``"embed.out"`` on a model without ``patch_drop``; a read-only hook that returns a tensor.

    Examples
    --------
    >>> with hooks_around(vit.model, {"embed.out": lambda x: x[:, :10]}):  # keep the first 10 tokens
    ...     logits = vit.model(pixels)
    >>> tuple(logits.shape)
    (1, 6)
    """
    owner = threading.get_ident()
    handles: list = []
    try:
        for name, fn in hooks.items():
            if not callable(fn):
                raise AnalysisError(f"The hook for {name!r} is not callable: pass fn(activation) -> tensor | None.")
            handles.extend(_around_point(model, name, fn, owner, sites))
        yield
    except StopForward:
        pass
    finally:
        for handle in handles:
            handle.remove()


def _around_point(model: nn.Module, name: str, fn: Hook, owner: int, sites) -> list:
    """The handles of one point of :func:`hooks_around`, registered on ``model``."""
    if name == "embed.out":
        site = getattr(model, "patch_drop", None)
        if not isinstance(site, nn.Module):
            raise AnalysisError(
                f"{type(model).__name__} has no patch_drop module after its position embedding: "
                "'embed.out' is not defined for it."
            )

        def embed(module, args, output):
            return fn(output) if threading.get_ident() == owner else None

        return [add_forward_hook(site, embed)]
    layer, point = _around_name(name)
    sites = list(block_sites(model) if sites is None else sites)
    if not 0 <= layer < len(sites):
        raise AnalysisError(f"{name!r}: this model has blocks 0..{len(sites) - 1}.")
    site = sites[layer]
    if point == "attn.rope":

        def rope(module, args, kwargs=None):  # kwargs=None: see _kwargs_hook_race
            if threading.get_ident() != owner:
                return None
            _read_only(name, fn)(kwargs.get("rope"))
            return None

        return [add_forward_pre_hook(site.module, rope, with_kwargs=True)]
    heads = site.adapter.num_heads(site.module)

    def probabilities(inputs: AttentionInputs) -> None:
        if inputs.probs is None:  # a fused call: the listener read its q, k and scale
            assert inputs.q is not None and inputs.k is not None and inputs.scale is not None
            probs = attention_probabilities(
                inputs.q, inputs.k, inputs.scale, mask=inputs.mask, is_causal=inputs.is_causal
            )  # (B, heads, T, T)
        else:
            probs = inputs.probs.float()
        if probs.shape[1] != heads:
            raise AnalysisError(f"Block {layer}'s attention gave {probs.shape[1]} heads; its module says {heads}.")
        _read_only(name, fn)(probs)
        return None

    return site.adapter.tap(site.module, probabilities, owner)


def _around_name(name: str) -> tuple[int, str]:
    parts = name.split(".", 2) if isinstance(name, str) else []
    if len(parts) == 3 and parts[0] == "blocks" and parts[1].isdigit() and parts[2] in ("attn.rope", "attn.probs"):
        return int(parts[1]), parts[2]
    raise AnalysisError(f"{name!r} is not a point of hooks_around; use one of {', '.join(AROUND_POINTS)}.")
