#!/usr/bin/env bash
# Packaging: the library installs and runs without the app's dependencies, and the `app` extra
# adds the app. Builds a wheel of this checkout, installs it with its dependencies into a fresh
# venv (pip's own configuration supplies torch, as for .venv), then from a folder
# outside the repository:
#   1. without the extra: Streamlit is absent, `import analysis` works, `python -m analysis
#      report` runs on the bundled demo model, the textured demo variants load and classify a scene,
#      and `import vizapp` raises AppDependencyError
#      naming `pip install "vit-explorer[app]"`;
#   2. with the extra: `vit-explorer --help` runs, and no tool of the test, docs or lint extras is installed;
#   3. the README's `pip install -e ".[app]"` from the checkout: the same, importable from any directory.
# Slow (a venv, timm and the rest from the index, a report): a step of .ci/run of its own, not part
# of the README's test command.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PYTHON="${PYTHON:-python3}"

"$REPO/.venv/bin/pip" wheel -q --no-deps --no-build-isolation "$REPO" -w "$WORK/dist"
WHEEL="$(ls "$WORK"/dist/vit_explorer-*.whl)"
"$PYTHON" -m venv "$WORK/v"
# torch and torchvision (with their own dependencies, CUDA libraries included: several GB) are
# lent from this checkout's .venv (its `dev` extra): the fresh venv sees only
# those distributions, through a .pth file, and pip installs everything else the wheel declares
# from the package index, as for a user. PACKAGING_CHECK_OWN_TORCH=1 lets pip install torch too.
if [ "${PACKAGING_CHECK_OWN_TORCH:-0}" != 1 ]; then
  "$REPO/.venv/bin/python" "$REPO/.ci/lend_torch.py" "$WORK/v"
fi
"$WORK/v/bin/pip" install -q --no-compile "$WHEEL"

mkdir "$WORK/elsewhere" && cd "$WORK/elsewhere"
export HF_HUB_OFFLINE=1
unset PYTHONPATH

# 1. the library alone
if "$WORK/v/bin/python" -c "import streamlit" 2>/dev/null; then
  echo "packaging check: the wheel without the app extra installed streamlit" >&2; exit 1
fi
"$WORK/v/bin/python" -c "import analysis, analysis.plots; print('analysis', analysis.__file__)"
"$WORK/v/bin/python" -m analysis report --model demo --examples 1 --out "$WORK/report"
test -s "$WORK/report/report.html"
"$WORK/v/bin/python" -m analysis sae metrics --sae demo --model demo --demo-scenes 4  # the bundled demo SAE
# the demo models trained on textured scenes too, from the wheel: each names a bundled scene's class
"$WORK/v/bin/python" - <<'PY'
from analysis import load_image, load_vit
from analysis import asset_path
from analysis.robustness import load_cnn

scene = asset_path("samples", "scene_1_star.png")
for model in (load_vit("demo_textured"), load_vit("demo_swin_textured"), load_cnn("demo_textured")):
    predicted = model.class_names[int(model.top1([load_image(scene)])[0])]
    assert predicted == "star", (model.name, predicted)
print("textured demo variants from the wheel: ok")
PY
"$WORK/v/bin/python" - <<'PY'
try:
    import vizapp  # noqa: F401
except ImportError as exc:
    assert type(exc).__name__ == "AppDependencyError", repr(exc)
    assert 'pip install "vit-explorer[app]"' in str(exc), str(exc)
    print("import vizapp without the app extra:", exc)
else:
    raise SystemExit("packaging check: vizapp imported without the app extra")
PY
if "$WORK/v/bin/vit-explorer" --help >"$WORK/no_app.txt" 2>&1; then
  echo "packaging check: vit-explorer ran without the app extra" >&2; exit 1
fi
grep -q 'vit-explorer\[app\]' "$WORK/no_app.txt"

# 2. with the app extra: the app, and none of the project's test, docs or lint tools
"$WORK/v/bin/pip" install -q --no-compile "$WHEEL[app]"
"$WORK/v/bin/vit-explorer" --help >"$WORK/app_help.txt"
grep -q "streamlit run" "$WORK/app_help.txt" || grep -qi "usage" "$WORK/app_help.txt"
no_tools() {  # $1: a venv's python; fails naming any tool of the test, docs or lint extras it can import
  "$1" - <<'PY'
import importlib.util
tools = ["pytest", "playwright", "jupyterlab", "mkdocs", "mypy", "ruff", "captum", "onnxruntime", "importlinter"]
found = [name for name in tools if importlib.util.find_spec(name) is not None]
assert not found, f"the app extra installed tools of the test, docs or lint extras: {found}"
PY
}
no_tools "$WORK/v/bin/python"

# 3. the README's command from a checkout: `pip install -e ".[app]"` makes analysis and vizapp importable
# from any directory (the example notebooks' kernels start in examples/), with the same lean set
"$PYTHON" -m venv "$WORK/e"
if [ "${PACKAGING_CHECK_OWN_TORCH:-0}" != 1 ]; then
  "$REPO/.venv/bin/python" "$REPO/.ci/lend_torch.py" "$WORK/e"
fi
"$WORK/e/bin/pip" install -q --no-compile -e "$REPO[app]"
"$WORK/e/bin/python" -c "import analysis, vizapp; from analysis import asset_path, load_vit; load_vit('demo'); print('editable:', analysis.__file__, asset_path('samples'))"
"$WORK/e/bin/vit-explorer" --help >/dev/null
no_tools "$WORK/e/bin/python"
echo "packaging check: the library without the app extra, the app with it, the README's editable install: ok"
