"""build_taskset: built-in, local files with a prompt column or template, limits and errors."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from coopflow.artifacts import ArtifactStore
from coopflow.schemas.config import TasksetConfig
from coopflow.stages.tasks.taskset import build_taskset, load_items


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


# --- held-out eval splits (taskset.eval_fraction / taskset.eval_file) ---------------------------------------------


def _rows_file(path, n, start=0, ids=True):
    rows = [{**({"id": f"q{i}"} if ids else {}), "prompt": f"question {i}"} for i in range(start, start + n)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def _ids(store, ref, split):
    return [it.get("id", it["prompt"]) for it in load_items(store, ref, split)]


@pytest.mark.parametrize("ids", [True, False])
def test_eval_fraction_splits_a_file_deterministically_and_disjointly(tmp_path, ids):
    path = _rows_file(tmp_path / "d.jsonl", 20, ids=ids)
    store = ArtifactStore(tmp_path / "s")
    cfg = TasksetConfig(name=str(path), eval_fraction=0.25)
    ref = build_taskset(cfg, store)
    train, evals = _ids(store, ref, "train"), _ids(store, ref, "eval")
    assert len(train) == 15 and len(evals) == 5 and not set(train) & set(evals)
    assert set(train) | set(evals) == {f"q{i}" if ids else f"question {i}" for i in range(20)}
    assert build_taskset(TasksetConfig(name=str(path), eval_fraction=0.25), store) == ref  # a rerun hits the cache
    other = ArtifactStore(tmp_path / "s2")  # rebuilt from scratch: the same split
    assert _ids(other, build_taskset(cfg, other), "eval") == evals
    # the split follows the rows' identities, not their order: reversed rows hold out the same items
    rev = tmp_path / "rev.jsonl"
    rev.write_text("\n".join(reversed(path.read_text().splitlines())))
    assert set(_ids(store, build_taskset(TasksetConfig(name=str(rev), eval_fraction=0.25), store), "eval")) == set(evals)
    seeded = build_taskset(TasksetConfig(name=str(path), eval_fraction=0.25, eval_split_seed=1), store)
    assert seeded.key != ref.key and len(_ids(store, seeded, "eval")) == 5 and _ids(store, seeded, "eval") != evals
    limited = build_taskset(TasksetConfig(name=str(path), eval_fraction=0.25, num_items=4, num_eval_items=2), store)
    assert _ids(store, limited, "train") == train[:4] and _ids(store, limited, "eval") == evals[:2]


def test_eval_file_is_the_eval_split_and_may_not_repeat_training_rows(tmp_path):
    path = _rows_file(tmp_path / "train.jsonl", 6)
    held = _rows_file(tmp_path / "held.jsonl", 3, start=100)
    store = ArtifactStore(tmp_path / "s")
    ref = build_taskset(TasksetConfig(name=str(path), eval_file=str(held)), store)
    assert _ids(store, ref, "train") == [f"q{i}" for i in range(6)]
    assert _ids(store, ref, "eval") == ["q100", "q101", "q102"]
    held.write_text(held.read_text() + '\n{"id": "q103", "prompt": "question 103"}')
    again = build_taskset(TasksetConfig(name=str(path), eval_file=str(held)), store)
    assert again.key != ref.key and len(load_items(store, again, "eval")) == 4  # its content is in the key
    leak = _rows_file(tmp_path / "leak.jsonl", 2, start=5)  # q5 is a training id
    with pytest.raises(ValueError, match=r"1 row\(s\) repeat training rows, e.g. row 0 is training row 5 \(id=q5\)"):
        build_taskset(TasksetConfig(name=str(path), eval_file=str(leak)), store)
    plain = _rows_file(tmp_path / "plain.jsonl", 4, ids=False)
    same = _rows_file(tmp_path / "same.jsonl", 1, start=2, ids=False)  # without ids: the same row
    with pytest.raises(ValueError, match="row 0 is training row 2"):
        build_taskset(TasksetConfig(name=str(plain), eval_file=str(same)), store)
    with pytest.raises(FileNotFoundError, match="taskset.eval_file 'nope.jsonl' does not exist"):
        build_taskset(TasksetConfig(name=str(path), eval_file="nope.jsonl"), store)


def test_held_out_settings_errors(tmp_path):
    from pydantic import ValidationError

    path = _rows_file(tmp_path / "d.jsonl", 3)
    store = ArtifactStore(tmp_path / "s")
    with pytest.raises(ValidationError, match="eval_fraction and taskset.eval_file both set"):
        TasksetConfig(name=str(path), eval_fraction=0.2, eval_file="x.jsonl")
    with pytest.raises(ValidationError, match="eval_fraction and taskset.eval_split both set"):
        TasksetConfig(name=str(path), eval_fraction=0.2, eval_split="test")
    with pytest.raises(ValidationError, match="eval_fraction 0 holds out nothing"):
        TasksetConfig(name=str(path), eval_fraction=0.0)
    with pytest.raises(ValidationError, match="less than 1"):
        TasksetConfig(name=str(path), eval_fraction=1.0)
    with pytest.raises(ValueError, match=r"eval_fraction 0.1 of taskset .*'s 3 rows holds out no item: raise it to at least 0.167"):
        build_taskset(TasksetConfig(name=str(path), eval_fraction=0.1), store)
    with pytest.raises(ValueError, match="holds out all of them, leaving no training item"):
        build_taskset(TasksetConfig(name=str(path), eval_fraction=0.9), store)
    with pytest.raises(ValueError, match="has an eval split of its own \\('eval', 8 items\\): taskset.eval_fraction"):
        build_taskset(TasksetConfig(eval_fraction=0.2), store)  # the built-in story taskset has held-out topics
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n{"id": 2, "prompt": "c"}\n')
    with pytest.raises(ValueError, match="duplicate id 1"):
        build_taskset(TasksetConfig(name=str(dup), eval_fraction=0.4), store)


def test_unused_held_out_fields_leave_the_key_alone(tmp_path):
    from coopflow.stages.tasks.taskset import taskset_key

    assert taskset_key(TasksetConfig(eval_split_seed=3))[0] == taskset_key(TasksetConfig())[0]  # a seed alone: unused
    path = _rows_file(tmp_path / "d.jsonl", 10)
    plain = TasksetConfig(name=str(path))
    assert "eval_fraction" not in plain.key_fields() and "eval_split_seed" not in plain.key_fields()
    assert taskset_key(plain)[0] != taskset_key(TasksetConfig(name=str(path), eval_fraction=0.2))[0]


def test_a_run_evaluates_on_held_out_items_and_warns_when_it_cannot(tmp_path, caplog):
    from coopflow.schemas.config import validate_config
    from coopflow.stages.planning.context import make_context
    from coopflow.flows.driver import run_inline
    from tests.conftest import small_config

    path = _rows_file(tmp_path / "d.jsonl", 10)
    trainer = {"eval_num_samples": 0}  # every eval item
    cfg = validate_config(small_config(tmp_path / "run", taskset={"name": str(path), "eval_fraction": 0.2,
                                                                    "num_items": 4, "num_eval_items": None},
                                       trainer=trainer, eval_before=False))
    store = ArtifactStore(tmp_path / "run" / "artifacts")
    ref = build_taskset(cfg.taskset, store)
    ctx = make_context(cfg, store, ref)
    assert ctx.plan.warnings == ()
    s = run_inline(cfg)
    assert s["eval"]
    evals, train = load_items(store, ref, "eval"), load_items(store, ref, "train")
    eval_dir = store.root / "eval"
    [eval_key] = [p.name for p in eval_dir.iterdir()]
    used = {evals[r["item_id"]]["id"] for r in store.read_rows(store.find("eval", eval_key))}
    trained = {train[r["item_id"]]["id"] for k in (store.root / "rollouts").iterdir()
               for r in store.read_rows(store.find("rollouts", k.name))}
    assert len(used) == 2 and len(trained) == 4 and not used & trained
    same = validate_config(small_config(tmp_path / "same", taskset={"name": str(path), "num_items": 4}))
    store2 = ArtifactStore(tmp_path / "same" / "artifacts")
    warns = make_context(same, store2, build_taskset(same.taskset, store2)).plan.warnings
    assert len(warns) == 1 and "evaluation runs on training items: 2 of the 2 eval items" in warns[0]
    assert "taskset.eval_fraction" in warns[0]
    assert not any("training items" in r.getMessage() for r in caplog.records)  # the held-out run said nothing
