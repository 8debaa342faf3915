"""Attention-pooling heads (``global_pool='map'``: SigLIP, PE): learned probe queries over tokens."""

from timm.layers import AttentionPoolLatent

from .base import AttentionAdapter
from .registry import register_adapter


class AttentionPoolAdapter(AttentionAdapter):
    name = "attention-pooling head"
    module_types = (AttentionPoolLatent,)
    includes = "softmax(scale·p·kᵀ) of the learned probe query p over every output token"
    explicit_softmax = True  # its explicit path has no attn_drop


ADAPTER = register_adapter(AttentionPoolAdapter())
