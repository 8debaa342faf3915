"""Named hook points, one activation cache, and interventions.

    >>> from analysis.engine.activations import run_with_cache, run_with_hooks, HOOK_POINTS
    >>> cache = run_with_cache(vit, pixels, names=["blocks.0.attn.probs", "blocks.0.resid_post"])
    >>> logits = run_with_hooks(vit, pixels, {"blocks.0.attn.z": lambda z: z * 0})
    >>> cache = run_with_cache(vit, pixels, names=["blocks.3.attn.probs"], grad_of=lambda logits: logits[:, 7].sum())
    >>> cache.grad("blocks.3.attn.probs")         # ∂logit₇/∂P, the shape of cache["blocks.3.attn.probs"]

See :mod:`.points` for the table of names and shapes and :mod:`.run` for the guarantees.
"""

from .cache import ActivationCache
from .points import HOOK_POINTS, POOL_NAME, TRANSFORMERLENS_NAMES, HookPoint, hook_point_names, parse_hook_name
from .run import Hook, run_with_cache, run_with_hooks

__all__ = [
    "ActivationCache",
    "HOOK_POINTS",
    "POOL_NAME",
    "TRANSFORMERLENS_NAMES",
    "HookPoint",
    "Hook",
    "hook_point_names",
    "parse_hook_name",
    "run_with_cache",
    "run_with_hooks",
]
