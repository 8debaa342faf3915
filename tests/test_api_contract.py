"""The public API names are a contract, and the analysis package never needs Streamlit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import analysis

REPO = Path(__file__).resolve().parent.parent


def test_public_names_are_exported():
    for name in ("load_vit", "capture_attention", "attention_map", "attention_rollout", "mean_attention_distance",
                 "position_embedding_similarity", "patch_embedding_components", "load_image", "ImageLoadError",
                 "dataset_attention_distance", "ModelLoadError", "UnsupportedModelError", "AnalysisError"):
        assert name in analysis.__all__ and callable(getattr(analysis, name)), name
    assert issubclass(analysis.ImageLoadError, ValueError)
    assert issubclass(analysis.UnsupportedModelError, analysis.ModelLoadError)


def test_analysis_never_imports_streamlit():
    code = (
        "import sys, analysis, analysis.bench, analysis.streaming;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('streamlit', 'plotly')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_package_docstring_example_runs():
    import doctest

    failures, tried = doctest.testmod(analysis, verbose=False)
    assert tried >= 4 and failures == 0
