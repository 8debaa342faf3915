"""The public API names are a contract, and the analysis package never needs Streamlit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import analysis

REPO = Path(__file__).resolve().parent.parent


def test_public_names_are_exported():
    for name in (
        "load_vit",
        "capture_attention",
        "attention_map",
        "attention_rollout",
        "mean_attention_distance",
        "position_embedding_similarity",
        "patch_embedding_components",
        "load_image",
        "ImageLoadError",
        "dataset_attention_distance",
        "ModelLoadError",
        "UnsupportedModelError",
        "AnalysisError",
    ):
        assert name in analysis.__all__ and callable(getattr(analysis, name)), name
    assert issubclass(analysis.ImageLoadError, ValueError)
    assert issubclass(analysis.UnsupportedModelError, analysis.ModelLoadError)


def test_analysis_never_imports_streamlit():
    code = (
        "import sys, analysis, analysis.bench, analysis.attention.streaming;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('streamlit', 'plotly')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_package_docstring_example_runs():
    import doctest

    failures, tried = doctest.testmod(analysis, verbose=False)
    assert tried >= 4 and failures == 0


def test_class_probabilities_is_the_one_rule_softmax_or_sigmoid_written_out():
    """analysis.class_probabilities: softmax (exp over the sum of exps) or a sigmoid per class, by
    loops; LoadedViT.probabilities applies its model's rule; an unknown rule is a typed error."""
    import math

    import analysis
    from analysis.base.errors import AnalysisError

    logits = torch.tensor([[2.0, -1.0, 0.5], [0.0, 3.0, -2.0]])
    for row in range(2):
        total = sum(math.exp(float(v)) for v in logits[row])
        for c in range(3):
            soft = math.exp(float(logits[row, c])) / total
            assert abs(float(analysis.class_probabilities(logits)[row, c]) - soft) < 1e-6
            sig = 1 / (1 + math.exp(-float(logits[row, c])))
            assert abs(float(analysis.class_probabilities(logits, "sigmoid")[row, c]) - sig) < 1e-6
    vit = analysis.load_vit("demo")
    assert vit.probability_rule == "softmax"
    assert torch.equal(vit.probabilities(logits), analysis.class_probabilities(logits))
    with pytest.raises(AnalysisError, match="Unknown probability rule 'tanh'"):
        analysis.class_probabilities(logits, "tanh")


def test_top_classes_ranks_by_an_explicit_selection_ties_in_class_order():
    """analysis.top_classes against a written-out selection: repeatedly take the highest remaining
    score, the lowest class index among equals; class_label names or numbers a class."""
    import analysis
    from analysis.base.errors import AnalysisError

    def by_hand(scores, k):
        left, picked = list(range(len(scores))), []
        while left and len(picked) < k:
            best = left[0]
            for c in left[1:]:
                if scores[c] > scores[best]:
                    best = c
            picked.append(best)
            left.remove(best)
        return picked

    generator = torch.Generator().manual_seed(0)
    for scores in (
        torch.rand(12, generator=generator),
        torch.tensor([0.2, 0.5, 0.2, 0.5, 0.1]),  # ties: the lower class first
        torch.randint(0, 3, (9,), generator=generator).float(),
    ):
        values = [float(v) for v in scores]
        for k in (0, 1, 3, len(values)):
            assert analysis.top_classes(scores, k) == by_hand(values, k)
            assert analysis.top_classes(scores.numpy(), k) == by_hand(values, k)
        assert analysis.top_classes(values) == by_hand(values, len(values))
    assert analysis.top_classes(torch.tensor([0.2, 0.5, 0.2, 0.5, 0.1]), 3) == [1, 3, 0]
    assert analysis.class_label(["cat", "dog"], 1) == "dog"
    assert analysis.class_label(None, 7) == analysis.class_label([], 7) == "class 7"
    with pytest.raises(AnalysisError, match=r"shape \(classes,\)"):
        analysis.top_classes(torch.zeros(2, 3), 1)
    with pytest.raises(AnalysisError, match="at least 0"):
        analysis.top_classes(torch.zeros(3), -1)


def test_top1_is_each_images_argmax_one_at_a_time_for_a_vit_and_a_cnn():
    """LoadedModel.top1 in batches equals a per-image forward's argmax, for PIL and uint8 images."""
    import numpy as np
    from PIL import Image

    import analysis
    from analysis.demo.data import render_sample
    from analysis.robustness import load_cnn

    arrays = [render_sample(7, i)[0] for i in range(5)]
    for model in (analysis.load_vit("demo"), load_cnn("demo")):
        by_hand = []
        for array in arrays:
            with torch.no_grad():
                logits = model.model(model.preprocess(Image.fromarray(array)))
            by_hand.append(int(logits.argmax(-1)[0]))
        assert model.top1([Image.fromarray(a) for a in arrays], batch_size=2).tolist() == by_hand
        assert model.top1(arrays).tolist() == by_hand and model.top1([]).shape == (0,)
        assert model.top1(np.stack(arrays)).dtype == np.int64
