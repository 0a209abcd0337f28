"""The installed distribution: exactly one top-level import package, `coopflow`, whose parts (flows, stages,
schemas, artifacts) are installed from the repository's top-level folders; configs name code by its public paths,
and an old path fails in one line naming the new one."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PARTS = ("flows", "stages", "schemas", "artifacts")


def _build_wheel(out: Path) -> Path:
    """Build the wheel from a copy of the sources (no build/ or egg-info left in the checkout)."""
    src = out / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for folder in PARTS + ("coopflow",):
        shutil.copytree(REPO / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out / "dist"), str(src)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return next((out / "dist").glob("coopflow-*.whl"))


@pytest.mark.slow
def test_wheel_installs_one_top_level_package(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"coopflow"}, tops
    # every module of every folder is in the wheel (a subpackage missing from pyproject's list would be dropped)
    for folder in PARTS:
        for p in (REPO / folder).rglob("*.py"):
            assert f"coopflow/{folder}/{p.relative_to(REPO / folder).as_posix()}" in names, p
    # a fresh venv with the wheel installed; the dependencies come from this environment's site-packages, added
    # after the venv's own as plain paths (their .pth files, this checkout's editable finder among them, not run)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    import site as site_mod

    (site / "zz_dependencies.pth").write_text("\n".join(site_mod.getsitepackages()) + "\n")
    before = set(p.name for p in site.iterdir())
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", str(wheel)], check=True,
                   timeout=300, capture_output=True)
    added = {p for p in (set(p.name for p in site.iterdir()) - before) if not p.endswith(".dist-info")}
    assert added == {"coopflow"}, added
    # from outside the checkout: the parts import from the installed package, the old names do not import at all
    probe = ("import coopflow.stages.loops.run, coopflow.flows.train, coopflow.envs.coding, importlib.util as u\n"
             "print(coopflow.stages.__file__)\n"
             "print([m for m in ('stages', 'flows', 'schemas', 'artifacts') if u.find_spec(m)])\n")
    r = subprocess.run([py, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    where, old = r.stdout.strip().splitlines()[-2:]
    assert where.startswith(str(site)) and old == "[]", r.stdout
    r = subprocess.run([venv / "bin" / "coopflow", "--help"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "run" in r.stdout, r.stderr[-2000:]


def test_shipped_configs_name_public_paths_only():
    """Every shipped config (with the environment it names), shipped environment, example and bench script names
    functions by `coopflow.envs...` (never the internal `stages...` paths), and each named function resolves."""
    import re

    from coopflow.stages.common.user_code import load_callable

    import json

    from coopflow.envs import ENVIRONMENTS
    from coopflow.schemas.config.environment import resolve_environment

    files = [*(REPO / "configs").glob("*.yaml"), *(REPO / "examples").glob("*.py"), *(REPO / "bench").glob("*.py")]
    texts = {str(f): f.read_text() for f in files}
    for f in (REPO / "configs").glob("*.yaml"):  # a config's env: the parts it stands for, as a config writes them
        env = re.search(r"^env: (\S+)", texts[str(f)], re.M)
        if env:
            texts[f"{f} (env)"] = json.dumps(resolve_environment(env.group(1)).config())
    texts |= {f"env {n}": json.dumps(resolve_environment(n).config()) for n in ENVIRONMENTS}
    named = set()
    for where, text in texts.items():
        assert not re.search(r"\bstages\.tasks\.envs\.\w+:", text), where
        named |= set(re.findall(r"\bcoopflow\.(?:envs\.\w+|rewards|centralized):\w+", text))
    assert len(named) > 20
    for path in sorted(named):
        load_callable(path)


@pytest.mark.parametrize("old,new", [
    ("stages.tasks.envs.coding:humaneval_reward", "coopflow.envs.coding:humaneval_reward"),
    ("stages.score.rewards:length_ratio", "coopflow.rewards:length_ratio"),
    ("stages.tasks.centralized:DelimitedAdapter", "coopflow.centralized:DelimitedAdapter"),
    ("stages.tasks.transitions:plain", "coopflow.stages.tasks.transitions:plain"),
])
def test_an_old_path_fails_in_one_line_naming_the_new_one(old, new):
    from coopflow.stages.common.user_code import load_callable

    with pytest.raises(ValueError) as err:
        load_callable(old, "reward")
    msg = str(err.value)
    assert "\n" not in msg and repr(new) in msg and repr(old) in msg
    load_callable(new)  # and the new one resolves


def test_an_old_path_in_a_config_fails_before_anything_runs(tmp_path):
    """Through the CLI's validation: one line, no traceback."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("agents: {agent_model: tiny}\ntrainer: {num_turns: 1}\n"
                   "reward: {name: 'stages.tasks.envs.writing:dual_length_reward'}\n")
    r = subprocess.run([sys.executable, "-m", "coopflow.flows.cli", "validate", "--config", str(cfg)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode != 0
    assert "coopflow.envs.writing:dual_length_reward" in r.stderr and "Traceback" not in r.stderr, r.stderr
