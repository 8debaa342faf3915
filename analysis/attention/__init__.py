"""Analyses of the attention maps: per-layer maps, mean attention distance (also streamed over an
image set), rollout (global and windowed) and attention mass.
"""
