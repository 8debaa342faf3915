"""timm's standard multi-head self-attention (ViT, DeiT, DINO/DINOv2, CLIP/SigLIP towers, NaFlex)."""

from timm.layers import Attention

from .base import AttentionAdapter
from .registry import register_adapter


class MultiHeadAttentionAdapter(AttentionAdapter):
    name = "multi-head self-attention"
    module_types = (Attention,)
    includes = "softmax(scale·q·kᵀ [+ mask]), q and k after the module's q/k norm"


ADAPTER = register_adapter(MultiHeadAttentionAdapter())
