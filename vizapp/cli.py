"""``vit-explorer``: start the app from anywhere (after ``pip install .`` or ``pip install -e .``).

    vit-explorer                          # streamlit run vizapp/app.py, with the repo's settings
    vit-explorer --server.port 8600       # any `streamlit run` option is passed on

The default model loads while the server starts (:mod:`vizapp.preload`; ``VIZAPP_PRELOAD=0`` turns it off).

Streamlit reads ``.streamlit/config.toml`` only from the working directory, so the
repository's settings (upload limit, no usage stats, toolbar, theme) are passed as flags;
flags given on the command line win. The settings come from the checkout's
``.streamlit/config.toml``, or from the copy a wheel carries as ``vizapp/_streamlit/config.toml``
(``pyproject.toml`` maps it there).
"""

from __future__ import annotations

import sys
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10: the same parser, if installed as tomli
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None

APP = Path(__file__).resolve().parent / "app.py"
PACKAGED_CONFIG = Path(__file__).resolve().parent / "_streamlit" / "config.toml"  # an installed wheel
CHECKOUT_CONFIG = Path(__file__).resolve().parent.parent / ".streamlit" / "config.toml"  # a source checkout
CONFIG = PACKAGED_CONFIG if PACKAGED_CONFIG.is_file() else CHECKOUT_CONFIG


def config_flags(path: Path = CONFIG) -> list[str]:
    """``--section.option=value`` for every option of a Streamlit config file."""
    if not path.is_file():
        return []
    if tomllib is None:
        print(
            f"vit-explorer: cannot read {path} on Python {sys.version_info.major}.{sys.version_info.minor} without "
            "tomli, so the app's settings (upload limit, no usage statistics, theme) are not applied: "
            "pip install tomli",
            file=sys.stderr,
        )
        return ["--browser.gatherUsageStats=false"]  # never phone home, whatever else is missing
    with path.open("rb") as handle:
        config = tomllib.load(handle)
    flags = []
    for section, options in config.items():
        for option, value in options.items():
            text = str(value).lower() if isinstance(value, bool) else str(value)
            flags.append(f"--{section}.{option}={text}")
    return flags


def main(argv: list[str] | None = None) -> int:
    from streamlit.web import cli as streamlit_cli

    args = list(sys.argv[1:] if argv is None else argv)
    given = {arg.split("=")[0] for arg in args if arg.startswith("--")}
    defaults = [flag for flag in config_flags() if flag.split("=")[0] not in given]
    sys.argv = ["streamlit", "run", str(APP), *defaults, *args]
    if not {"-h", "--help", "--version"} & set(args):
        from vizapp import preload

        preload.import_libraries()  # before any session: concurrent first imports met half-made modules
        preload.start()  # the default model loads while the server starts
    return streamlit_cli.main()


if __name__ == "__main__":
    sys.exit(main())
