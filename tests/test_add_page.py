"""docs/contributing/add-page.md's toy page, built the way the walkthrough says: its two files
written into a copy of the app and nothing else touched. The app lists the page (AppTest refuses
to switch to a file ``st.navigation`` does not know), runs it on the demo model, its number is the
library's, and its setting survives a switch to another page and back."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WALKTHROUGH = REPO / "docs" / "contributing" / "add-page.md"
BLOCK = re.compile(r'```python title="(vizapp/views/hello/[^"]+)"\n(.*?)```', re.S)

# Runs in a fresh interpreter whose path starts with the copy, so that `vizapp` is the copy's.
DRIVER = """
import json, sys
from pathlib import Path
import analysis, vizapp
from streamlit.testing.v1 import AppTest

root = Path(sys.argv[1])
assert Path(vizapp.__file__).resolve().is_relative_to(root), vizapp.__file__
at = AppTest.from_file(str(root / "vizapp" / "app.py"), default_timeout=120)
at.run()
at.switch_page("views/hello/hello.py").run()
shown = {"last": [m.value for m in at.markdown if m.value.startswith("Largest attention")]}
at.slider(key="hello_layer").set_value(0).run()
shown["first"] = [m.value for m in at.markdown if m.value.startswith("Largest attention")]
at.switch_page("views/attention/attention.py").run()
at.switch_page("views/hello/hello.py").run()
shown["kept"] = at.slider(key="hello_layer").value
shown["errors"] = [e.value for e in at.exception] + [e.value for e in at.error]
vit = analysis.load_vit("demo")
record = analysis.capture_attention(vit, vit.preprocess(analysis.load_image(at.session_state["current"].image.data)))
shown["expected"] = {
    layer: float(analysis.attention_map(record, layer)[0].max()) for layer in (0, vit.spec.num_layers - 1)
}
print(json.dumps(shown))
"""


def test_the_walkthroughs_toy_page_runs_from_its_folder_alone(tmp_path):
    files = BLOCK.findall(WALKTHROUGH.read_text(encoding="utf-8"))
    assert [path for path, _ in files] == ["vizapp/views/hello/__init__.py", "vizapp/views/hello/hello.py"]
    shutil.copytree(REPO / "vizapp", tmp_path / "vizapp", ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in files:
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    environment = {**os.environ, "PYTHONPATH": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tmp_path)],
        capture_output=True,
        text=True,
        env=environment,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    shown = json.loads(result.stdout.strip().splitlines()[-1])
    assert shown["errors"] == []
    expected = {int(layer): value for layer, value in shown["expected"].items()}
    last = max(expected)
    assert shown["last"] == [f"Largest attention at layer {last}: **{expected[last]:.6f}**"]
    assert shown["first"] == [f"Largest attention at layer 0: **{expected[0]:.6f}**"]
    assert shown["kept"] == 0  # hello_layer is in the page's kept_keys
