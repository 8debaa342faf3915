"""The Attention page's cached computations (``st.cache_data`` / ``st.cache_resource``): what only this page
computes, beside it. The shared ones (a model, a captured forward pass) are :mod:`vizapp.resources`'."""

from __future__ import annotations

import numpy as np
import streamlit as st
import torch

from analysis import (
    pooling_attention_map,
)
from vizapp import resources  # looked up at each call: a test may replace one
from vizapp.limits import MAX_RESULTS
from vizapp.refs import ModelRef

__all__ = ["pooling_attention"]


@st.cache_data(show_spinner="Gathering the pooling attention…", max_entries=MAX_RESULTS)
def pooling_attention(ref: ModelRef, digest: str, _image_bytes: bytes) -> np.ndarray | None:
    """The attention-pooling head's first probe over the patch tokens: ``(heads + 1, gh, gw)``
    float32 (index ``heads`` is the mean over heads), or ``None`` without such a head."""
    record = resources.forward(ref, digest, _image_bytes).record
    if record.pool_attention is None:
        return None
    heads = record.pool_attention.shape[1]
    maps = []
    for head in [*range(heads), None]:
        drawn = pooling_attention_map(record, head=head)  # (1, gh, gw): the record has a pooling head
        assert drawn is not None, "a record with pool_attention has a pooling map"
        maps.append(drawn[0])
    return torch.stack(maps).numpy().astype(np.float32)
