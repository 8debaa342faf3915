"""``python -m analysis``: see :mod:`analysis.cli`."""

from analysis.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
