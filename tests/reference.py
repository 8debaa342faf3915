"""Slow, obviously-correct reference implementations the tests compare against."""

from __future__ import annotations

import math

import numpy as np
import torch


def manual_softmax(scores: torch.Tensor) -> torch.Tensor:
    shifted = scores - scores.max(dim=-1, keepdim=True).values
    exp = shifted.exp()
    return exp / exp.sum(dim=-1, keepdim=True)


@torch.no_grad()
def reference_attention(model, pixels: torch.Tensor) -> torch.Tensor:
    """Walk the model block by block; at each block recompute softmax(q·kᵀ·scale) from the
    block's input with its own qkv weights. Returns (L, B, heads, T, T) float64."""
    x = model.patch_embed(pixels)
    x = model._pos_embed(x)
    x = model.patch_drop(x)
    x = model.norm_pre(x)
    maps = []
    for block in model.blocks:
        attn = block.attn
        normed = block.norm1(x).double()  # (B, T, D)
        weight = attn.qkv.weight.double()
        bias = attn.qkv.bias.double() if attn.qkv.bias is not None else None
        qkv = normed @ weight.T + (bias if bias is not None else 0)  # (B, T, 3·D)
        batch, tokens, _ = qkv.shape
        heads, head_dim = attn.num_heads, attn.head_dim
        qkv = qkv.reshape(batch, tokens, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        q, k = qkv[0], qkv[1]  # (B, heads, T, head_dim)
        q = attn.q_norm(q.float()).double()  # identity for most ViTs, LayerNorm with qk_norm
        k = attn.k_norm(k.float()).double()
        scores = (q @ k.transpose(-2, -1)) * (head_dim**-0.5)
        maps.append(manual_softmax(scores))
        x = block(x)
    return torch.stack(maps)


def loop_attention_distance(attention: np.ndarray, grid, patch, prefix: int, renormalize=True) -> np.ndarray:
    """attention (B, heads, T, T) for one layer -> (B, heads) with explicit loops."""
    gh, gw = grid
    ph, pw = patch
    batch, heads = attention.shape[:2]
    result = np.zeros((batch, heads))
    for b in range(batch):
        for h in range(heads):
            total = 0.0
            for q in range(gh * gw):
                qr, qc = divmod(q, gw)
                row = attention[b, h, prefix + q, prefix:]
                norm = row.sum() if renormalize else 1.0
                acc = 0.0
                for k in range(gh * gw):
                    kr, kc = divmod(k, gw)
                    dist = math.hypot((qr - kr) * ph, (qc - kc) * pw)
                    acc += row[k] / norm * dist
                total += acc
            result[b, h] = total / (gh * gw)
    return result


def loop_rollout(attentions: np.ndarray, fusion: str, discard_ratio: float) -> np.ndarray:
    """attentions (L, heads, T, T) for one image -> rolled-out (T, T), explicit loops."""
    layers, heads, tokens, _ = attentions.shape
    result = np.eye(tokens)
    for layer in range(layers):
        fused = np.zeros((tokens, tokens))
        for i in range(tokens):
            for j in range(tokens):
                values = [attentions[layer, h, i, j] for h in range(heads)]
                fused[i, j] = {"mean": sum(values) / heads, "max": max(values), "min": min(values)}[fusion]
        count = int(discard_ratio * tokens * (tokens - 1))
        off_diagonal = sorted((fused[i, j], i, j) for i in range(tokens) for j in range(tokens) if i != j)
        for _, i, j in off_diagonal[:count]:
            fused[i, j] = 0.0
        mixed = np.zeros((tokens, tokens))
        for i in range(tokens):
            for j in range(tokens):
                mixed[i, j] = 0.5 * fused[i, j] + (0.5 if i == j else 0.0)
            row_sum = sum(mixed[i, j] for j in range(tokens))
            for j in range(tokens):
                mixed[i, j] /= row_sum
        result = mixed @ result
    return result
