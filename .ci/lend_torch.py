"""Lend torch and torchvision, with everything they require (CUDA libraries included: several GB),
from the venv that runs this script to another venv, without copying them.

    .venv/bin/python .ci/lend_torch.py VENV

makes VENV/lent-torch, a symbolic link in it to each top-level file or package of those
distributions (their .dist-info included), and a .pth file in VENV's site-packages naming that
folder: VENV then sees exactly those distributions, so its pip counts torch as installed and
installs only the rest. Used by the packaging check and by SAELens's venv (.ci/run); a third full
copy of torch once filled CI's disk.
"""

import re
import sys
from importlib import metadata
from pathlib import Path


def lend(venv: Path) -> list[str]:
    """Link the torch stack into VENV/lent-torch and put that folder on VENV's path; returns the
    names of the distributions lent."""
    sites = sorted(venv.glob("lib/python*/site-packages"))
    if len(sites) != 1:
        raise SystemExit(f"lend_torch: {venv} is not a venv with one site-packages ({sites})")
    target = venv / "lent-torch"
    target.mkdir()
    closure: set[tuple[str, tuple[str, ...]]] = set()
    todo: list[tuple[str, tuple[str, ...]]] = [("torch", ()), ("torchvision", ())]
    while todo:
        name, extras = todo.pop()
        name = re.sub(r"[-_.]+", "-", name).lower()
        if (name, extras) in closure:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        closure.add((name, extras))
        for requirement in dist.requires or []:
            wanted = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", requirement)
            if wanted and wanted.group(1) not in extras:
                continue  # a requirement of an extra nobody asked for
            head = re.split(r"[ ;<>=!~(]", requirement, maxsplit=1)[0]
            asked = tuple(sorted(re.findall(r"[\w.-]+", head.split("[", 1)[1]))) if "[" in head else ()
            todo.append((head.split("[", 1)[0], asked))
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops - {"bin", "__pycache__"}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (target / top).exists():
                (target / top).symlink_to(source)
    names = sorted({name for name, _ in closure})
    if "torch" not in names or {"streamlit", "pyarrow"} & set(names):
        raise SystemExit(f"lend_torch: unexpected torch stack {names}")
    (sites[0] / "_lent_torch.pth").write_text(f"{target.resolve()}\n")
    return names


if __name__ == "__main__":
    print("lent from", sys.prefix + ":", ", ".join(lend(Path(sys.argv[1]))))
