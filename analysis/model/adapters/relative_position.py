"""Attention with a relative-position bias: BEiT/BEiTv2, vit_relpos / vit_srelpos."""

from timm.models.beit import Attention as BeitAttention
from timm.models.vision_transformer_relpos import RelPosAttention

from .base import AttentionAdapter
from .registry import register_adapter


class RelativePositionAttentionAdapter(AttentionAdapter):
    name = "relative-position-bias attention"
    module_types = (BeitAttention, RelPosAttention)
    includes = "softmax(scale·q·kᵀ + B) with B the module's (and any shared) relative-position bias"


ADAPTER = register_adapter(RelativePositionAttentionAdapter())
