"""Held-out evaluation of the bundled demo ViT (or any model trained on the demo scenes).

Usage::

    python -m analysis.demo.evaluate                    # assets/demo_vit, 2000 scenes, seed 2026
    python -m analysis.demo.evaluate --model /tmp/vit --n 500 --seed 7
    python -m analysis.demo.evaluate --compare          # accuracy of the demo ViT, Swin and CNN
    python -m analysis.demo.evaluate --cues             # plain/textured/texture-only, with the textured variants

Everything goes through the public analysis API (``load_vit``, ``capture_attention``,
``attention_rollout``, ``position_embedding_similarity``), so this also checks that the
API reads the shipped folder correctly. Scenes come from
:func:`analysis.demo.data.generate_samples` with a seed no training run used
(the demo ViT's two phases draw their data pools from seeds 0 and 3 and their
progress-only validation sets from seeds 1 and 4, the demo CNN 10 and 11, the demo Swin
20 and 21, their textured variants 30 to 33; the default here is 2026, the tests use 777).

``--compare`` scores only the accuracy, of the three bundled demo models on the same scenes
(:func:`demo_accuracies`): rollout and the position-embedding metrics are ViT-only (the Swin
has relative-position biases and patch merging, the CNN no attention at all).

Metrics
-------
accuracy
    Share of samples whose arg-max logit is the true class.
locality gap
    From the cosine similarities of the learned patch position embeddings
    (``position_embedding_similarity``, shape ``(gh, gw, gh, gw)``): the mean similarity
    over ordered pairs of **4-neighbour** patches (grid Manhattan distance exactly 1)
    minus the mean similarity over ordered pairs that are **at least half the grid
    apart**, meaning Chebyshev distance ``max(|dy|, |dx|) >= max(gh, gw) / 2`` (for the
    8x8 grid of the demo model: 4 or more rows or columns apart). A random,
    position-agnostic embedding scores about 0; a local one scores clearly above 0.
pointing game
    For each **correctly classified** sample, the peak patch of the attention rollout
    (``head_fusion="mean"``, ``discard_ratio=0``) is a hit if the patch overlaps the object,
    where "overlaps" means at least one object-mask pixel lies inside that patch's
    ``ph x pw`` pixel square (:func:`analysis.faithfulness.patch_mask`). Ties between peak
    patches are split as a fraction (:func:`analysis.faithfulness.pointing_score`, the same
    rule as the faithfulness benchmark). The score is the mean over correct samples.
chance
    The pointing game of a uniformly random patch on the same (correctly classified)
    samples: the mean over samples of (patches overlapping the object / all patches).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from analysis.demo.data import CLASS_NAMES, generate_samples

__all__ = [
    "DEFAULT_EVAL_SEED",
    "locality_gap",
    "evaluate",
    "accuracy",
    "demo_accuracies",
    "cue_accuracies",
    "demo_cue_accuracies",
    "main",
]

DEFAULT_EVAL_SEED = 2026


def locality_gap(vit) -> float:
    """Neighbour-minus-far cosine similarity of the position embeddings (see the module docstring):
    the mean similarity of 4-neighbour patches minus that of pairs at least half the grid apart.

    Parameters
    ----------
    vit : LoadedViT
        The model (:func:`analysis.load_vit`), with a learned position table or rotary embeddings
        (what ``position_embedding_similarity`` reads).

    Returns
    -------
    float
        The gap: about 0 for a position-agnostic embedding, clearly above 0 for a local one.

    Raises
    ------
    AnalysisError
        As ``position_embedding_similarity``: a model without position encodings to compare.
    """
    from analysis import position_embedding_similarity

    return similarity_locality_gap(torch.as_tensor(position_embedding_similarity(vit)).float())


def similarity_locality_gap(sim: torch.Tensor) -> float:
    """Mean similarity of 4-neighbours minus that of pairs ≥ half the grid apart; ``sim (gh, gw, gh, gw)``."""
    gh, gw = sim.shape[:2]
    yy, xx = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    yy, xx = yy.reshape(-1), xx.reshape(-1)
    dy = (yy[:, None] - yy[None, :]).abs().view(gh, gw, gh, gw)
    dx = (xx[:, None] - xx[None, :]).abs().view(gh, gw, gh, gw)
    near = (dy + dx) == 1
    far = torch.maximum(dy, dx) >= max(gh, gw) / 2
    return float(sim[near].mean() - sim[far].mean())


@torch.no_grad()
def evaluate(vit, n: int = 2000, seed: int = DEFAULT_EVAL_SEED, *, batch_size: int = 250) -> dict:
    """Accuracy, locality gap, rollout pointing game and its chance level on ``n`` fresh
    scenes from ``seed`` (the metrics of the module docstring).

    Parameters
    ----------
    vit : LoadedViT
        What :func:`analysis.load_vit` returns, trained on the demo classes; the scenes are drawn at
        its ``spec.img_size``.
    n : int, default 2000
        Number of scenes.
    seed : int, default DEFAULT_EVAL_SEED
        The scenes' stream (2026; no training run used it).
    batch_size : int, default 250
        Scenes per forward pass.

    Returns
    -------
    dict
        ``n``, ``seed``, ``accuracy``, ``locality_gap``, ``pointing_game`` and ``pointing_chance``
        (over the correctly classified scenes; NaN when there are none), ``pointing_game_all`` (over
        every scene), ``n_correct`` and ``per_class_accuracy`` (class name -> accuracy, NaN for a
        class that has no scene).

    Raises
    ------
    AnalysisError
        A model without position encodings (:func:`locality_gap`) or whose attention rollout
        cannot be captured.
    """
    from analysis import attention_rollout, capture_attention
    from analysis.faithfulness import patch_mask, pointing_score

    spec = vit.spec
    size = int(spec.img_size[0])
    images, labels, masks = generate_samples(n, seed, size=size)
    labels_t = torch.tensor(labels)
    overlap = patch_mask(masks, spec.patch_size, spec.grid_size)  # (n, gh, gw)

    preds, hits = [], []
    for i in range(0, n, batch_size):
        pixels = torch.cat([vit.preprocess(im) for im in images[i : i + batch_size]], dim=0)
        record = capture_attention(vit, pixels)
        preds.append(torch.as_tensor(record.logits).argmax(dim=-1))
        rollout = attention_rollout(record, head_fusion="mean", discard_ratio=0.0)
        hits.append(pointing_score(rollout, overlap[i : i + batch_size]))  # (batch,) in [0, 1]
    pred = torch.cat(preds)
    hit = np.concatenate(hits)
    correct = (pred == labels_t).numpy()
    n_correct = int(correct.sum())
    share = overlap.reshape(n, -1).mean(axis=1)
    return {
        "n": n,
        "seed": seed,
        "accuracy": float(correct.mean()),
        "locality_gap": locality_gap(vit),
        "pointing_game": float(hit[correct].mean()) if n_correct else float("nan"),
        "pointing_chance": float(share[correct].mean()) if n_correct else float("nan"),
        "pointing_game_all": float(hit.mean()),
        "n_correct": n_correct,
        "per_class_accuracy": {
            name: float(correct[np.asarray(labels) == k].mean()) if (np.asarray(labels) == k).any() else float("nan")
            for k, name in enumerate(CLASS_NAMES)
        },
    }


@torch.no_grad()
def accuracy(model, n: int = 2000, seed: int = DEFAULT_EVAL_SEED, *, batch_size: int = 250) -> float:
    """Share of ``n`` fresh scenes of ``seed`` whose arg-max logit is the true class.

    Parameters
    ----------
    model : LoadedModel
        What :func:`analysis.load_vit` or :func:`analysis.robustness.load_cnn` returns, trained on
        the demo classes: it is fed through its own ``preprocess``, as the app feeds it. The scenes
        are drawn at the default size (48 px).
    n : int, default 2000
        Number of scenes.
    seed : int, default DEFAULT_EVAL_SEED
        The scenes' stream.
    batch_size : int, default 250
        Scenes per forward pass.

    Returns
    -------
    float
        The accuracy, in ``[0, 1]``.
    """
    images, labels, _ = generate_samples(n, seed)
    correct = 0
    for i in range(0, n, batch_size):
        pixels = torch.cat([model.preprocess(im) for im in images[i : i + batch_size]], dim=0)
        logits = model.model(pixels.to(model.device))
        correct += int((logits.argmax(-1).cpu() == torch.tensor(labels[i : i + batch_size])).sum())
    return correct / n


def demo_accuracies(n: int = 2000, seed: int = DEFAULT_EVAL_SEED) -> dict[str, float]:
    """:func:`accuracy` of the bundled demo ViT, Swin and CNN on the same ``n`` scenes of ``seed``.

    Parameters
    ----------
    n : int, default 2000
        Number of scenes.
    seed : int, default DEFAULT_EVAL_SEED
        The scenes' stream.

    Returns
    -------
    dict of str to float
        ``"demo ViT"``, ``"demo Swin"``, ``"demo CNN"`` -> accuracy.
    """
    from analysis import load_vit
    from analysis.robustness import load_cnn

    models = {
        "demo ViT": load_vit("demo", device="cpu"),
        "demo Swin": load_vit("demo_swin", device="cpu"),
        "demo CNN": load_cnn("demo", device="cpu"),
    }
    return {name: accuracy(model, n, seed) for name, model in models.items()}


def cue_accuracies(model, n: int = 2000, seed: int = DEFAULT_EVAL_SEED) -> dict[str, float]:
    """Which cues ``model`` (what :func:`analysis.load_vit` or :func:`analysis.robustness.load_cnn`
    returns, of the demo classes) reads, as three top-1 accuracies over ``n`` images of stream ``seed``
    each, through :meth:`~analysis.model.loading.loaded.LoadedModel.top1`:

    * ``plain``: the demo scenes (:func:`analysis.demo.data.generate_samples`): a flat-coloured object;
    * ``textured``: scenes whose object is filled with its own class's texture
      (:func:`analysis.demo.cue_conflict.textured_scenes`): shape and texture agree;
    * ``texture_only``: the whole frame one class's texture, no object
      (:func:`analysis.demo.cue_conflict.texture_swatches`): chance is ``1 / 6``; above it, the model
      reads texture.

    Parameters
    ----------
    model : LoadedModel
        What :func:`analysis.load_vit` or :func:`analysis.robustness.load_cnn` returns, of the demo
        classes.
    n : int, default 2000
        Number of images of each kind.
    seed : int, default DEFAULT_EVAL_SEED
        The stream of every kind.

    Returns
    -------
    dict of str to float
        ``"plain"``, ``"textured"`` (scored against the shape's class) and ``"texture_only"`` ->
        accuracy.
    """
    from analysis.demo.cue_conflict import texture_swatches, textured_scenes

    images, labels, _ = generate_samples(n, seed)
    textured = textured_scenes(n, seed)
    swatches = texture_swatches(n, seed)

    def hit_rate(pictures, truth) -> float:
        return float((model.top1(pictures, batch_size=250) == np.asarray(truth)).mean())

    return {
        "plain": hit_rate(images, labels),
        "textured": hit_rate([s.image for s in textured], [s.shape_class for s in textured]),
        "texture_only": hit_rate([s.image for s in swatches], [s.texture_class for s in swatches]),
    }


def demo_cue_accuracies(n: int = 2000, seed: int = DEFAULT_EVAL_SEED) -> dict[str, dict[str, float]]:
    """:func:`cue_accuracies` of the bundled demo ViT, Swin and CNN and of their textured variants, on
    the same images.

    Parameters
    ----------
    n : int, default 2000
        Number of images of each kind.
    seed : int, default DEFAULT_EVAL_SEED
        The stream of every kind.

    Returns
    -------
    dict of str to dict of str to float
        Model name (``"demo ViT"``, ``"demo ViT, textured"``, ``"demo Swin"``, ...) -> its
        :func:`cue_accuracies`.
    """
    from analysis import load_vit
    from analysis.robustness import load_cnn

    loaders = {
        "demo ViT": lambda: load_vit("demo", device="cpu"),
        "demo ViT, textured": lambda: load_vit("demo_textured", device="cpu"),
        "demo Swin": lambda: load_vit("demo_swin", device="cpu"),
        "demo Swin, textured": lambda: load_vit("demo_swin_textured", device="cpu"),
        "demo CNN": lambda: load_cnn("demo", device="cpu"),
        "demo CNN, textured": lambda: load_cnn("demo_textured", device="cpu"),
    }
    return {name: cue_accuracies(load(), n, seed) for name, load in loaders.items()}


def main(argv: list[str] | None = None) -> int:
    """The command line (``python -m analysis.demo.evaluate``, usage in the module docstring): prints the
    metrics of :func:`evaluate`, or with ``--compare`` :func:`demo_accuracies`, or with ``--cues``
    :func:`demo_cue_accuracies`, as text or (``--json``) as JSON.

    Parameters
    ----------
    argv : list of str or None, default None
        The arguments; ``None`` reads ``sys.argv``.

    Returns
    -------
    int
        The exit status, 0.
    """
    p = argparse.ArgumentParser(
        prog="python -m analysis.demo.evaluate", description="Evaluate the demo models on held-out procedural scenes."
    )
    p.add_argument("--model", default="demo", help='"demo" (the bundled model) or a timm hub-layout folder')
    p.add_argument("--n", type=int, default=2000, help="number of fresh scenes")
    p.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_EVAL_SEED,
        help="scene seed (training used 0, 1, 3, 4, 10, 11, 20, 21, 30-33)",
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true", help="print the result as JSON only")
    p.add_argument(
        "--compare",
        action="store_true",
        help="only the accuracy of the three bundled demo models (ViT, Swin, CNN) on the same scenes",
    )
    p.add_argument(
        "--cues",
        action="store_true",
        help="only the plain, textured and texture-only accuracy of the three bundled demo models and of "
        "their variants trained on textured scenes (the same images)",
    )
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    from analysis import load_vit

    if a.cues:
        table = demo_cue_accuracies(a.n, a.seed)
        if a.json:
            print(json.dumps({"n": a.n, "seed": a.seed, "accuracy": table}, indent=2))
            return 0
        print(f"{a.n} images of each kind (seed {a.seed})  plain  textured  texture only")
        for name, scores in table.items():
            print(f"{name:<22} {scores['plain']:.4f}  {scores['textured']:.4f}    {scores['texture_only']:.4f}")
        return 0

    if a.compare:
        t0 = time.time()
        scores = demo_accuracies(a.n, a.seed)
        if a.json:
            print(json.dumps({"n": a.n, "seed": a.seed, "accuracy": scores}, indent=2))
            return 0
        print(f"scenes           : {a.n} (seed {a.seed})")
        for name, score in scores.items():
            print(f"accuracy, {name:<9}: {score:.4f}")
        print(f"time             : {time.time() - t0:.1f} s")
        return 0

    t0 = time.time()
    vit = load_vit(a.model)
    res = evaluate(vit, a.n, a.seed)
    res["eval_s"] = round(time.time() - t0, 1)
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"model            : {a.model}")
    print(f"scenes           : {res['n']} (seed {res['seed']})")
    print(f"accuracy         : {res['accuracy']:.4f}")
    print(f"locality gap     : {res['locality_gap']:.4f}  (4-neighbours minus Chebyshev >= grid/2)")
    print(
        f"pointing game    : {res['pointing_game']:.4f}  on {res['n_correct']} correct predictions "
        f"(chance {res['pointing_chance']:.4f}; all samples {res['pointing_game_all']:.4f})"
    )
    print("per-class acc    : " + ", ".join(f"{k} {v:.3f}" for k, v in res["per_class_accuracy"].items()))
    print(f"time             : {res['eval_s']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
