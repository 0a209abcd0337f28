"""Child servers that stop with the process that started them, also when that process is killed with `kill -9`.

A detached watchdog (`python -c WATCHDOG <parent> <child> [group]`) polls the parent once a second and, once it
is gone, sends SIGTERM to the child (or to the process group the child leads). Used for Prefect's ephemeral
server under `coopflow run` and for the MLflow UI server under `coopflow ui`.
"""

import os
import subprocess
import sys

WATCHDOG = """
import os, signal, sys, time
parent, child, group = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:] == ["group"]
while True:
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        break
    time.sleep(1)
try:
    (os.killpg if group else os.kill)(child, signal.SIGTERM)
except ProcessLookupError:
    pass
"""


def reap_with_parent(pid: int, group: bool = False) -> None:
    """Stop process `pid` (Prefect's ephemeral server; with `group`, the process group that `pid` leads: the
    MLflow UI server and its workers) once this process is gone, also after a `kill -9` (Prefect stops it on a
    normal exit; a killed CLI used to leave it running)."""
    subprocess.Popen([sys.executable, "-c", WATCHDOG, str(os.getpid()), str(pid), *(["group"] if group else [])],
                     start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def healthy(url: str) -> bool:
    """Whether the server at `url` answers its `/health` endpoint (Prefect's API and MLflow's server both have one)."""
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
