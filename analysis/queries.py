"""Resolving a user's query ("cls", a patch index, "mean", "prefix:<i>") to attention rows."""

from __future__ import annotations

import numbers

import torch

from .capture import AttentionRecord
from .errors import AnalysisError

__all__ = ["Query", "default_query", "query_rows_for", "prefix_query", "parse_prefix_query"]

Query = str | int  # "cls" | "mean" | "prefix:<i>" | row-major patch index


def prefix_query(index: int) -> str:
    """The query of prefix token ``index`` (0 = the class token when there is one; then the
    distillation token and registers, as ``spec.token_names`` names them)."""
    return f"prefix:{int(index)}"


def parse_prefix_query(query) -> int | None:
    """``"prefix:<i>"`` -> ``i``; anything else -> None."""
    if isinstance(query, str) and query.startswith("prefix:") and query[7:].isdigit():
        return int(query[7:])
    return None


def default_query(spec, query: Query | None = None) -> Query:
    """The query an analysis reads when the caller passes ``query=None``: the token the model's
    head reads, i.e. the class token when the model has one, else the mean over every patch
    query (global-average pooling). Every map of one query (``attention_map``,
    ``attention_rollout``, ``attention_rollout_by_layer``) defaults to this, so the default
    works on every model; ``"cls"`` asked for explicitly on a model without one is an error."""
    if query is None:
        return "cls" if spec.has_class_token else "mean"
    return query


def query_rows_for(record: AttentionRecord, query: Query | None) -> list[int]:
    """Positions along the record's ``Q`` axis whose attention rows make up ``query``.

    ``"cls"`` is the class token (token 0); an ``int`` p is patch p in row-major order
    (token ``num_prefix_tokens + p``); ``"mean"`` is every patch query (averaged by callers);
    ``"prefix:<i>"`` is prefix token i (class, distillation or register token); ``None`` is
    :func:`default_query`.
    """
    spec = record.spec
    query = default_query(spec, query)
    prefix = spec.num_prefix_tokens
    token = parse_prefix_query(query)
    if token is not None:
        if not 0 <= token < prefix:
            raise AnalysisError(f"{query!r}: this model has {prefix} prefix tokens ({', '.join(spec.token_names) or 'none'}).")
        return record.query_rows([token])
    if isinstance(query, str):
        if query == "cls":
            if not spec.has_class_token:
                raise AnalysisError(
                    "This model has no class token (it pools patch tokens): use query='mean' "
                    "or a patch index instead of 'cls'."
                )
            return record.query_rows([0])
        if query == "mean":
            return record.query_rows(range(prefix, prefix + spec.num_patches))
        raise AnalysisError(f"query must be 'cls', 'mean', 'prefix:<i>' or a patch index, not {query!r}.")
    if isinstance(query, bool) or not isinstance(query, numbers.Integral):
        raise AnalysisError(f"query must be 'cls', 'mean' or a patch index, not {query!r}.")
    query = int(query)
    if not 0 <= query < spec.num_patches:
        gh, gw = spec.grid_size
        raise AnalysisError(f"Patch index {query} is outside the {gh}x{gw} grid (0..{spec.num_patches - 1}).")
    return record.query_rows([prefix + query])


def select_query(attention: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """``(..., Q, T)`` -> ``(..., T)``: the mean of the chosen query rows."""
    if len(rows) == 1:
        return attention[..., rows[0], :].float()
    index = torch.as_tensor(rows, device=attention.device)
    return attention.index_select(-2, index).float().mean(dim=-2)
