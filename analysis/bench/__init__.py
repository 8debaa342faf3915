"""Benchmarks (``python -m analysis.bench``): speed and memory ratios measured side by side in
one run. Not part of the analysis API; nothing in :mod:`analysis` imports it."""
