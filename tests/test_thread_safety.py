"""Thread safety as a tested guarantee: one loaded model serves every thread.

Every public analysis runs from 8 threads at once on ONE shared model per family (a
``threading.Barrier`` releases them together, and each thread walks the analyses in its own
rotated order, so different analyses overlap: a capture runs while another thread's rotary
read, explanation or intervention has its hooks on the same modules). Each result must equal
the serial run's bit for bit (``torch.equal``): a hook that reacted to another thread's
forward, a hook left behind, or a shared buffer written by two calls shows as a difference
or an exception.

Models: the suite's smallest ones (a 3-block ``vit_tiny`` at 64 px, the 2-block DINOv3 of
``tests/families.py``, the bundled demo CLIP and demo MAE).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
import torch

from analysis import (
    attention_mass,
    attention_rollout,
    capture_attention,
    capture_tokens,
    dataset_attention_distance,
    explain,
    feature_pca,
    high_norm_tokens,
    logit_lens,
    mean_attention_distance,
    patch_similarity,
    position_embedding_similarity,
    rotary_position_features,
    token_norms,
)
from analysis.circuits import activation_patching, dataset_head_effects, direct_logit_attribution, head_ablation
from analysis.engine.activations import run_with_cache, run_with_hooks
from analysis.faithfulness import perturbation_curve
from analysis.robustness import patch_drop_indices
from analysis.robustness.dropped import token_drop_attention
from conftest import make_vit, random_pixels
from families import family_pixels, load_family

THREADS = 8
ROUNDS = 2  # each thread walks every analysis this many times
SWITCH_INTERVAL = 1e-5  # seconds between the interpreter's thread switches (default 5e-3)

Task = Callable[[int], object]  # input index -> result (tensors, dataclasses, tuples, dicts)


def _same(expected, got, where: str = "result") -> None:
    """``expected`` and ``got`` equal bit for bit, recursing through containers and dataclasses."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        assert expected.dtype == got.dtype and expected.shape == got.shape, where
        assert torch.equal(expected, got) or (
            expected.is_floating_point()
            and torch.equal(expected.isnan(), got.isnan())
            and torch.equal(expected.nan_to_num(), got.nan_to_num())
        ), f"{where} differs"
    elif isinstance(expected, np.ndarray):
        np.testing.assert_array_equal(expected, got, err_msg=where)
    elif dataclasses.is_dataclass(expected) and not isinstance(expected, type):
        assert type(expected) is type(got), where
        for field in dataclasses.fields(expected):
            _same(getattr(expected, field.name), getattr(got, field.name), f"{where}.{field.name}")
    elif isinstance(expected, dict):
        assert expected.keys() == got.keys(), where
        for key in expected:
            _same(expected[key], got[key], f"{where}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(expected) == len(got), where
        for index, (a, b) in enumerate(zip(expected, got)):
            _same(a, b, f"{where}[{index}]")
    else:
        assert expected == got, f"{where}: {expected!r} != {got!r}"


def _run_concurrently(tasks: dict[str, Task]) -> None:
    """Serial results first; then 8 threads released together by a barrier, thread ``t`` running
    the tasks in the order rotated by ``t`` on input ``t % 2`` (so the same analysis runs on two
    inputs at once too), ``ROUNDS`` times; every result equal to the serial one."""
    names = list(tasks)
    expected = {(name, index): tasks[name](index) for name in names for index in range(2)}
    barrier = threading.Barrier(THREADS)
    failures: list[str] = []
    done: list[int] = []

    def work(thread: int) -> None:
        index = thread % 2
        order = names[thread % len(names) :] + names[: thread % len(names)]
        try:
            barrier.wait()
            for _ in range(ROUNDS):
                for name in order:
                    try:
                        _same(expected[(name, index)], tasks[name](index), name)
                    except BaseException as exc:  # noqa: BLE001 - collected and reported below
                        failures.append(f"thread {thread}, {name}: {exc!r}")
            done.append(thread)
        except threading.BrokenBarrierError as exc:
            failures.append(f"thread {thread}: {exc!r}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL)  # threads change hands often: short race windows get hit
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not failures, "\n".join(failures[:20])
    assert sorted(done) == list(range(THREADS))


def _no_hooks_left(model: torch.nn.Module) -> None:
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules()) == 0
    assert torch._C._len_torch_function_stack() == 0


@pytest.fixture(scope="module")
def vit():
    return make_vit("class_token")  # vit_tiny, 3 blocks, 64 px: a 4x4 grid, one class token


@pytest.fixture(scope="module")
def rope_vit():
    return load_family("rope_reg1_gap")  # rotary positions, one register, a class head, 2 blocks


def test_every_vit_analysis_from_8_threads_on_one_model_equals_the_serial_run(vit):
    inputs = [random_pixels(vit, batch=1, seed=seed) for seed in (1, 2)]
    spec = vit.spec

    def zero_head(z):  # (B, T, heads, d)
        z = z.clone()
        z[:, :, 1] = 0
        return z

    from PIL import Image

    images = [Image.fromarray(vit.preprocessing.to_image(random_pixels(vit, batch=1, seed=s)[0])) for s in (3, 4, 5)]
    dropped = patch_drop_indices(spec, 0.5, seed=0)
    tasks: dict[str, Task] = {
        "capture_attention": lambda i: capture_attention(vit, inputs[i]).attentions,
        "run_with_cache": lambda i: dict(
            run_with_cache(
                vit, inputs[i], ["blocks.1.resid_pre", "blocks.1.attn.probs", "blocks.2.attn.z", "blocks.2.mlp.out"]
            ).items()
        ),
        "run_with_hooks": lambda i: run_with_hooks(vit, inputs[i], {"blocks.1.attn.z": zero_head}),
        "rollout": lambda i: attention_rollout(capture_attention(vit, inputs[i])),
        "attention_distance": lambda i: mean_attention_distance(capture_attention(vit, inputs[i])),
        "dataset_attention_distance": lambda i: dataset_attention_distance(
            vit, images[i : i + 2], batch_size=2, workers=1
        ),
        "chefer": lambda i: explain(vit, inputs[i], method="chefer"),
        "gradcam": lambda i: explain(vit, inputs[i], method="gradcam"),
        "input_x_gradient": lambda i: explain(vit, inputs[i], method="input_x_gradient"),
        "integrated_gradients": lambda i: explain(vit, inputs[i], method="integrated_gradients", steps=4),
        "head_ablation": lambda i: head_ablation(vit, inputs[i]),
        "activation_patching": lambda i: activation_patching(vit, inputs[i], inputs[1 - i], layers=[1]),
        "direct_logit_attribution": lambda i: direct_logit_attribution(vit, inputs[i]),
        "token_norms": lambda i: token_norms(capture_tokens(vit, inputs[i])),
        "high_norm_tokens": lambda i: high_norm_tokens(
            token_norms(capture_tokens(vit, inputs[i])), spec.num_prefix_tokens, min_ratio=1.01
        ),
        "token_drop": lambda i: token_drop_attention(vit, inputs[i], dropped),
        "attention_map_rollout_explain": lambda i: (
            explain(vit, inputs[i], method="attention"),
            explain(vit, inputs[i], method="rollout"),
        ),
        "logit_lens": lambda i: logit_lens(vit, inputs[i]),
        "attention_mass": lambda i: attention_mass(capture_attention(vit, inputs[i]), [0]),
        "feature_pca_similarity": lambda i: (
            feature_pca(capture_tokens(vit, inputs[i], layers=[2]).tokens[0], spec),
            patch_similarity(capture_tokens(vit, inputs[i], layers=[2]).tokens[0], spec, 3),
        ),
        "dataset_head_effects": lambda i: dataset_head_effects(vit, images[i : i + 2], batch_size=2, workers=1),
        "perturbation_curve": lambda i: perturbation_curve(
            vit, inputs[i], explain(vit, inputs[i], method="rollout")[0], target=3, steps=4
        ),
    }
    _run_concurrently(tasks)
    _no_hooks_left(vit.model)


def test_rotary_features_and_captures_from_8_threads_on_one_rope_model_equal_the_serial_run(rope_vit):
    """The rotary read stops its own forward at a block of the shared model; captures,
    interventions and explanations of other threads run through those blocks meanwhile."""
    inputs = [family_pixels("rope_reg1_gap", batch=1, seed=seed) for seed in (1, 2)]
    tasks: dict[str, Task] = {
        "rope_similarity": lambda i: position_embedding_similarity(rope_vit, kind="rope"),
        "rotary_features_layer_1": lambda i: rotary_position_features(rope_vit, layer=1),
        "capture_attention": lambda i: capture_attention(rope_vit, inputs[i]).attentions,
        "run_with_cache": lambda i: dict(
            run_with_cache(rope_vit, inputs[i], ["blocks.0.attn.q", "blocks.1.resid_post"]).items()
        ),
        "rollout": lambda i: attention_rollout(capture_attention(rope_vit, inputs[i])),
        "chefer": lambda i: explain(rope_vit, inputs[i], method="chefer"),
        "input_x_gradient": lambda i: explain(rope_vit, inputs[i], method="input_x_gradient"),
    }
    _run_concurrently(tasks)
    _no_hooks_left(rope_vit.model)


def test_windowed_analyses_from_8_threads_on_the_demo_swin_equal_the_serial_run():
    """A windowed, hierarchical model (the bundled demo Swin): every map per window and stage."""
    from analysis import load_vit, rollout_maps

    swin = load_vit("demo_swin", device="cpu")
    height, width = swin.spec.img_size
    inputs = [torch.randn(1, 3, height, width, generator=torch.Generator().manual_seed(seed)) for seed in (1, 2)]
    tasks: dict[str, Task] = {
        "capture_attention": lambda i: capture_attention(swin, inputs[i]).windows,
        "rollout_maps": lambda i: rollout_maps(capture_attention(swin, inputs[i]), stage=1),
        "attention_distance": lambda i: mean_attention_distance(capture_attention(swin, inputs[i])),
        "run_with_cache": lambda i: dict(
            run_with_cache(swin, inputs[i], ["blocks.0.resid_post", "blocks.3.attn.probs"]).items()
        ),
        "gradcam": lambda i: explain(swin, inputs[i], method="gradcam"),
        "rollout_map": lambda i: explain(swin, inputs[i], method="rollout", stage=0),
        "token_norms": lambda i: [token_norms(tokens) for tokens in capture_tokens(swin, inputs[i]).tokens],
    }
    _run_concurrently(tasks)
    _no_hooks_left(swin.model)


@pytest.fixture(scope="module")
def clip():
    from analysis import load_clip

    return load_clip("demo_clip", device="cpu")


def test_text_analyses_from_8_threads_on_the_demo_clip_equal_the_serial_run(clip):
    from analysis.text import explain_text, text_decomposition, zero_shot

    height, width = clip.image.spec.img_size
    inputs = [torch.randn(1, 3, height, width, generator=torch.Generator().manual_seed(seed)) for seed in (1, 2)]
    prompts = ["a red star", "a blue circle", "a green square"]
    tasks: dict[str, Task] = {
        "zero_shot": lambda i: zero_shot(clip, inputs[i], prompts),
        "explain_text_chefer": lambda i: explain_text(clip, inputs[i], prompts[i]),
        "explain_text_legrad": lambda i: explain_text(clip, inputs[i], prompts[i], method="legrad"),
        "explain_text_gradcam": lambda i: explain_text(clip, inputs[i], prompts[i], method="gradcam"),
        "text_decomposition": lambda i: text_decomposition(clip, inputs[i], prompts[1 - i]),
        "image_capture": lambda i: capture_attention(clip.image, inputs[i]).attentions,
    }
    _run_concurrently(tasks)
    _no_hooks_left(clip.image.model)


@pytest.fixture(scope="module")
def mae():
    pytest.importorskip("transformers")
    from analysis.mae import load_mae

    return load_mae("demo_mae", device="cpu")


def test_mae_reconstruction_and_visible_attention_from_8_threads_equal_the_serial_run(mae):
    from analysis.mae import mae_reconstruct, visible_attention_distance, visible_rollout

    height, width = mae.spec.img_size
    inputs = [torch.randn(1, 3, height, width, generator=torch.Generator().manual_seed(seed)) for seed in (1, 2)]
    tasks: dict[str, Task] = {
        "reconstruct": lambda i: mae_reconstruct(mae, inputs[i], mask_ratio=0.75, seed=i),
        "reconstruct_other_ratio": lambda i: mae_reconstruct(mae, inputs[i], mask_ratio=0.5, seed=10 + i),
        "visible_attention_distance": lambda i: visible_attention_distance(
            mae_reconstruct(mae, inputs[i], mask_ratio=0.75, seed=i).attention
        ),
        "visible_rollout": lambda i: visible_rollout(mae_reconstruct(mae, inputs[i], mask_ratio=0.6, seed=i).attention),
    }
    _run_concurrently(tasks)
    _no_hooks_left(mae.model)


def _call_as_another_thread_in_the_race(model: torch.nn.Module, sample: torch.Tensor) -> list:
    """Every pre-hook on ``model``, called from another thread as PyTorch calls a keyword
    pre-hook while it is being added or removed: ``hook(module, args)``, without kwargs."""
    results: list = []

    def other() -> None:
        try:
            for module in model.modules():
                for hook in list(module._forward_pre_hooks.values()):
                    results.append(hook(module, (sample,)))
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            results.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    return results


def test_keyword_pre_hooks_leave_another_threads_forward_alone_while_being_added_or_removed(vit, rope_vit):
    """PyTorch adds a ``with_kwargs`` pre-hook in two steps (the hook, then its "with kwargs"
    flag) and removes it in two; a forward on another thread in between calls it as
    ``hook(module, args)`` (seen in the 8-thread test as a TypeError inside activation
    patching). The engine's keyword pre-hooks (``resid_pre``, ``attn.in``, ``attn.rope``) accept that call
    and return None for another thread."""
    from analysis.engine.activations.run import hooks_around

    pixels = random_pixels(vit, batch=1, seed=3)
    seen: list = []

    def spy(value):
        seen.extend(_call_as_another_thread_in_the_race(vit.model, value))

    run_with_hooks(
        vit,
        pixels,
        {"blocks.1.resid_pre": lambda x: None, "blocks.1.attn.in": lambda x: None, "blocks.2.resid_post": spy},
    )
    assert seen and all(result is None for result in seen), seen
    seen.clear()
    with torch.no_grad(), hooks_around(rope_vit.model, {"blocks.1.attn.rope": lambda rope: None}):
        seen.extend(_call_as_another_thread_in_the_race(rope_vit.model, family_pixels("rope_reg1_gap", batch=1)))
    assert seen and all(result is None for result in seen), seen
    _no_hooks_left(vit.model)
    _no_hooks_left(rope_vit.model)


class _Stop(Exception):
    pass


def _raise_while_others_add_and_remove_hooks(add_pre, add_post, seconds: float = 2.0) -> list[str]:
    """One thread runs a module whose forward raises (its own pre-hook stops it, as a read that
    stops early does), over and over before it removes that hook; two threads add and remove
    forward hooks on that module meanwhile. torch walks the module's forward hooks in Python on
    the way out of a raising forward. (With the hold, the other threads wait from the first raise
    until the hook is removed.)"""
    module = torch.nn.Linear(4, 4)
    errors: list[str] = []
    finished: list[bool] = []

    def stopping() -> None:
        owner = threading.get_ident()

        def stop(mod, args):
            if threading.get_ident() == owner:
                raise _Stop

        handle = add_pre(module, stop)
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                try:
                    module(torch.zeros(1, 4))
                except _Stop:
                    pass
                except Exception as exc:  # noqa: BLE001 - the race under test
                    errors.append(repr(exc))
                    return
        finally:
            handle.remove()
            finished.append(True)

    def churning() -> None:
        while not finished:
            handles = [add_post(module, lambda mod, args, output: None) for _ in range(5)]
            for handle in handles:
                handle.remove()

    threads = [threading.Thread(target=stopping), threading.Thread(target=churning), threading.Thread(target=churning)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert len(module._forward_hooks) == len(module._forward_pre_hooks) == 0
    return errors


def test_a_forward_that_raises_keeps_its_exception_while_other_threads_add_and_remove_hooks():
    """The engine's hooks hold one lock while their exception leaves the model
    (analysis.base.module_hooks): the raising forward sees its own exception, never ``RuntimeError:
    OrderedDict mutated during iteration`` (which failed the 8-thread rotary test in CI: the
    rotary read stops its forward at a block other threads hook). Without the hold (the hook's
    wrapper not taking the lock) this loop raised that error (run by hand)."""
    from analysis.base.module_hooks import add_forward_hook, add_forward_pre_hook

    assert _raise_while_others_add_and_remove_hooks(add_forward_pre_hook, add_forward_hook) == []


def test_a_users_torch_hooks_come_off_with_their_own_handles_around_the_engines(vit):
    """The engine registers with torch's own registration, in place: a user's hook added before
    or during a capture comes off with its RemovableHandle (a copy-on-write registration once left
    it behind on the module, in CI)."""
    from analysis.base.module_hooks import add_forward_hook

    block = vit.model.blocks[0]
    before = block.register_forward_hook(lambda module, args, output: None)
    mine = add_forward_hook(block, lambda module, args, output: None)
    during = block.register_forward_pre_hook(lambda module, args: None)
    capture_attention(vit, random_pixels(vit, batch=1, seed=5))
    mine.remove()
    before.remove()
    during.remove()
    _no_hooks_left(vit.model)


def test_module_hooks_behave_as_torchs_registration():
    """Order, keyword arguments, always_call on a raising forward, replacement results, and a
    removal that leaves every hook dictionary as it was (twice is harmless)."""
    from analysis.base.module_hooks import add_forward_hook, add_forward_pre_hook

    module = torch.nn.Linear(3, 3)
    calls: list[str] = []
    before = {name: dict(getattr(module, name)) for name in vars(module) if "hooks" in name}
    handles = [
        add_forward_pre_hook(module, lambda mod, args: calls.append("pre") or (args[0] * 0,)),
        add_forward_pre_hook(
            module, lambda mod, args, kwargs: calls.append(f"pre-kw {sorted(kwargs)}"), with_kwargs=True
        ),
        add_forward_hook(module, lambda mod, args, output: calls.append("post") or output + 1),
        add_forward_hook(module, lambda mod, args, kwargs, output: calls.append("post-kw"), with_kwargs=True),
        add_forward_hook(module, lambda mod, args, output: calls.append("always"), always_call=True),
    ]
    out = module(torch.ones(2, 3))
    assert calls == ["pre", "pre-kw []", "post", "post-kw", "always"]
    torch.testing.assert_close(out, module.bias.expand(2, 3) + 1, rtol=0, atol=0)  # zeroed input, +1 after
    calls.clear()
    stop = add_forward_pre_hook(module, lambda mod, args: (_ for _ in ()).throw(_Stop()))
    with pytest.raises(_Stop):
        module(torch.ones(2, 3))
    assert calls == ["pre", "pre-kw []", "always"]  # torch runs always_call hooks of a raising forward
    for handle in [*handles, stop, handles[0]]:
        handle.remove()
    assert {name: dict(getattr(module, name)) for name in vars(module) if "hooks" in name} == before


def test_the_library_adds_module_hooks_only_through_module_hooks():
    """``register_forward_hook`` changes a shared module's hooks in place: the race above."""
    root = pathlib.Path(__file__).resolve().parents[1] / "analysis"
    offenders = [
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if path.name != "module_hooks.py"
        and "bench" not in path.parts  # the benchmark's own reference forward, one thread
        and re.search(r"\.register_(full_backward_|forward_)(pre_)?hook\(", path.read_text())
    ]
    assert offenders == []
