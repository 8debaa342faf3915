"""The engine: one forward pass with named hook points (``activations``); ``capture_attention``
is a view over it (``capture``).
"""
