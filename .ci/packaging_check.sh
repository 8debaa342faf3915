#!/usr/bin/env bash
# Packaging: the library installs and runs without the app's dependencies, and the `app` extra
# adds the app. Builds a wheel of this checkout, installs it with its dependencies into a fresh
# venv (pip's own configuration supplies torch, as for requirements.txt), then from a folder
# outside the repository:
#   1. without the extra: Streamlit is absent, `import analysis` works, `python -m analysis
#      report` runs on the bundled demo model, and `import vizapp` raises AppDependencyError
#      naming `pip install "vit-explorer[app]"`;
#   2. with the extra: `vit-explorer --help` runs.
# Slow (it installs torch): a step of .ci/run of its own, not part of the README's test command.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PYTHON="${PYTHON:-python3}"

"$REPO/.venv/bin/pip" wheel -q --no-deps --no-build-isolation "$REPO" -w "$WORK/dist"
WHEEL="$(ls "$WORK"/dist/vit_explorer-*.whl)"
"$PYTHON" -m venv "$WORK/v"
# A CPU build of torch where pip's find-links folder has one (as on the team's machines): the
# check is about our package, and the default Linux torch pulls several GB of CUDA libraries.
: > "$WORK/constraints.txt"
for folder in $("$REPO/.venv/bin/pip" config get global.find-links 2>/dev/null || true); do
  for found in "$folder"/torch-*+cpu-*.whl; do
    if [ -f "$found" ]; then
      version="$(basename "$found" | sed -E 's/^torch-([^-]+)-.*/\1/')"     # e.g. 2.13.0+cpu
      minor="$(echo "$version" | cut -d. -f2)"
      # torchvision's minor version is torch's + 15 (torch 2.13 <-> torchvision 0.28): a newer
      # torchvision's compiled operators do not load into an older torch
      printf 'torch==%s\ntorchvision==0.%s.*\n' "$version" "$((minor + 15))" > "$WORK/constraints.txt"
    fi
  done
done
"$WORK/v/bin/pip" install -q -c "$WORK/constraints.txt" "$WHEEL"

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

# 2. with the app extra
"$WORK/v/bin/pip" install -q -c "$WORK/constraints.txt" "$WHEEL[app]"
"$WORK/v/bin/vit-explorer" --help >"$WORK/app_help.txt"
grep -q "streamlit run" "$WORK/app_help.txt" || grep -qi "usage" "$WORK/app_help.txt"
echo "packaging check: the library without the app extra, and the app with it: ok"
