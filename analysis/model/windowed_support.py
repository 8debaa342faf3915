"""What windowed models (Swin, SAM) support today, and the one refusal for the rest.

:func:`require_global_attention` is the one rule for an analysis that is not defined for windowed
attention: given a windowed model, spec or record it raises the analysis's own typed error.
:func:`refuse_windowed` is its generic form, naming the reason and :data:`WINDOWED_SUPPORT`. It needs only
the spec, so it sits with it, below the adapters and records (import these names from here).
"""

from __future__ import annotations

from collections.abc import Callable

from ..base.errors import AnalysisError
from .geometry import ViTSpec

__all__ = [
    "WINDOWED_SUPPORT",
    "refuse_windowed",
    "require_global_attention",
    "windowed_message",
    "is_model_refusal",
]

WINDOWED_SUPPORT = (
    "capture_attention (record.windows), attention_map, mean_attention_distance with "
    "uniform_attention_distance_by_layer, relative_position_bias (Swin) / decomposed_relative_position (SAM), "
    "patch_embedding_filters, attention_rollout within a stage (SAM: every layer; across Swin's patch merging "
    "only with merge='mean_2x2', an approximation; rollout_maps gives the grid), explain with "
    "'gradcam' (last stage), 'input_x_gradient', 'integrated_gradients', 'attnlrp' (stem patch grid) and 'rollout'; "
    "capture_tokens (stage outputs) with feature_pca / patch_similarity per layer, "
    "logit_lens on the last stage, dataset_attention_distance, and robustness_curve / probe except token drop"
)


def refuse_windowed(value, what: str, error: type[Exception] = AnalysisError) -> None:
    """Raise ``error`` when ``value`` (a LoadedViT, a spec or a record) is a windowed model:
    ``what`` is not yet defined for it. Does nothing for a ViT.

    Parameters
    ----------
    value : LoadedViT, ViTSpec or AttentionRecord
        What the analysis was given (anything without a windowed spec passes).
    what : str
        The analysis, as the message names it.
    error : type, default AnalysisError
        The exception class raised, built with :func:`windowed_message`.

    Raises
    ------
    AnalysisError
        ``value`` is a windowed model (or the given ``error`` class), marked as a model refusal
        (:func:`is_model_refusal`).
    """
    require_global_attention(value, lambda spec: error(windowed_message(what, spec.family)))


def require_global_attention(value, error_for: Callable[[ViTSpec], Exception]) -> None:
    """The one rule for analyses defined only for global attention: raise ``error_for(spec)``
    when ``value`` (a LoadedViT, a spec or a record; anything else passes) is a windowed model.

    Parameters
    ----------
    value : LoadedViT, ViTSpec or AttentionRecord
        What the analysis was given; anything else passes.
    error_for : callable
        ``error_for(spec)`` builds the analysis's own typed error from the spec, naming why windows
        do not define it and what to use instead; :func:`refuse_windowed` is the generic one.

    Raises
    ------
    Exception
        ``error_for(spec)`` for a windowed model, with ``model_refusal = True`` set on it.
    """
    spec = getattr(value, "spec", value)
    if isinstance(spec, ViTSpec) and spec.is_windowed:
        error = error_for(spec)
        error.model_refusal = True  # type: ignore[attr-defined]  # read by is_model_refusal
        raise error


def is_model_refusal(error: BaseException, model=None) -> bool:
    """True when ``error`` says that an analysis is not defined for this kind of model, rather
    than that it failed: an app shows such a reason as information, and a failure as an error.

    That is an error raised through :func:`require_global_attention` or :func:`refuse_windowed`
    (naming why and what works instead), or, given the ``model`` it came from (a LoadedViT, a
    spec or a record), any AnalysisError of a windowed model: windowed attention is supported
    analysis by analysis (:data:`WINDOWED_SUPPORT`), so what an analysis of one refuses is what
    is not yet defined for it. A ViT's other AnalysisErrors are failures.

    Parameters
    ----------
    error : BaseException
        The error raised.
    model : LoadedViT, ViTSpec, AttentionRecord or None, default None
        What the analysis was given, if known.

    Returns
    -------
    bool
        True for a refusal, False for a failure.
    """
    if getattr(error, "model_refusal", False) is True:
        return True
    spec = getattr(model, "spec", model)
    return isinstance(error, AnalysisError) and isinstance(spec, ViTSpec) and not spec.attends_globally


def windowed_message(what: str, family: str) -> str:
    """Why ``what`` refuses a windowed model of class ``family``, and what works instead.

    Parameters
    ----------
    what : str
        The analysis.
    family : str
        The model class, e.g. ``"SwinTransformer"``.

    Returns
    -------
    str
        The message, listing :data:`WINDOWED_SUPPORT`.
    """
    return (
        f"{what}: windowed attention ({family}, attention inside local windows of each stage's grid) is not "
        f"yet supported for Swin or SAM models. What works for windowed models today, in the "
        f"Python API: {WINDOWED_SUPPORT}."
    )
