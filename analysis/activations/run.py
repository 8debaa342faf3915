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

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace

import torch
import torch.nn as nn

from ..adapters.base import AttentionInputs, attend as _attend
from ..adapters.probabilities import attend_and_record, attention_probabilities
from ..adapters.registry import AttentionSite, block_sites, pool_site
from ..checks import check_float_dtype, input_spec
from ..devices import autocast_context
from ..errors import AnalysisError
from ..oom import run_with_oom_fallback
from ..spec import ViTSpec
from ..windowed import window_probabilities
from .cache import ActivationCache
from .points import POOL_NAME, forward_order, hook_point_names, parse_hook_name
from .store import ActivationStore

__all__ = ["run_with_cache", "run_with_hooks", "Hook", "NamesFilter", "hooks_around", "StopForward", "AROUND_POINTS"]

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
        vit: a :class:`~analysis.loading.LoadedViT` (windowed models: the points are laid out
            per stage grid and per window, see :mod:`analysis.activations.points`).
        pixels: ``(B, 3, H, W)`` preprocessed input.
        names: ``None`` (every point of every block, and ``pool.probs`` when the model has an
            attention-pooling head), a name, a list of names (the cache keeps that order), or a
            predicate ``fn(name) -> bool`` (TransformerLens's ``names_filter``).
            ``attn.q``/``.k``/``.v`` exist only on the fused attention path (the default): on a
            model built with ``fused_attn=False`` leave them out (a typed error says so).
        hooks: optional interventions ``{name: fn}`` applied in the same pass (see
            :func:`run_with_hooks`); a cached point that is also hooked holds the replacement.
        dtype: storage dtype of floating activations; ``precision``: autocast of the forward
            (``"auto"``: bf16/fp16 on cuda, fp32 on the CPU); ``to_cpu``: keep them in CPU memory.

    Without hooks, a batch that runs out of accelerator memory is split in halves (and a
    single image falls back to the CPU), as :func:`analysis.capture_attention` does.
    """
    check_float_dtype("dtype", dtype)
    spec = input_spec(vit, pixels)
    kept = _select(names, spec.num_layers, has_pool=pool_site(vit.model) is not None,
                   defined=_defined_points(vit.model, spec.num_layers))
    return cache_forward(vit, pixels, spec, kept, hooks=_check_hooks(hooks, spec.num_layers), dtype=dtype,
                         precision=precision, to_cpu=to_cpu)


def run_with_hooks(vit, pixels: torch.Tensor, hooks: Mapping[str, Hook], *, precision: str = "auto") -> torch.Tensor:
    """The logits ``(B, outputs)`` (float32, CPU) of a forward pass in which each ``hooks[name]``
    sees the activation at ``name`` and may replace it (``fn(activation) -> tensor | None``).

        >>> def zero_head_3(z):                     # z: (B, T, heads, d)
        ...     z = z.clone(); z[:, :, 3] = 0; return z
        >>> logits = run_with_hooks(vit, pixels, {"blocks.5.attn.z": zero_head_3})
    """
    spec = input_spec(vit, pixels)
    hooks = _check_hooks(hooks, spec.num_layers)
    store = ActivationStore([], spec.num_layers, torch.float32, torch.device("cpu"))
    return _hooked_forward(vit.model, vit.device, pixels, spec, hooks, store, precision).float().cpu()


def visit_forward(model: nn.Module, device: torch.device, pixels: torch.Tensor, spec: ViTSpec,
                  hooks: Mapping[str, Hook], *, precision: str = "auto",
                  query_rows: tuple[int, ...] | None = None) -> torch.Tensor:
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
            raise AnalysisError(f"The hook on {name!r} returned a tensor: visit_forward's hooks only read "
                                "(use run_with_hooks to replace an activation).")
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
) -> ActivationCache:
    """The forward pass behind :func:`run_with_cache` and :func:`analysis.capture_attention`:
    ``kept`` (validated names, in order) on ``spec``'s input, with ``hooks`` (checked, in forward order).

    ``query_rows``: ``attn.probs`` keeps only these query rows (token indices). ``exact``: the
    attention's own fused kernel computes each call's output beside the recorded probabilities
    (bit-identical logits), instead of ``P·v`` from them. ``stack``: every point kind's layers
    are slices of one ``(L, …)`` tensor (:meth:`ActivationCache.stack` returns it, no copy).
    """
    hooks = hooks or {}
    if (query_rows is not None or exact) and hooks:
        raise AnalysisError("query_rows and exact apply to reading attention, not to interventions: pass no hooks.")
    out_device = torch.device("cpu") if to_cpu else vit.device

    def once(model: nn.Module, device: torch.device, piece: torch.Tensor) -> ActivationCache:
        pin = out_device.type == "cpu" and device.type == "cuda"
        store = ActivationStore(kept, spec.num_layers, dtype, out_device, stack=stack, pin=pin)
        logits = _hooked_forward(model, device, piece, spec, hooks, store, precision, query_rows=query_rows,
                                 exact=exact)
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # pinned copies are asynchronous
        missing = [name for name in kept if name not in store]
        if missing:
            raise AnalysisError(
                f"The forward pass never reached {missing[:4]}: this model's blocks did not run them as their "
                "adapters expect, so they are not supported."
            )
        return ActivationCache({name: store.values[name] for name in kept}, spec, logits.float().to(out_device),
                               store.stacks)

    if hooks:  # interventions see the batch whole
        return once(vit.model, vit.device, pixels)
    pieces = run_with_oom_fallback(
        lambda piece: once(vit.model, vit.device, piece), pixels,
        (lambda piece: once(vit.cpu_model(), torch.device("cpu"), piece)) if vit.device.type != "cpu" else None,
    )
    return pieces[0] if len(pieces) == 1 else ActivationCache.concatenate(pieces, out_device)


# --------------------------------------------------------------------------- names and callbacks


def _defined_points(model: nn.Module, num_layers: int) -> Callable[[str], bool]:
    """``name -> bool``: whether this model's block has that point (its attention adapter says;
    e.g. Swin computes its softmax itself, so it has no ``attn.q``/``.k``/``.v``)."""
    sites = {site.layer: site for site in block_sites(model)}

    def defined(name: str) -> bool:
        layer, point = parse_hook_name(name, num_layers)
        site = sites.get(layer)
        return site is None or site.adapter.defines(site, point.suffix)

    return defined


def _select(names, num_layers: int, *, has_pool: bool = False, defined: Callable[[str], bool] | None = None) -> list[str]:
    """The names to cache, validated, without repeats, in the order asked (a predicate or
    ``None``: forward order, only the points this model defines; a name asked for explicitly
    that the model does not define is refused with the reason during the pass)."""
    everything = hook_point_names(num_layers) + ([POOL_NAME] if has_pool else [])
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
    model: nn.Module, device: torch.device, pixels: torch.Tensor, spec: ViTSpec, hooks: dict[str, Hook],
    store: ActivationStore, precision: str, *, query_rows: tuple[int, ...] | None = None, exact: bool = False,
) -> torch.Tensor:
    """One forward pass of ``model`` with ``hooks`` applied and ``store.kept`` kept; every hook
    registered here is removed on exit, also when the forward raises."""
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
            if layer == spec.num_layers:  # pool.probs
                pool = pool_site(model)
                if pool is None:
                    raise AnalysisError(f"{POOL_NAME!r}: this model ({type(model).__name__}) has no attention-pooling head.")
                report = _attention_report(layer, POOL_NAME, points, store, explicit, exact=exact)
                handles.extend(pool.adapter.tap(pool.module, report, owner, reuse=True))
                continue
            geometry = spec.geometry(layer) if spec.is_windowed else None
            report = _attention_report(layer, f"blocks.{layer}.attn.probs", points, store, explicit, exact=exact,
                                       query_rows=query_rows, geometry=geometry)
            _block_hooks(layer, sites[layer], points, owner, report, handles)
        with torch.no_grad(), autocast_context(device, precision):
            logits = model(pixels.to(device, non_blocking=True))
    finally:
        for handle in handles:
            handle.remove()
    if explicit:
        raise AnalysisError(
            f"Blocks {sorted(set(explicit))} compute their softmax themselves (fused_attn=False: set by the user, "
            "or timm's default for Swin), so q, k and v never leave the module: read attn.probs, or attn.q/k/v "
            "of a model built with fused attention."
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


def _block_hooks(layer: int, site: AttentionSite, points: dict[str, Hook], owner: int, attention_report,
                 handles: list) -> None:
    """Register the hooks of one block for the points it was asked for (see the module
    docstring) into ``handles``, one at a time, so the caller removes every one of them even
    when a check here raises halfway."""
    block = site.block

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

        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))

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
            flat = args[0]  # (B, T, heads·d); per window for a windowed model
            replaced = visit("attn.z", flat.unflatten(-1, (heads, flat.shape[-1] // heads)))  # (B, T, heads, d)
            return None if replaced is None else (replaced.flatten(-2), *args[1:])

        handles.append(projection.register_forward_pre_hook(head_outputs))

    if any(point in points for point in _ATTENTION_POINTS):
        handles.extend(site.adapter.tap(site.module, attention_report, owner, reuse=True))


def _attention_report(layer: int, probs_name: str, points: dict[str, Hook], store: ActivationStore,
                      explicit: list[int], *, exact: bool = False, query_rows: tuple[int, ...] | None = None,
                      geometry=None):
    """The adapter's report for the attention points of one block (or the pooling head):
    returns the call's output ``P·v`` (fused path), the replacement probabilities (explicit
    path), or None (the module's own kernel runs).

    ``P = softmax(scale·q·kᵀ + M)`` is computed once in float32 (:func:`attend_and_record`), into
    its place in ``store`` when it is only read. ``exact``: only ``P`` is computed and the fused
    kernel gives the output. ``query_rows``: ``attn.probs`` is those rows of ``P`` (consecutive:
    a view of the full ``P``; otherwise only they are computed, beside the fused kernel).
    ``geometry`` (windowed layers): ``attn.probs`` is ``(B, windows, heads, Wt, Wt)``."""
    wants_qkv = any(point in points for point in ("attn.q", "attn.k", "attn.v"))
    wants_probs = "attn.probs" in points
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
            shown = (probs[:, :, rows_range[0]:rows_range[1]] if rows_range is not None
                     else probs.index_select(2, rows_on(probs.device)))
        if geometry is not None:
            shown = window_probabilities(probs, geometry)  # (B, windows, heads, Wt, Wt)
        replaced = points["attn.probs"](shown)
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
        q, k, v = (points[f"attn.{part}"](tensor) if f"attn.{part}" in points else None
                   for part, tensor in (("q", inputs.q), ("k", inputs.k), ("v", inputs.v)))
        if not wants_probs and q is None and k is None and v is None:
            return None  # nothing changed, probabilities not asked: the module's own kernel runs
        inputs = replace(inputs, q=inputs.q if q is None else q, k=inputs.k if k is None else k,
                         v=inputs.v if v is None else v)
        batch, heads, queries, _ = inputs.q.shape
        keys = inputs.k.shape[2]
        if wants_probs and rows_only and q is None and k is None and v is None:
            rows = rows_on(inputs.q.device)
            out = destination((batch, heads, queries if rows is None else len(rows), keys), inputs.q.device)
            probs = attention_probabilities(inputs.q, inputs.k, inputs.scale, rows, mask=inputs.mask,
                                            is_causal=inputs.is_causal, out=out)
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
# ``_kwargs_hook_race``: ``Module.register_forward_pre_hook(..., with_kwargs=True)`` inserts the
# hook first and flags it "with kwargs" after, and ``RemovableHandle.remove`` unflags it after
# removing it; a forward running on another thread in between calls the hook as ``hook(module,
# args)``. Every kwargs pre-hook here therefore takes ``kwargs=None`` and, for another thread,
# returns at once (before the owner check could run, the call itself raised a TypeError).

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
def hooks_around(model: nn.Module, hooks: Mapping[str, Hook], *, sites: Sequence[AttentionSite] | None = None
                 ) -> Iterator[None]:
    """Within the block, every forward of ``model`` run by the calling thread calls
    ``hooks[name](value)`` at the points of :data:`AROUND_POINTS`; other threads' forwards of the
    same model pass untouched. ``sites``: the blocks (default :func:`block_sites` of ``model``;
    an MAE passes its encoder layers). A hook may raise :class:`StopForward` to end the forward.

        >>> with hooks_around(vit.model, {"embed.out": lambda x: x[:, :10]}):   # keep 10 tokens
        ...     logits = vit.model(pixels)
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
            raise AnalysisError(f"{type(model).__name__} has no patch_drop module after its position embedding: "
                                "'embed.out' is not defined for it.")

        def embed(module, args, output):
            return fn(output) if threading.get_ident() == owner else None

        return [site.register_forward_hook(embed)]
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

        return [site.module.register_forward_pre_hook(rope, with_kwargs=True)]
    heads = site.adapter.num_heads(site.module)

    def probabilities(inputs: AttentionInputs) -> None:
        probs = (attention_probabilities(inputs.q, inputs.k, inputs.scale, mask=inputs.mask, is_causal=inputs.is_causal)
                 if inputs.probs is None else inputs.probs.float())  # (B, heads, T, T)
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
