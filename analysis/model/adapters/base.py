"""How attention probabilities are read out of an attention module, exactly as it uses them.

Every attention module of the families we support ends in one of two ways:

* **fused**: it calls ``F.scaled_dot_product_attention(q, k, v, attn_mask=..., scale=...)``.
  The weights never exist. While *this thread* runs the module, a thread-local
  :class:`~torch.overrides.TorchFunctionMode` sees that call and receives ``q``, ``k`` and
  the mask *as the module passes them*: after q/k norm, after RoPE, with relative-position
  bias folded into ``attn_mask``. We compute, in float32, beside the untouched call::

      P = softmax(scale · q·kᵀ + M)         # M: float bias, or 0 / −∞ from a boolean mask

* **explicit**: it computes ``softmax`` itself and passes the result through its
  ``attn_drop`` dropout (identity in eval). A forward hook on ``attn_drop`` reads ``P``.

Either way the module's own computation is unchanged, so logits stay bit-identical, and
nothing is stored on the module: hooks live for one call of the engine (:func:`analysis.engine.activations.run_with_cache`), react
only to the thread that registered them, and are removed in ``finally``.

Gradients with respect to the probabilities (class-specific explanations) are the engine's
gradient mode (:mod:`analysis.engine.activations.run`): it computes the fused call's scores by
differentiable ops (:func:`~analysis.model.adapters.probabilities.attention_scores`) and their
softmax, and returns ``P·v`` from that very ``P``. Explicit-path modules need nothing: the reported
``P`` is already the one they multiply with ``v``.

An :class:`AttentionAdapter` describes one attention family (its module types, what its
probabilities include). Families that do not follow this contract override :meth:`AttentionAdapter.tap`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ...base.module_hooks import ModuleHook, add_forward_hook, add_forward_pre_hook
from .blocks import TIMM_BLOCK, BlockLayout

__all__ = ["AttentionInputs", "AttentionAdapter", "Report", "attend"]


@dataclass(frozen=True)
class AttentionInputs:
    """What one attention call used: either the scores' ingredients or the probabilities.

    A fused call (``F.scaled_dot_product_attention``) fills ``q``, ``k``, ``scale``, ``mask``,
    ``is_causal`` and ``v``; an explicit one fills ``probs`` only.

    Attributes
    ----------
    q : torch.Tensor or None, default None
        Queries ``(B, heads, Q, d)`` as the module passes them (after q/k norm, RoPE).
    k : torch.Tensor or None, default None
        Keys ``(B, kv_heads, T, d)``.
    scale : float or None, default None
        The factor on q·kᵀ (SDPA's default ``d ** -0.5`` when the call passed none).
    mask : torch.Tensor or None, default None
        Broadcastable to ``(B, heads, Q, T)``: a float bias or a boolean keep-mask.
    is_causal : bool, default False
        The call's ``is_causal`` flag.
    probs : torch.Tensor or None, default None
        Probabilities ``(B, heads, Q, T)`` already computed by the module (explicit path).
    v : torch.Tensor or None, default None
        Values ``(B, kv_heads, T, d)`` of a fused call.
    """

    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    scale: float | None = None
    mask: torch.Tensor | None = None
    is_causal: bool = False
    probs: torch.Tensor | None = None
    v: torch.Tensor | None = None  # ``(B, kv_heads, T, d)``, the values of a fused call


# Called with the inputs of one attention call of the tapped module. Under a ``reuse`` tap it may
# return the call's output P·v (B, heads, T, d), computed from the very P it recorded, which
# then replaces the fused kernel (None: the module's own call runs).
Report = Callable[[AttentionInputs], "torch.Tensor | None"]


class _SdpaListener(TorchFunctionMode):
    """Reports every ``scaled_dot_product_attention`` call made while it is on this thread's
    stack (and, with ``softmax=True``, every ``softmax`` result: for modules whose explicit
    path has no ``attn_drop``)."""

    def __init__(self, report: Report, *, softmax: bool = False, reuse: bool = False) -> None:
        super().__init__()
        self.report = report
        self.softmax = softmax
        self.reuse = reuse

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            inputs = _sdpa_inputs(*args, **kwargs)
            if self.reuse and _dropout_p(*args, **kwargs) == 0.0:
                output = self.report(inputs)
                if output is not None:
                    return output  # P·v from the very P reported: the scores computed once
            else:
                self.report(inputs)
        result = func(*args, **kwargs)
        if self.softmax and func in (torch.Tensor.softmax, torch.softmax, F.softmax):
            replaced = self.report(AttentionInputs(probs=result))  # a returned tensor replaces P (interventions)
            if replaced is not None:
                return replaced
        return result


def _sdpa_inputs(
    query, key, value=None, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
) -> AttentionInputs:
    """The arguments of ``F.scaled_dot_product_attention`` as :class:`AttentionInputs`."""
    return AttentionInputs(
        q=query,
        k=key,
        scale=float(scale) if scale is not None else query.shape[-1] ** -0.5,  # SDPA's own default
        mask=attn_mask,
        is_causal=bool(is_causal),
        v=value,
    )


def _dropout_p(query, key, value=None, attn_mask=None, dropout_p=0.0, *args, **kwargs) -> float:
    return float(dropout_p)


def attend(probs: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``P·v``: the attention output that an adapter's explicit path and the engine's edited
    probabilities both compute, ``v`` repeated for grouped-query heads (computed outside autocast).

    Parameters
    ----------
    probs : torch.Tensor
        Probabilities ``(B, heads, Q, T)``; cast to ``value``'s dtype.
    value : torch.Tensor
        Values ``(B, kv_heads, T, d)``, ``heads`` a multiple of ``kv_heads``.

    Returns
    -------
    torch.Tensor
        ``(B, heads, Q, d)`` in ``value``'s dtype.
    """
    if value.shape[1] != probs.shape[1]:
        value = value.repeat_interleave(probs.shape[1] // value.shape[1], dim=1)
    with torch.autocast(value.device.type, enabled=False):
        return torch.matmul(probs.to(value.dtype), value)


class AttentionAdapter:
    """One attention family: which module types, and how their probabilities are read.

    Subclasses set ``name``, ``module_types`` and ``includes`` (what the probabilities
    include, e.g. "rotary position embedding on patch tokens"). The default :meth:`tap`
    follows the fused/explicit contract in the module docstring.

    Attributes
    ----------
    name : str, default "attention"
        The family's name.
    module_types : tuple of type, default ()
        The ``nn.Module`` types of this family's attention modules.
    includes : str, default "softmax(q·kᵀ·scale)"
        What the probabilities include, e.g. "rotary position embedding on patch tokens".
    explicit_softmax : bool, default False
        The explicit path has no ``attn_drop``: the result of its ``softmax`` call is read instead.
    windowed : bool, default False
        Attends inside windows: one call sees ``(B·windows, heads, Wt, Wt)``, not all tokens (Swin, SAM).
    always_explicit : bool, default False
        Never calls the fused kernel (its softmax is always explicit, e.g. Swin v2's cosine attention).
    block_layout : BlockLayout, default TIMM_BLOCK
        Where the blocks that hold this attention keep their norms, branches and MLP
        (:mod:`analysis.model.adapters.blocks`).
    """

    name: str = "attention"
    module_types: tuple[type[nn.Module], ...] = ()
    includes: str = "softmax(q·kᵀ·scale)"
    # The explicit path has no attn_drop: read the result of its softmax call instead.
    explicit_softmax: bool = False
    # Attends inside windows: one call sees (B·windows, heads, Wt, Wt), not all tokens (Swin, SAM).
    windowed: bool = False
    # Never calls the fused kernel (its softmax is always explicit, e.g. Swin v2's cosine attention).
    always_explicit: bool = False
    # Where the blocks that hold this attention keep their norms, branches and MLP (analysis.model.adapters.blocks).
    block_layout: BlockLayout = TIMM_BLOCK

    def num_heads(self, module: nn.Module) -> int:
        return int(getattr(module, "num_heads"))  # read by name (see the ruff B009 note)

    def defines(self, site, point: str) -> bool:
        """Whether the block at ``site`` has the hook point ``point`` (``"attn.q"``, ``"resid_mid"``,
        … of :mod:`analysis.engine.activations.points`): q, k and v exist only where the module calls
        the fused kernel (not with ``fused_attn=False``, timm's default for Swin, nor in families
        that are ``always_explicit``)."""
        if point in ("attn.q", "attn.k", "attn.v"):
            return not self.always_explicit and getattr(site.module, "fused_attn", True) is not False
        return True

    def block_norm(self, block: nn.Module, which: str) -> nn.Module | None:
        """The first (``which="ln1"``) or second (``"ln2"``) norm of a block that holds this
        family's attention (the ``ln1.*``/``ln2.*`` points), or ``None``: :attr:`block_layout` says where."""
        return self.block_layout.norm(block, which)

    def branch_output(self, block: nn.Module, which: str) -> nn.Module | None:
        """The module whose output the block's ``"attn"`` or ``"mlp"`` branch adds to the residual
        stream (the ``attn.out``/``mlp.out`` points: ``resid_mid = resid_pre + attn.out``), or ``None``."""
        return self.block_layout.branch(block, which)

    def mlp_layers(self, block: nn.Module) -> tuple[nn.Module, nn.Module] | None:
        """``(first, output)`` linear layers of the block's MLP (``mlp.pre`` is the first one's output,
        ``mlp.post`` the output one's input), or ``None`` when the block has no such MLP."""
        return self.block_layout.mlp_layers(block)

    def output_projection(self, module: nn.Module) -> nn.Module | None:
        """The module's output projection: the linear layer that receives the heads' outputs
        ``(B, T, heads·d)`` concatenated and maps them to the model width (the ``attn.z`` point
        is its input, ``attn.result`` splits it by head). timm's and most families': ``proj``;
        a family that names it otherwise overrides this. ``None``: no such layer."""
        projection = getattr(module, "proj", None)
        return projection if isinstance(projection, nn.Module) else None

    def layer_geometry(self, site, patch_grid: tuple[int, int], patch_size: tuple[int, int]):
        """The :class:`~analysis.model.geometry.LayerGeometry` of a windowed family's layer at ``site``
        (an :class:`~analysis.model.adapters.registry.AttentionSite`), or ``None`` for global attention
        over ``[prefix, patches]`` (a ViT)."""
        return None

    def relative_position_bias(self, module: nn.Module, window: tuple[int, int]) -> torch.Tensor | None:
        """The bias ``module`` adds to the score of a query and a key of one ``wh × ww`` window by their
        offset alone, per head: ``(heads, 2·wh − 1, 2·ww − 1)``, entry ``[h, Δy + wh − 1, Δx + ww − 1]``
        for ``query − key = (Δy, Δx)``, as the module computes it (no gradient). ``None``: this family
        adds no such per-head, offset-only bias (the default)."""
        return None

    def decomposed_relative_position(
        self, module: nn.Module, window: tuple[int, int]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(rows (2·wh − 1, head_dim), cols (2·ww − 1, head_dim))``: the relative-position tables of a
        family whose bias is decomposed by axis and multiplied by the query (SAM), row ``Δ + side − 1`` for
        the offset ``Δ = query − key``, as the module reads them (no gradient). ``None``: no such tables."""
        return None

    def tap(self, module: nn.Module, report: Report, owner: int, *, reuse: bool = False) -> list[ModuleHook]:
        """Hooks on ``module`` that call ``report`` once per forward of ``module`` by thread
        ``owner``. ``reuse``: when ``report``
        returns the call's output ``P·v`` (from the probabilities it recorded), that replaces the
        fused call, so the scores are computed once (equal to the fused kernel's to float rounding)."""
        listener = _SdpaListener(report, softmax=self.explicit_softmax, reuse=reuse)
        entered: list[bool] = []

        def enter(mod, args):
            if threading.get_ident() == owner:
                listener.__enter__()
                entered.append(True)

        def leave(mod, args, output):
            if threading.get_ident() == owner and entered:
                entered.pop()
                listener.__exit__(None, None, None)

        def explicit(mod, args, output):
            if threading.get_ident() == owner:  # a returned tensor replaces the probabilities (interventions)
                return report(AttentionInputs(probs=args[0]))
            return None

        handles = [
            add_forward_pre_hook(module, enter),
            add_forward_hook(module, leave, always_call=True),  # pops the mode even if forward raises
        ]
        dropout = getattr(module, "attn_drop", None)
        if isinstance(dropout, nn.Module) and not self.explicit_softmax:
            handles.append(add_forward_hook(dropout, explicit))
        return handles

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
