"""Every process-wide cache of the app goes through the locked record store.

One Streamlit server runs every browser session's script in its own thread, so a module-level
dict, list or set of ``vizapp`` that a function fills at run time is shared by concurrent
sessions without a lock. Such caches belong in :class:`vizapp.records.RecordStore` (locked,
bounded, each key computed once) or in Streamlit's own ``st.cache_data`` /
``st.cache_resource``. This test reads the source of every app module and fails on:

* a ``functools.lru_cache`` / ``functools.cache`` (unbounded in bytes, and not the store);
* a module-level mutable container (``{}``, ``[]``, ``set()``, ``dict(...)``,
  ``OrderedDict()``, ...) that any function of the module mutates (item assignment or
  deletion, ``.append``/``.update``/``.setdefault``/``.pop``/..., augmented assignment);
* a ``global`` statement rebinding a module-level name to something other than a
  once-per-process flag guarded by a lock (``vizapp/preload.py``'s thread handle).

The pages under ``vizapp/views`` are scripts Streamlit runs afresh each rerun: their
module-level names are the run's locals, so they are not scanned.
"""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parent.parent / "vizapp"
MUTATING_METHODS = {
    "append",
    "extend",
    "insert",
    "update",
    "setdefault",
    "pop",
    "popitem",
    "clear",
    "add",
    "discard",
    "remove",
    "move_to_end",
    "appendleft",
    "__setitem__",
}
CONTAINER_CALLS = {
    "dict",
    "list",
    "set",
    "OrderedDict",
    "defaultdict",
    "deque",
    "Counter",
    "WeakValueDictionary",
    "WeakKeyDictionary",
}
#: (module, global name) rebound at run time on purpose: once-per-process handles under a lock.
ALLOWED_GLOBALS = {("preload.py", "_started")}


def _app_modules() -> list[Path]:
    return sorted(path for path in APP.glob("*.py"))


def _module_containers(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        targets, value = [], None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        literal = isinstance(value, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp))
        called = (
            isinstance(value, ast.Call)
            and (getattr(value.func, "id", None) or getattr(value.func, "attr", None)) in CONTAINER_CALLS
        )
        if literal or called:
            names.update(target.id for target in targets if isinstance(target, ast.Name))
    return names


def _findings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    containers = _module_containers(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                text = ast.unparse(decorator)
                if "lru_cache" in text or text in ("cache", "functools.cache"):
                    found.append(f"{path.name}:{node.lineno} {node.name} is cached with {text}: use a RecordStore")
        if isinstance(node, ast.Global):
            found.extend(
                f"{path.name}:{node.lineno} rebinds global {name}"
                for name in node.names
                if (path.name, name) not in ALLOWED_GLOBALS
            )
    for function in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))):
        for node in ast.walk(function):
            target = None
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                for t in getattr(node, "targets", None) or [node.target]:
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                        target = t.value.id
                    elif isinstance(node, ast.AugAssign) and isinstance(t, ast.Name):
                        target = t.id
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
            ):
                if node.func.attr in MUTATING_METHODS:
                    target = node.func.value.id
            if target in containers and not _is_local(function, target):
                found.append(
                    f"{path.name}:{node.lineno} mutates the module-level {target} at run time: use a RecordStore"
                )
    return found


def _is_local(function, name: str) -> bool:
    """Whether ``name`` is bound inside ``function`` (an argument or an assignment): then it is
    not the module's container."""
    if isinstance(function, ast.Lambda):
        return name in {a.arg for a in function.args.args}
    arguments = function.args
    if name in {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}:
        return True
    for node in ast.walk(function):
        if isinstance(node, ast.Global) and name in node.names:
            return False
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
        if (
            isinstance(node, (ast.For, ast.comprehension))
            and isinstance(node.target, ast.Name)
            and node.target.id == name
        ):
            return True
    return False


def test_no_app_module_keeps_a_process_wide_cache_outside_the_record_store():
    findings = [finding for path in _app_modules() for finding in _findings(path)]
    assert not findings, "\n".join(findings)


def test_the_guard_sees_a_module_level_cache_filled_at_run_time(tmp_path):
    """The scan itself: a dict cache, an lru_cache and a rebound global are each found; a
    constant table and a function's own dict are not."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import functools\n"
        "TABLE = {'a': 1}\n"
        "_RESULTS = {}\n"
        "_seen: list = []\n"
        "def remember(key, value):\n"
        "    _RESULTS[key] = value\n"
        "def note(x):\n"
        "    _seen.append(x)\n"
        "def local():\n"
        "    _RESULTS = {}\n"
        "    _RESULTS['k'] = 1\n"
        "    return TABLE['a']\n"
        "@functools.lru_cache(maxsize=8)\n"
        "def slow(x):\n"
        "    return x\n"
        "_count = 0\n"
        "def bump():\n"
        "    global _count\n"
        "    _count += 1\n"
    )
    findings = _findings(sample)
    assert any("_RESULTS" in f and ":6 " in f for f in findings), findings
    assert any("_seen" in f for f in findings), findings
    assert any("lru_cache" in f for f in findings), findings
    assert any("global _count" in f for f in findings), findings
    assert not any(":11 " in f or "TABLE" in f for f in findings), findings


def test_concurrent_sessions_share_the_picture_cache_safely():
    """The app's one module-level cache (colour-mapped PNGs of vizapp.figures) from 8 threads at
    once: each key's value computed once, every thread sees the value of its own key."""
    pytest.importorskip("streamlit")
    from vizapp import figures

    store = figures._PICTURES
    computed: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)
    errors: list[str] = []

    def compute(key: str):
        def make() -> bytes:
            with lock:
                computed.append(key)
            return f"picture of {key}".encode()

        return make

    def session(index: int) -> None:
        barrier.wait()
        for round_ in range(200):
            key = f"thread-safety-test-{(index + round_) % 12}"
            value = store.get(key, compute(key))
            if value != f"picture of {key}".encode():
                errors.append(f"{key}: {value!r}")

    threads = [threading.Thread(target=session, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:5]
    assert sorted(computed) == sorted(set(computed)) and len(computed) == 12  # each key computed once
    assert len(store) <= store.max_entries


def _models_held(value, seen=None, path="session") -> list[str]:
    """Paths, inside ``value``, of every torch module or loaded model it holds (dataclass fields,
    named tuples, sequences and mappings walked)."""
    import dataclasses

    import torch

    import analysis

    seen = set() if seen is None else seen
    if id(value) in seen or isinstance(value, (str, bytes, int, float, bool, type(None))):
        return []
    seen.add(id(value))
    if isinstance(value, (torch.nn.Module, analysis.LoadedViT)):
        return [path]
    found = []
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            found += _models_held(getattr(value, field.name), seen, f"{path}.{field.name}")
    elif isinstance(value, dict):
        for key, item in value.items():
            found += _models_held(item, seen, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple, set, frozenset)):
        for i, item in enumerate(value):
            found += _models_held(item, seen, f"{path}[{i}]")
    return found


def test_a_session_holds_model_keys_not_models():
    """The cache's eviction must free a model however many sessions chose it: no session keeps one
    in its state (the issue: eight models in open tabs stayed in memory after eviction). After the
    cache is cleared the session's next run loads the model again, with the same (seeded) weights."""
    import os

    import torch
    from streamlit.testing.v1 import AppTest

    from vizapp import resources

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    at = AppTest.from_file(str(APP / "app.py"), default_timeout=120)
    at.query_params.update(model="random:vit_tiny_patch16_224", res="32")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    at.switch_page("views/tokens/tokens.py").run()
    state = {key: at.session_state[key] for key in at.session_state}
    assert _models_held(state) == []
    before = [p.detach().clone() for p in at.session_state["current"].vit.model.parameters()]
    resources.memory_store().clear()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    after = list(at.session_state["current"].vit.model.parameters())
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before))
    assert _models_held({key: at.session_state[key] for key in at.session_state}) == []


def test_an_evicted_model_gives_its_memory_back_to_the_system(monkeypatch):
    """Once the model cache lets go of a model (and no session holds it: they hold keys), the C
    allocator is asked to return its free memory (vizapp.memory; glibc kept ~180 MB of four
    evicted ViT-B/16 without it)."""
    import gc

    from vizapp import memory, resources
    from vizapp.refs import ModelRef

    resources.memory_store().clear()  # models of earlier tests
    gc.collect()
    calls = []
    monkeypatch.setattr(memory, "return_freed_memory", lambda: calls.append(1) or True)
    resources.get_model(ModelRef("vit_tiny_patch16_224", pretrained=False, img_size=48))
    gc.collect()
    assert calls == []  # held by the cache
    resources.memory_store().clear()
    gc.collect()
    assert calls == [1]
    if memory._TRIM is not None:  # glibc: the real call runs
        monkeypatch.undo()
        assert memory.return_freed_memory() is True


def test_eight_models_keep_the_processs_memory_under_the_budget_and_it_falls_back(monkeypatch):
    """Eight distinct ViT-S/16 (88 MB of weights each; 700 MB if all were kept) asked for in turn,
    as eight visitors would, under a memory budget of 300 MB: the process's resident memory grows by
    at most the budget plus a stated slack of 120 MB (a model being built before the older ones go,
    allocator pages), and once the store lets go it falls back to within that slack of the start."""
    import gc
    import os

    from streamlit_server import rss_mib
    from vizapp import resources
    from vizapp.refs import ModelRef

    budget, slack = 300 * 2**20, 120
    resources.memory_store().clear()
    gc.collect()
    monkeypatch.setattr(resources, "MEMORY_BUDGET_BYTES", budget)
    monkeypatch.setattr(resources.memory_store(), "max_bytes", budget)
    refs = [ModelRef("vit_small_patch16_224", pretrained=False, img_size=32 + 16 * i) for i in range(8)]
    resources.get_model(refs[0])  # the first model's allocator pages: then measure from here
    resources.memory_store().clear()
    gc.collect()
    start = rss_mib(os.getpid())
    peak = start
    for ref in refs:
        resources.get_model(ref)
        gc.collect()
        peak = max(peak, rss_mib(os.getpid()))
        assert resources.memory_store().nbytes <= budget
    resources.memory_store().clear()
    gc.collect()
    end = rss_mib(os.getpid())
    print(f"RSS at the start {start:.0f} MiB, peak {peak:.0f} MiB, after the store let go {end:.0f} MiB")
    assert peak - start < budget / 2**20 + slack, (start, peak)
    assert end - start < slack, (start, end)


def test_models_asked_for_at_once_are_built_one_at_a_time(monkeypatch):
    """Sessions opening different models at the same moment build them one after another: a model
    being built is not in the store yet, so builds side by side would each hold a model beside the
    budget (eight ViT-B at once: +2.9 GiB at the peak under 2 GiB; tests/bench_server_memory.py).
    Every model still arrives, each built once."""
    import threading
    import time

    from vizapp import resources
    from vizapp.refs import ModelRef

    resources.memory_store().clear()
    building, most, built = [0], [0], []
    count = threading.Lock()
    real_load = resources.load_vit

    def slow_load(*args, **kwargs):
        with count:
            building[0] += 1
            most[0] = max(most[0], building[0])
        time.sleep(0.2)  # long enough for every other thread to arrive meanwhile
        try:
            vit = real_load(*args, **kwargs)
            built.append(kwargs.get("img_size"))
            return vit
        finally:
            with count:
                building[0] -= 1

    monkeypatch.setattr(resources, "load_vit", slow_load)
    refs = [ModelRef("vit_tiny_patch16_224", pretrained=False, img_size=32 + 16 * i) for i in range(4)]
    models = {}
    threads = [threading.Thread(target=lambda r=r: models.update({r: resources.get_model(r)})) for r in refs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert most[0] == 1, f"{most[0]} models were built at the same time"
    assert sorted(built) == [32, 48, 64, 80]
    assert [models[r].spec.img_size for r in refs] == [(32, 32), (48, 48), (64, 64), (80, 80)]
    resources.memory_store().clear()


def _cached_functions():
    """``(module, name, signature)`` of every Streamlit-cached function of the importable app modules
    (the pages' ``compute.py`` and ``results.py`` included; the page scripts themselves run on import)."""
    import importlib
    import inspect
    import pkgutil

    from streamlit.runtime.caching.cache_utils import CachedFunc

    import vizapp

    names = [
        info.name
        for info in pkgutil.walk_packages(vizapp.__path__, "vizapp.")
        if not info.ispkg and not _is_page_script(info.name) and info.name != "vizapp.app"
    ]
    for name in names:
        module = importlib.import_module(name)
        for attribute, value in vars(module).items():
            if isinstance(value, CachedFunc) and value._info.func.__module__ == name:
                yield name, attribute, inspect.signature(value._info.func)


def _is_page_script(module: str) -> bool:
    """``vizapp.views.<page>.<page>``: a page's own script, which Streamlit runs (importing it draws the page)."""
    parts = module.split(".")
    return parts[:2] == ["vizapp", "views"] and len(parts) == 4 and parts[2] == parts[3]


def test_a_cached_function_of_an_image_is_keyed_by_the_images_digest():
    """Streamlit hashes every argument whose name does not start with ``_``: a cached function that
    reads ``_image_bytes`` (not hashed: large) must also take the image's ``digest``, or it hands one
    image's result to every image (a cached Top-5 without it showed the first image's classes for
    each upload; ``test_app.py::test_upload_replaces_the_sample`` checks that one in the app)."""
    found = list(_cached_functions())
    assert len(found) > 20, found  # the scan reaches the resources and the pages' computations
    unkeyed = [
        f"{module}.{name}{signature}"
        for module, name, signature in found
        if "_image_bytes" in signature.parameters and "digest" not in signature.parameters
    ]
    assert not unkeyed, unkeyed
