"""build_taskset: built-in, local files with a prompt column or template, limits and errors."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from artifacts import ArtifactStore
from schemas.config import TasksetConfig
from stages.tasks.taskset import build_taskset, load_items


def test_builtin_story_taskset(tmp_path):
    store = ArtifactStore(tmp_path)
    ref = build_taskset(TasksetConfig(num_items=5, num_eval_items=3), store)
    train, evals = load_items(store, ref, "train"), load_items(store, ref, "eval")
    assert [it["prompt"] for it in train[:2]] == ["write a story about a robot", "write a story about the ocean"]
    assert len(train) == 5 and len(evals) == 3 and [it["_item_id"] for it in train] == [0, 1, 2, 3, 4]
    assert build_taskset(TasksetConfig(num_items=5, num_eval_items=3), store) == ref  # cached, same key


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet", "json"])
def test_local_file_with_template(tmp_path, fmt):
    rows = [{"text": f"story {i}", "n": str(i)} for i in range(4)]
    path = tmp_path / f"data.{fmt}"
    if fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    elif fmt == "csv":
        path.write_text("text,n\n" + "\n".join(f"{r['text']},{r['n']}" for r in rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    store = ArtifactStore(tmp_path / "store")
    ref = build_taskset(TasksetConfig(name=str(path), prompt_template="Expand: {text} (#{n})", num_items=3), store)
    train = load_items(store, ref, "train")
    assert [it["prompt"] for it in train] == ["Expand: story 0 (#0)", "Expand: story 1 (#1)", "Expand: story 2 (#2)"]
    assert train[1]["text"] == "story 1"
    assert len(load_items(store, ref, "eval")) == 4  # no eval split in a file: the train rows


def test_changed_file_changes_key(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a"}\n')
    store = ArtifactStore(tmp_path / "s")
    r1 = build_taskset(TasksetConfig(name=str(path)), store)
    path.write_text('{"prompt": "b"}\n')
    r2 = build_taskset(TasksetConfig(name=str(path)), store)
    assert r1.key != r2.key and load_items(store, r2, "train")[0]["prompt"] == "b"


def test_taskset_errors(tmp_path):
    store = ArtifactStore(tmp_path / "s")
    with pytest.raises(FileNotFoundError, match="neither a built-in taskset"):
        build_taskset(TasksetConfig(name="nope.jsonl"), store)
    path = tmp_path / "d.jsonl"
    path.write_text('{"question": "a"}\n')
    with pytest.raises(ValueError, match="prompt_column 'prompt' not found"):
        build_taskset(TasksetConfig(name=str(path)), store)
    path.write_text('{"prompt": "a"}\nnot json\n')
    with pytest.raises(ValueError, match="d.jsonl:2: invalid JSON"):
        build_taskset(TasksetConfig(name=str(path)), store)


def test_hf_dataset_saved_to_disk(tmp_path):
    import datasets

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"q": ["a", "b", "c"]}),
                               "test": datasets.Dataset.from_dict({"q": ["x"]})})
    dd.save_to_disk(str(tmp_path / "ds"))
    store = ArtifactStore(tmp_path / "s")
    ref = build_taskset(TasksetConfig(name=str(tmp_path / "ds"), prompt_column="q", eval_split="test"), store)
    assert [it["prompt"] for it in load_items(store, ref, "train")] == ["a", "b", "c"]
    assert [it["prompt"] for it in load_items(store, ref, "eval")] == ["x"]
