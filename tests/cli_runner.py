"""Run ``python -m analysis ...`` for the command-line tests: in this process, or in a new one.

A new interpreter costs several seconds of imports (torch, timm, the library) before the command
reads its first argument; the tests of argument errors and one-process results call the command
dozens of times. :func:`run` therefore calls :func:`analysis.cli.main` in this process, with
``sys.argv``-style arguments, its standard streams captured, warnings shown as Python shows them
on a terminal, the exit status as a subprocess's, and the repository as the working directory.
Everything else (``torch.distributed.run`` on two ranks, other modules) still starts a process:
that is what those tests are about. ``python -m analysis`` as a real process is tested by
tests/test_packaging.py (the installed console script) and the torchrun tests.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(*args: str, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python *args`` with ``env`` (``os.environ`` when None): ``-m analysis ...`` in this
    process, anything else in a subprocess with ``cwd`` the repository."""
    if args[:2] == ("-m", "analysis"):
        return _in_process(list(args[2:]))
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=os.environ if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _in_process(argv: list[str]) -> subprocess.CompletedProcess:
    from analysis.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()

    def show(message, category, filename, lineno, file=None, line=None):
        stderr.write(warnings.formatwarning(message, category, filename, lineno, line))

    with contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.chdir(REPO))
        stack.enter_context(contextlib.redirect_stdout(stdout))
        stack.enter_context(contextlib.redirect_stderr(stderr))
        stack.enter_context(warnings.catch_warnings())
        # Python's own defaults for a script (each warning once per place; deprecations hidden)
        warnings.resetwarnings()
        warnings.simplefilter("default")
        for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
            warnings.simplefilter("ignore", category)
        warnings.showwarning = show
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors, and commands that exit
            code = _exit_status(exc)
            if not isinstance(exc.code, int | None):
                stderr.write(f"{exc.code}\n")
        except Exception:  # an unhandled error: a traceback and status 1, as the interpreter gives
            import traceback

            traceback.print_exc(file=stderr)
            code = 1
    return subprocess.CompletedProcess(
        ["python", "-m", "analysis", *argv], code or 0, stdout.getvalue(), stderr.getvalue()
    )


def _exit_status(exc: SystemExit) -> int:
    """The status an interpreter exits with for ``exc``: its code, 0 for None, 1 for a message."""
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def torchrun_batch(
    commands: dict[str, list[str]], folder: Path, timeout: int = 900
) -> dict[str, subprocess.CompletedProcess]:
    """Run each ``python -m analysis`` command of ``commands`` (``name -> argv``) on two torchrun
    ranks, one after another in one launch (the process group made once, by the first command);
    returns ``name -> CompletedProcess`` (the launch's output, each command's exit status on
    rank 0). One launch instead of one per command: the ranks' interpreters and
    imports are paid once."""
    batch = folder / "batch.json"
    batch.write_text(json.dumps(commands))
    env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__, str(batch)]
    result = subprocess.run(launch, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    codes_file = folder / "batch.codes.json"
    codes = json.loads(codes_file.read_text()) if codes_file.exists() else {}
    return {
        name: subprocess.CompletedProcess(argv, codes.get(name, result.returncode or 1), result.stdout, result.stderr)
        for name, argv in commands.items()
    }


def _run_batch_on_this_rank(batch: Path) -> int:
    """Under torchrun: every command of the batch in turn on this rank; rank 0 writes their statuses."""
    sys.path.insert(0, str(REPO))
    import torch.distributed as dist

    from analysis.cli import main

    # The commands share one process group: each one's closing destroy_process_group is put off to
    # the end (a group re-made in the same process can hang in gloo's rendezvous), and each one's
    # start finds the group joined, as a command does whose launcher set the group up before it.
    destroy, dist.destroy_process_group = dist.destroy_process_group, lambda *args, **kwargs: None
    codes = {}
    for name, argv in json.loads(batch.read_text()).items():
        print(f"--- {name}: python -m analysis {' '.join(argv)}", file=sys.stderr, flush=True)
        try:
            codes[name] = main(argv) or 0
        except SystemExit as exc:
            codes[name] = _exit_status(exc)
    if os.environ.get("RANK", "0") == "0":
        batch.with_suffix(".codes.json").write_text(json.dumps(codes))
    if dist.is_initialized():
        destroy()
    return 1 if any(codes.values()) else 0


if __name__ == "__main__":
    raise SystemExit(_run_batch_on_this_rank(Path(sys.argv[1])))
