"""Attention with rotary position embedding: EVA-02, DINOv3, PE, timm's rope ViTs."""

from timm.layers import AttentionRope
from timm.models.eva import EvaAttention

from .base import AttentionAdapter
from .registry import register_adapter


class RotaryAttentionAdapter(AttentionAdapter):
    name = "rotary (RoPE) attention"
    module_types = (EvaAttention, AttentionRope)
    includes = (
        "softmax(scale·q'·k'ᵀ [+ mask]) with q', k' after q/k norm and after the rotary embedding "
        "(applied to patch tokens only; prefix tokens are not rotated)"
    )


ADAPTER = register_adapter(RotaryAttentionAdapter())
