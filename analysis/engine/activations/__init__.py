"""Named hook points, one activation cache, and interventions.

    >>> from analysis import asset_path, load_image, load_vit
    >>> from analysis.engine.activations import run_with_cache, run_with_hooks
    >>> vit = load_vit("demo")  # 4 blocks, 4 heads, 64 patches and a class token
    >>> pixels = vit.preprocess(load_image(asset_path("samples", "scene_1_star.png")))
    >>> cache = run_with_cache(vit, pixels, names=["blocks.0.attn.probs", "blocks.0.resid_post"])
    >>> tuple(cache["blocks.0.attn.probs"].shape), tuple(cache["blocks.0.resid_post"].shape)  # (B, heads, T, T), (B, T, D)
    ((1, 4, 65, 65), (1, 65, 128))
    >>> logits = run_with_hooks(vit, pixels, {"blocks.0.attn.z": lambda z: z * 0})  # every head of block 0 silenced
    >>> tuple(logits.shape)
    (1, 6)
    >>> cache = run_with_cache(vit, pixels, names=["blocks.3.attn.probs"], grad_of=lambda logits: logits[:, 5].sum())
    >>> tuple(cache.grad("blocks.3.attn.probs").shape)  # ∂logit₅/∂P, the shape of cache["blocks.3.attn.probs"]
    (1, 4, 65, 65)

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
