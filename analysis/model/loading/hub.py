"""Building timm models, and failing fast (in seconds) when hub weights are unreachable."""

from __future__ import annotations

import os
import socket
import threading
from typing import Any

import timm
import torch.nn as nn

from ...base.errors import ModelLoadError, WeightsUnavailableError

__all__ = [
    "create_timm_model",
    "ensure_pretrained_available",
    "ensure_hub_reachable",
    "offline_message",
    "pretrained_weights_cached",
    "hub_reachable",
]

_HUB_PROBE_TIMEOUT_S = 3.0


def create_timm_model(name: str, **kwargs: Any) -> nn.Module:
    """``timm.create_model`` with its failures translated into one typed error.

    Parameters
    ----------
    name : str
        The timm model name.
    **kwargs : Any
        ``timm.create_model``'s arguments (``pretrained``, ``num_classes``, ``img_size``, ...).

    Returns
    -------
    torch.nn.Module
        The model timm builds.

    Raises
    ------
    WeightsUnavailableError
        The pretrained weights are not cached and the hub cannot be reached.
    ModelLoadError
        Any other failure of timm (the message holds timm's).
    """
    try:
        return timm.create_model(name, **kwargs)
    except WeightsUnavailableError:
        raise
    except Exception as exc:  # noqa: BLE001 - translate timm/hub failures into one typed error
        text = f"{type(exc).__name__}: {exc}"
        if is_offline_error(exc):
            raise WeightsUnavailableError(offline_message(name)) from exc
        raise ModelLoadError(f"timm could not build {name!r}: {text}") from exc


def is_offline_error(exc: BaseException) -> bool:
    names = {type(e).__name__ for e in _exception_chain(exc)}
    offline = {
        "OfflineModeIsEnabled",
        "LocalEntryNotFoundError",
        "ConnectionError",
        "ConnectTimeout",
        "ReadTimeout",
        "ConnectError",
        "URLError",
        "gaierror",
    }
    return bool(names & offline)


def _exception_chain(exc: BaseException | None):
    seen = 0
    while exc is not None and seen < 10:
        yield exc
        exc = exc.__cause__ or exc.__context__
        seen += 1


def offline_message(name: str) -> str:
    """The message of a :class:`~analysis.base.errors.WeightsUnavailableError`: what to do instead.

    Parameters
    ----------
    name : str
        The model whose weights are missing.

    Returns
    -------
    str
        The message.
    """
    return (
        f"Pretrained weights for {name!r} are not in the local cache and cannot be downloaded "
        "(offline or HF_HUB_OFFLINE=1). Use the bundled 'demo' model, a local folder or weights "
        "file, or pretrained=False for random weights; or download the weights once on a "
        "machine with internet (they land in ~/.cache/huggingface)."
    )


def hub_offline_env() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _timm_hub_id(name: str) -> str | None:
    """The Hugging Face repository that holds a timm model's pretrained weights, if any."""
    try:
        cfg = timm.models.get_pretrained_cfg(name, allow_unregistered=False)
    except Exception:  # noqa: BLE001
        cfg = None
    hub_id = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    return hub_id.split("@")[0] if hub_id else None


def pretrained_weights_cached(name: str) -> bool:
    """Whether a timm model's pretrained weights are in the local Hugging Face cache (so it
    loads offline).

    Parameters
    ----------
    name : str
        The timm model name (with its ``.tag``).

    Returns
    -------
    bool
        False as well for a model whose weights are not on the Hugging Face hub.
    """
    hub_id = _timm_hub_id(name)
    return in_hf_cache(hub_id) if hub_id else False


def hub_reachable() -> bool:
    """Whether weights can be downloaded now: ``HF_HUB_OFFLINE`` is not set and
    huggingface.co answers within a few seconds.

    Returns
    -------
    bool
        True when a TCP connection to huggingface.co:443 opens in time.
    """
    return not hub_offline_env() and can_reach("huggingface.co", 443)


def ensure_pretrained_available(name: str) -> None:
    """Fail within seconds, not minutes, when weights are neither cached nor reachable.

    Parameters
    ----------
    name : str
        The timm model name (with its ``.tag``).

    Raises
    ------
    WeightsUnavailableError
        The weights are not cached, and ``HF_HUB_OFFLINE`` is set or huggingface.co does not answer.
    """
    hub_id = _timm_hub_id(name)
    if hub_id and in_hf_cache(hub_id):
        return
    ensure_hub_reachable(hub_id, name)


def ensure_hub_reachable(hub_id: str | None, name: str, filenames: tuple[str, ...] | None = None) -> None:
    """Fail within seconds when a hub repository's weights are not cached and cannot be downloaded.

    Parameters
    ----------
    hub_id : str or None
        The Hugging Face repository (``org/name``); ``None``, no cache to look in.
    name : str
        The model name, as the error writes it.
    filenames : tuple of str or None, default None
        The weights files to look for in the cache; ``None``, the usual ones
        (``model.safetensors``, ``open_clip_model.safetensors``, ``pytorch_model.bin``, ...).

    Raises
    ------
    WeightsUnavailableError
        None of them is cached, and ``HF_HUB_OFFLINE`` is set or huggingface.co does not answer.
    """
    if hub_id and in_hf_cache(hub_id, filenames):
        return
    if hub_offline_env() or not can_reach("huggingface.co", 443):
        raise WeightsUnavailableError(offline_message(name))


_WEIGHT_FILES = ("model.safetensors", "open_clip_model.safetensors", "pytorch_model.bin", "open_clip_pytorch_model.bin")


def in_hf_cache(repo_id: str, filenames: tuple[str, ...] | None = None) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover
        return False
    for filename in filenames or _WEIGHT_FILES:
        try:
            found = try_to_load_from_cache(repo_id, filename)
        except Exception:  # noqa: BLE001
            found = None
        if isinstance(found, str):
            return True
    return False


def can_reach(host: str, port: int) -> bool:
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=_HUB_PROBE_TIMEOUT_S):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=probe, daemon=True)  # DNS can hang past socket timeouts
    thread.start()
    thread.join(_HUB_PROBE_TIMEOUT_S + 0.5)
    return bool(result and result[0])
