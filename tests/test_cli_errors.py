"""A failed `coopflow` command's one-line error stays the last line on stderr, whatever the process prints while it
shuts down afterwards (Prefect's services and ephemeral server can print a CancelledError traceback at exit after a
flow ended by an exception)."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import atexit, sys, threading
    # what a library's shutdown may do after the command reported its failure
    atexit.register(lambda: print("Traceback (most recent call last):\\nasyncio.exceptions.CancelledError",
                                  file=sys.stderr))
    from coopflow.artifacts import ArtifactError, StoreFullError
    from coopflow.flows import cli

    def fail(args):
        raise {error}("{message}")

    cli._verify = fail
    sys.argv = ["coopflow", "verify"]
    sys.exit(cli.main())
""")


@pytest.mark.parametrize("error,message,code", [
    ("StoreFullError", "no space left under /data while writing a checkpoint artifact; rerun the same command", 4),
    ("ArtifactError", "rollouts/abc: sha256 mismatch", 3),
])
def test_the_failure_line_is_the_last_thing_on_stderr(error, message, code):
    r = subprocess.run([sys.executable, "-c", SCRIPT.format(error=error, message=message)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == code, r.stderr
    assert "CancelledError" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[0] == f"coopflow: {message}"
    assert lines[-1].startswith("coopflow:") or lines[-1].startswith("(run `coopflow verify --quarantine`")


def test_called_from_python_the_error_is_returned_and_stderr_left_alone(monkeypatch, capsys):
    from coopflow.artifacts import StoreFullError
    from coopflow.flows import cli

    def fail(args):
        raise StoreFullError("no space left under /data")

    monkeypatch.setattr(cli, "_verify", fail)
    assert cli.main(["verify"]) == 4
    assert capsys.readouterr().err.strip() == "coopflow: no space left under /data"
    print("still here", file=sys.stderr)
    assert capsys.readouterr().err.strip() == "still here"


def test_a_failure_returned_as_a_code_also_keeps_its_line_last():
    """A subcommand that reports its own failure (one line, then a non-zero code, as `run` does for a config error
    raised inside the flow) gets the same quiet shutdown."""
    script = SCRIPT.replace('    raise {error}("{message}")',
                            '    print("coopflow: {message}", file=sys.stderr)\n    return 2')
    assert script != SCRIPT
    message = "invalid config: trainer.num_generations: Input should be greater than or equal to 2"
    r = subprocess.run([sys.executable, "-c", script.format(message=message)], cwd=REPO, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "CancelledError" not in r.stderr
    assert r.stderr.strip().splitlines() == [f"coopflow: {message}"]
