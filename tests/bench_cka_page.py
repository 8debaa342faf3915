"""The Attention distance page's linear CKA over 64 uploaded images, a ViT-S/16 (random weights,
224 px) against a ResNet-50 (random weights), timed in Streamlit's AppTest on this machine:

    .venv/bin/python tests/bench_cka_page.py

The ViT is written once into a temporary folder (random weights, seeded); the images are 64 demo
scenes uploaded as one .zip; the time is the run that draws the heatmap (the page's progress bar
advances per minibatch of vizapp.resources.SET_CHUNK images).
"""

import io
import json
import os
import tempfile
import time
import zipfile
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
import timm
import torch
from PIL import Image
from safetensors.torch import save_file
from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parent.parent
folder = Path(tempfile.gettempdir()) / "vit_explorer_bench_cka_vit_s"
if not (folder / "model.safetensors").exists():
    folder.mkdir(exist_ok=True)
    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch16_224", pretrained=False)
    (folder / "config.json").write_text(json.dumps({"architecture": "vit_small_patch16_224", "num_classes": 1000}))
    save_file(model.state_dict(), str(folder / "model.safetensors"))
from analysis.demo.data import render_sample  # noqa: E402 - the demo scenes, after the model folder

buffer = io.BytesIO()
with zipfile.ZipFile(buffer, "w") as archive:
    for i in range(64):
        image = Image.fromarray(render_sample(7, i, 224)[0])
        png = io.BytesIO()
        image.save(png, format="PNG")
        archive.writestr(f"scene_{i:02d}.png", png.getvalue())
at = AppTest.from_file(str(REPO / "vizapp" / "app.py"), default_timeout=600)
at.query_params.update(model=str(folder))
at.run()
at.switch_page("views/distance/distance.py").run()
at.radio(key="dist_set").set_value("mine").run()
at.file_uploader(key="dist_files").set_value(("scenes.zip", buffer.getvalue(), "application/zip")).run()
at.radio(key="dist_cka_with").set_value("cnn").run()
at.text_input(key="dist_cka_cnn").set_value("random:resnet50").run()
assert not at.exception, [e.value for e in at.exception]
start = time.perf_counter()
at.toggle(key="dist_cka").set_value(True).run()
elapsed = time.perf_counter() - start
assert not at.exception, [e.value for e in at.exception]
charts = [c for c in at.get("plotly_chart") if c.proto.id.endswith("-dist_cka_chart")]
spec = json.loads(charts[0].proto.spec)
heat = [t for t in spec["data"] if t["type"] == "heatmap"][0]
print(
    f"CKA page run: {elapsed:.1f} s for 64 images, matrix {len(heat['y'])}x{len(heat['x'])}; title {spec['layout']['title']['text']!r}"
)
