"""Pages call the library's rules instead of writing them again: the app never computes class
probabilities (``LoadedModel.probabilities``, the model's own softmax or sigmoid) or a ranking
(``analysis.top_classes``) itself. Code shown to the user (strings) is not code the app runs."""

from __future__ import annotations

import ast
from pathlib import Path

VIZAPP = Path(__file__).resolve().parents[1] / "vizapp"

# call -> the library's rule to use instead
RULES = {
    "softmax": "model.probabilities(logits) (the model's own rule)",
    "log_softmax": "model.probabilities(logits) (the model's own rule)",
    "sigmoid": "model.probabilities(logits) (the model's own rule)",
    "argsort": "analysis.top_classes(scores, k)",
    "topk": "analysis.top_classes(scores, k)",
}


def rules_written_again(root: Path) -> list[str]:
    """``path:line call`` of every call of a rule the library owns, in the modules under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in RULES:
                found.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {name}")
    return found


def test_the_app_calls_the_librarys_probability_and_ranking_rules():
    found = rules_written_again(VIZAPP)
    assert found == [], "use " + "; ".join(f"{name}: {RULES[name.split()[-1]]}" for name in found)


def test_the_guard_sees_a_rule_written_again_but_not_one_shown_as_code(tmp_path):
    (tmp_path / "views").mkdir()
    (tmp_path / "views" / "page.py").write_text(
        "import numpy as np\n"
        "order = np.argsort(-values)\n"
        "snippet = 'probabilities = logits.softmax(-1)'\n"
        "p = torch.softmax(logits, -1)\n"
    )
    assert rules_written_again(tmp_path) == ["views/page.py:2 argsort", "views/page.py:4 softmax"]
