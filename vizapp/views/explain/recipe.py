"""The Why this class? page's "Reproduce in Python": the public ``analysis`` calls that recompute what it
shows, ending with its arrays under the names of its ``.npz`` download (:mod:`vizapp.python_snippet`)."""

from __future__ import annotations

from collections.abc import Sequence

from vizapp.python_snippet import Source, forward_lines, script

__all__ = ["explain_code"]


def explain_code(
    source: Source,
    *,
    methods: Sequence[str],
    targets: Sequence[int | None],
    class_specific: Sequence[str],
    options: dict[str, tuple] | None = None,
) -> str:
    """The "Why this class?" page: ``explanations``, a dict of ``(gh, gw)`` maps keyed like the
    page's download (``<method>_class<c>`` for class-specific methods, else ``<method>``)."""
    options = options or {}
    lines = [*forward_lines(source, record=False), "", "explanations = {}"]
    for target in targets:
        for method in methods:
            specific = target is not None and method in class_specific
            name = f"{method}_class{target}" if target is not None else method
            args = [f"method={method!r}"]
            if specific and target is not None:
                args.insert(0, f"target={int(target)}")
            args += [f"{k}={v!r}" for k, v in options.get(method, ())]
            lines.append(f"explanations[{name!r}] = analysis.explain(vit, pixels, {', '.join(args)})[0].numpy()")
    lines.append("# each (gh, gw); the page draws each map divided by its largest |value|, negatives as 0")
    return script(lines)
