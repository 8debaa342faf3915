"""The sparse autoencoder: ``SparseAutoencoder`` and its frozen ``SAEConfig``.

For an activation ``x`` (one token's ``(d_in,)`` vector) the SAE computes

    pre = (x − b_dec) W_enc + b_enc                      W_enc: (d_in, d_sae), b_enc: (d_sae,)
    f   = relu(pre)                                      ("relu", Bricken et al. 2023, "Towards
                                                          Monosemanticity", Anthropic)
    f   = TopK_k(relu(pre))                              ("topk", Gao et al. 2024, "Scaling and
                                                          evaluating sparse autoencoders", OpenAI):
                                                          the k largest entries kept, the rest 0
    x̂   = f W_dec + b_dec                                W_dec: (d_sae, d_in), b_dec: (d_in,)

These are SAELens's names, shapes and formulas (``apply_b_dec_to_input=True``), so a saved SAE is
read by SAELens unchanged (:mod:`analysis.sae.saelens`).

**Input normalisation.** An SAE trained with ``normalise=True`` (:func:`~analysis.sae.train_sae`)
carries a scalar ``s = config.norm_scaling_factor`` and works in scaled units: it reads ``s·x``
and its reconstruction ``f W_dec + b_dec`` is of ``s·x``, so in the model's units

    pre = (s·x − b_dec) W_enc + b_enc,        x̂ = (f W_dec + b_dec) / s

:meth:`SparseAutoencoder.encode`, :meth:`~SparseAutoencoder.decode` and ``forward`` take and give
the model's units (the splice, the metrics and the feature readers need nothing else);
:meth:`~SparseAutoencoder.decode_scaled` is the reconstruction in the SAE's units (the training
loss). ``s = sqrt(d_in) / E‖x‖`` over training tokens, so that ``E‖s·x‖ = sqrt(d_in)``: SAELens's
``normalize_activations="expected_average_only_in"`` (its ``ActivationScaler``), and saev's
``scale_norm`` without ``scale_mean``. With ``norm_scaling_factor=None`` (the default) no scaling
is applied at all, so the formulas above are computed exactly as without the option. The rows of ``W_dec`` (one direction per
feature) are kept at unit norm during training: :meth:`SparseAutoencoder.remove_parallel_gradient`
before each optimiser step (the gradient's component along each row is removed, so a step does not
grow the row to first order) and :meth:`SparseAutoencoder.normalise_decoder` after it (both as in
Gao et al. 2024, Section 2.4 / Appendix A, and Anthropic's "Towards Monosemanticity").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from .errors import SAEConfigError

__all__ = ["SAEConfig", "SparseAutoencoder", "ARCHITECTURES", "TOKEN_CHOICES", "topk_activation"]

ARCHITECTURES = ("topk", "relu")
#: which tokens of a ``(B, T, D)`` point the SAE reads: the patch tokens, the class token, or all.
TOKEN_CHOICES = ("patches", "class", "all")
_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class SAEConfig:
    """What an SAE is and where it reads.

    Attributes
    ----------
    d_in : int
        The width of the activations (the layer's ``D``).
    d_sae : int
        The number of features (``expansion · d_in``).
    architecture : str, default "topk"
        ``"topk"`` or ``"relu"`` (:data:`ARCHITECTURES`).
    k : int or None, default None
        Features kept per token (TopK only, where it is required; ``1 ≤ k ≤ d_sae``).
    l1_coefficient : float or None, default None
        The sparsity penalty ``λ`` of a ReLU SAE's loss (training only).
    hook_name : str, default ""
        The hook point it reads, e.g. ``"blocks.3.resid_post"``.
    tokens : str, default "patches"
        ``"patches"``, ``"class"`` or ``"all"`` (see :data:`TOKEN_CHOICES`).
    model_name : str, default ""
        The model source it was trained on (``LoadedViT.name``).
    dtype : str, default "float32"
        The parameters' dtype, a name: ``"float32"``, ``"float64"``, ``"float16"`` or ``"bfloat16"``.
    norm_scaling_factor : float or None, default None
        The input scale ``s`` (module docstring): the SAE reads ``s·x`` and writes back
        ``(f W_dec + b_dec) / s``; ``None`` reads ``x`` as it is.

    Raises
    ------
    SAEConfigError
        An unknown ``architecture``, ``tokens`` or ``dtype``; ``d_in`` or ``d_sae`` below 1; a TopK
        SAE whose ``k`` is ``None`` or outside ``1..d_sae``; a ``norm_scaling_factor`` that is not a
        finite positive number.
    """

    d_in: int
    d_sae: int
    architecture: str = "topk"
    k: int | None = None
    l1_coefficient: float | None = None
    hook_name: str = ""
    tokens: str = "patches"
    model_name: str = ""
    dtype: str = "float32"
    norm_scaling_factor: float | None = None

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise SAEConfigError(
                f"Unknown SAE architecture {self.architecture!r}: use one of {', '.join(ARCHITECTURES)}."
            )
        if self.tokens not in TOKEN_CHOICES:
            raise SAEConfigError(f"Unknown token choice {self.tokens!r}: use one of {', '.join(TOKEN_CHOICES)}.")
        if int(self.d_in) < 1 or int(self.d_sae) < 1:
            raise SAEConfigError(f"d_in and d_sae must be positive (got {self.d_in}, {self.d_sae}).")
        if self.architecture == "topk":
            if self.k is None or not 1 <= int(self.k) <= int(self.d_sae):
                raise SAEConfigError(
                    f"A TopK SAE keeps k of its d_sae = {self.d_sae} features per token, so 1 ≤ k ≤ {self.d_sae}; "
                    f"got k = {self.k}. Choose a smaller k or a larger expansion."
                )
        if self.dtype not in _DTYPES:
            raise SAEConfigError(f"Unknown dtype {self.dtype!r}: use one of {', '.join(_DTYPES)}.")
        scale = self.norm_scaling_factor
        if scale is not None and not (math.isfinite(float(scale)) and float(scale) > 0):
            raise SAEConfigError(f"norm_scaling_factor must be a finite positive number or None; got {scale}.")

    @property
    def torch_dtype(self) -> torch.dtype:
        """The parameters' ``torch.dtype``."""
        return _DTYPES[self.dtype]


def topk_activation(pre: torch.Tensor, k: int) -> torch.Tensor:
    """``TopK_k(relu(pre))`` over the last axis: the ``k`` largest of ``relu(pre)`` kept, the rest
    zeroed (Gao et al. 2024, Eq. 3).

    Parameters
    ----------
    pre : torch.Tensor
        ``(..., d_sae)`` pre-activations.
    k : int
        Entries kept per row, ``1 ≤ k ≤ d_sae``.

    Returns
    -------
    torch.Tensor
        ``(..., d_sae)``, ``pre``'s dtype: at most ``k`` nonzero per row, exactly ``k`` when at least
        ``k`` entries of ``pre`` are positive.
    """
    values, indices = torch.topk(pre, k, dim=-1)  # (..., k)
    return torch.zeros_like(pre).scatter(-1, indices, torch.relu(values))


class SparseAutoencoder(nn.Module):
    """A sparse autoencoder over one hook point's activations (module docstring: the formulas).

    Its weights have SAELens's names. A new SAE has unit-norm random decoder rows, ``W_enc = W_decᵀ``
    (Gao et al. 2024's initialisation) and zero biases.

    Parameters
    ----------
    config : SAEConfig
        What the SAE is (widths, architecture, ``k``, dtype) and where it reads.
    generator : torch.Generator or None, default None
        Draws the random decoder rows (on the CPU): makes a new SAE reproducible.

    Attributes
    ----------
    config : SAEConfig
        As given.
    W_enc : torch.nn.Parameter
        ``(d_in, d_sae)`` encoder, ``config.dtype``.
    b_enc : torch.nn.Parameter
        ``(d_sae,)`` encoder bias.
    W_dec : torch.nn.Parameter
        ``(d_sae, d_in)`` decoder, one feature direction per row (unit norm).
    b_dec : torch.nn.Parameter
        ``(d_in,)`` decoder bias, also subtracted from the input.
    """

    def __init__(self, config: SAEConfig, *, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.config = config
        dtype = config.torch_dtype
        W_dec = torch.randn(config.d_sae, config.d_in, generator=generator, dtype=torch.float32).to(dtype)
        W_dec = W_dec / W_dec.norm(dim=1, keepdim=True)  # (d_sae, d_in), unit rows
        self.W_dec = nn.Parameter(W_dec)
        self.W_enc = nn.Parameter(W_dec.T.clone())  # (d_in, d_sae)
        self.b_enc = nn.Parameter(torch.zeros(config.d_sae, dtype=dtype))
        self.b_dec = nn.Parameter(torch.zeros(config.d_in, dtype=dtype))

    def scale_input(self, x: torch.Tensor) -> torch.Tensor:
        """``s·x`` in the parameters' dtype, the model's units to the SAE's (``x`` unchanged but for
        the dtype when ``norm_scaling_factor`` is ``None``): ``(..., d_in)`` → ``(..., d_in)``."""
        x = x.to(self.W_enc.dtype)
        scale = self.config.norm_scaling_factor
        return x if scale is None else x * float(scale)

    def pre_activation(self, x: torch.Tensor) -> torch.Tensor:
        """``pre = (s·x − b_dec) W_enc + b_enc`` of activations ``x (..., d_in)`` in the model's units
        (``s`` = 1 without normalisation) → ``(..., d_sae)``."""
        return (self.scale_input(x) - self.b_dec) @ self.W_enc + self.b_enc

    def activation(self, pre: torch.Tensor) -> torch.Tensor:
        """The architecture's nonlinearity on ``pre (..., d_sae)``: ``relu`` or ``TopK_k ∘ relu``."""
        if self.config.architecture == "topk":
            return topk_activation(pre, int(self.config.k or 0))
        return torch.relu(pre)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The features ``f (..., d_sae)`` of activations ``x (..., d_in)``."""
        return self.activation(self.pre_activation(x))

    def decode_scaled(self, f: torch.Tensor) -> torch.Tensor:
        """The reconstruction in the SAE's units, ``f W_dec + b_dec`` (of ``s·x``):
        ``(..., d_sae)`` → ``(..., d_in)``."""
        return f.to(self.W_dec.dtype) @ self.W_dec + self.b_dec

    def decode(self, f: torch.Tensor) -> torch.Tensor:
        """The reconstruction in the model's units, ``x̂ = (f W_dec + b_dec) / s`` (``s`` = 1 without
        normalisation): ``(..., d_sae)`` → ``(..., d_in)``."""
        scaled = self.decode_scaled(f)  # (..., d_in)
        scale = self.config.norm_scaling_factor
        return scaled if scale is None else scaled / float(scale)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x̂ (..., d_in), f (..., d_sae))`` of ``x (..., d_in)``, both ``x`` and ``x̂`` in the
        model's units."""
        f = self.encode(x)
        return self.decode(f), f

    @torch.no_grad()
    def normalise_decoder(self) -> None:
        """Rescale every row of ``W_dec`` to unit norm (a row of zeros stays zero)."""
        norms = self.W_dec.norm(dim=1, keepdim=True)  # (d_sae, 1)
        self.W_dec.div_(norms.clamp_min(torch.finfo(self.W_dec.dtype).tiny))

    @torch.no_grad()
    def remove_parallel_gradient(self) -> None:
        """Project out of ``W_dec.grad`` each row's component along that (unit) row:
        ``g_i ← g_i − (g_i·w_i) w_i``, so the step is tangent to the unit sphere."""
        if self.W_dec.grad is None:
            return
        parallel = (self.W_dec.grad * self.W_dec).sum(dim=1, keepdim=True)  # (d_sae, 1)
        self.W_dec.grad.sub_(parallel * self.W_dec)
