"""Analyses of the embeddings: position embeddings (learned, rotary, windowed relative position)
and the patch embedding's filters.
"""
