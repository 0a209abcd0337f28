"""MLflow tracking for flow runs: one MLflow run per flow run, always addressed by explicit run_id.

What a run holds:
- params: the full resolved config, flattened to dotted keys;
- metrics keyed by `env_step` with the reference's names (`turn_1/reward_mean`,
  `turn_1/expected_return`, `eval/turn_1/...`) plus `timing/*` per stage and tokens/s;
- artifacts: `lineage.json`, `summary.json`, `config.json`, and the joint answers as tables MLflow's artifact view
  shows (`rollouts/segment_NNNN.json`, `rollouts/eval.json`, `rollouts/eval_before.json`: `tracking.rollouts`);
- lineage: a tag `lineage.<role>` = `<kind>/<key>@<sha256>` for each main input/output artifact,
  the taskset as an MLflow dataset input whose digest is the artifact's sha256, and every artifact
  of the run (rollouts, scores, advantages, checkpoints, eval) in `lineage.json`.
"""

import functools
import json
import logging
import os
import re
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from coopflow.artifacts import ArtifactRef, faults
from coopflow.artifacts.store import process_alive
from coopflow.artifacts.templates import create_from_template


def tracking_uri(cfg) -> str:
    """A run config's MLflow URI: tracking.tracking_uri, else SQLite under its data dir."""
    return cfg.tracking.tracking_uri or f"sqlite:///{cfg.resolved_data_dir() / 'mlflow.db'}"


def tracker_for(cfg) -> "Tracker":
    """The run config's tracker. With the default store (SQLite under the data dir) a new experiment keeps its run
    artifacts in <data_dir>/mlartifacts/<experiment> (MLflow's own default is ./mlruns in the working directory),
    and a new DB starts as a copy of a migrated empty one (see `_prepare_sqlite`)."""
    tr = cfg.tracking
    if tr.tracking_uri or not tr.enabled:
        return Tracker(tracking_uri(cfg), tr.experiment, tr.enabled)
    data = cfg.resolved_data_dir()
    _prepare_sqlite(data / "mlflow.db", data)
    return Tracker(tracking_uri(cfg), tr.experiment, True, artifact_location=_artifact_dir(data, tr.experiment))


def _artifact_dir(data: Path, experiment: str) -> str:
    """<data_dir>/mlartifacts/<experiment name, made path-safe>, as a file URI."""
    return (data / "mlartifacts" / (re.sub(r"[^A-Za-z0-9._-]", "_", experiment) or "_")).as_uri()


def _empty_db(path: Path) -> None:
    """Create a migrated, empty MLflow SQLite DB at `path`."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    SqlAlchemyStore(f"sqlite:///{path}", path.parent.as_uri()).engine.dispose()


def _prepare_sqlite(db: Path, data: Path) -> None:
    """Start a new tracking DB as a copy of a migrated empty one: MLflow's schema migrations cost ~3 s per new DB.
    The template is cached per MLflow version in $COOPFLOW_CACHE (default <data_dir>/cache). The copy's
    'Default' experiment points its artifacts at <data_dir>/mlartifacts/Default."""
    if db.exists():
        return
    import sqlite3

    import mlflow

    def point_default_here(copy: Path) -> None:
        con = sqlite3.connect(copy)
        with con:
            con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                        (_artifact_dir(data, "Default"),))
        con.close()

    cache = Path(os.environ.get("COOPFLOW_CACHE") or data / "cache")
    create_from_template(db, cache / f"mlflow-{mlflow.__version__}-empty.db", _empty_db, point_default_here)


@functools.cache
def _schema_head() -> str:
    """The installed MLflow's newest schema revision (read from its migration scripts: ~12 ms, so once a process)."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def schema_problem(uri: str) -> str | None:
    """Why this MLflow (the installed version) cannot open the SQLite tracking store `uri` (None: it can,
    or `uri` is not a SQLite file, or the file does not exist yet: the server then creates it)."""
    if not uri.startswith("sqlite:///"):
        return None
    db = Path(uri.removeprefix("sqlite:///"))
    if not db.is_file():
        return None
    import sqlite3

    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = con.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.DatabaseError:
        return None  # no MLflow tables yet: the server initialises them
    finally:
        con.close()
    if row is None:
        return None
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    found, head = row[0], _schema_head()
    if found == head:
        return None
    import mlflow

    known = {s.revision for s in ScriptDirectory.from_config(_get_alembic_config(uri)).walk_revisions()}
    if found in known:
        return (f"{db} has an older MLflow schema ({found}) than mlflow {mlflow.__version__} ({head}); back it up, "
                f"then upgrade it with: mlflow db upgrade {uri}")
    return (f"{db} was written by a newer MLflow than the installed mlflow {mlflow.__version__} (schema revision "
            f"{found} is unknown to it), e.g. by mlflow-skinny 3.18 before coopflow pinned 3.17.2; open it with "
            f"the full mlflow of the version that wrote it, or log new runs into a fresh data dir")


MAX_TAG_VALUE = 5000
"""The longest run tag value this tracker sends (MLflow's own limit is 8000)."""

_METRIC_REFUSED = re.compile(r"[^\w\-. :/]")


def metric_name(key: str) -> str:
    """A metric key as MLflow accepts it (letters, digits, `_ - . : /` and spaces): `@` becomes `_at_` (so
    `eval/pass@1` is logged as `eval/pass_at_1`), anything else refused becomes `_`. The stored metrics tables
    and run summaries keep the original names."""
    return _METRIC_REFUSED.sub(lambda m: "_at_" if m.group() == "@" else "_", key)


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def public_params(cfg) -> dict:
    """A run config as logged to MLflow: secrets (the API key, header values other than 'env:VAR' references) are
    masked, never logged."""
    data = cfg.model_dump(mode="json")
    t = data.get("trainer") or {}
    if t.get("comparator_api_key"):
        t["comparator_api_key"] = "***"
    if t.get("comparator_api_headers"):
        t["comparator_api_headers"] = {k: v if str(v).startswith("env:") else "***"
                                       for k, v in t["comparator_api_headers"].items()}
    return data


def owner_tags() -> dict[str, str]:
    """Which process owns a run: host and pid (a later run of the same key tells a dead owner from a live one)."""
    import socket

    return {"coopflow.host": socket.gethostname(), "coopflow.pid": str(os.getpid())}


def _lost_race(err: BaseException) -> bool:
    """An MLflow write that failed only because another run wrote the same store at the same moment."""
    msg = str(err)
    return "database is locked" in msg or "UNIQUE constraint failed: datasets." in msg


def _raise_first(futures: list) -> None:
    """Wait for every future, then raise the first one's error, if any failed."""
    errors = [f.exception() for f in futures]
    err = next((e for e in errors if e is not None), None)
    if err is not None:
        raise err


class TrackingStoreError(RuntimeError):
    """The MLflow tracking store cannot be opened by the installed MLflow (e.g. a newer schema)."""


class Tracker:
    """A thin MLflow client wrapper; a disabled tracker accepts every call and does nothing."""

    def __init__(self, tracking_uri: str | None, experiment: str, enabled: bool = True,
                 artifact_location: str | None = None):
        self.enabled = enabled
        self.run_id: str | None = None
        self.lineage: list[dict] = []
        self._metrics: list = []
        self._tags: list = []
        self._writer: ThreadPoolExecutor | None = None
        self._pending: list = []
        self._tables: list[dict] = []  # the run's table artifacts (the `mlflow.loggedArtifacts` tag)
        self._tables_lock = threading.Lock()
        if not enabled:
            return
        from mlflow.tracking import MlflowClient

        problem = schema_problem(tracking_uri) if tracking_uri else None
        if problem:  # (MLflow's own error names neither the file nor what to do)
            raise TrackingStoreError(problem)
        self.client = MlflowClient(tracking_uri=tracking_uri)
        exp = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (exp.experiment_id if exp
                              else self.client.create_experiment(experiment, artifact_location=artifact_location))

    def start(self, run_name: str, tags: dict[str, str], params: dict[str, Any], run_id: str | None = None) -> str | None:
        """Create (or reopen) the run and log the params (a new run: with the tags queued so far, in one call)."""
        if not self.enabled:
            return None
        if run_id:  # continue an earlier run: its params stay; changed values are recorded as tags
            self._call(self.client.update_run, run_id, status="RUNNING")
            for k, v in owner_tags().items():  # this process owns it now
                self._call(self.client.set_tag, run_id, k, v)
            self.run_id = run_id
            earlier = self.client.get_run(run_id).data
            old = earlier.params
            self._tables = json.loads(earlier.tags.get("mlflow.loggedArtifacts", "[]"))
            from mlflow.entities import Param

            new = {k: json.dumps(v) if isinstance(v, (list, dict)) else str(v) for k, v in flatten(params).items()}
            fresh = [Param(k, v[:6000]) for k, v in sorted(new.items()) if k not in old]
            for i in range(0, len(fresh), 100):
                self._call(self.client.log_batch, run_id, params=fresh[i:i + 100])
            self.tag({f"continued.{k}": f"{old[k]} -> {v}" for k, v in new.items() if k in old and old[k] != v[:6000]})
            return run_id
        run = self._call(self.client.create_run, self.experiment_id, run_name=run_name, tags={**tags, **owner_tags()})
        self.run_id = run.info.run_id
        from mlflow.entities import Param

        items = [Param(k, json.dumps(v) if isinstance(v, (list, dict)) else str(v))
                 for k, v in sorted(flatten(params).items())]
        for i in range(0, max(len(items), 1), 100):  # tags queued before the run existed ride along
            tags, self._tags = self._tags[:100], self._tags[100:]
            self._later(self.client.log_batch, self.run_id, tags=tags,
                        params=[Param(p.key, p.value[:6000]) for p in items[i:i + 100]])
        return self.run_id

    def log_metrics(self, rows: list[dict], flush: bool = True) -> None:
        """Queue metric rows {key, value, env_step}; `flush` sends everything queued in one batch."""
        if not self.enabled:
            return
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        self._metrics += [Metric(metric_name(r["key"]), float(r["value"]), ts, int(r["env_step"])) for r in rows]
        if flush:
            self.flush()

    def tag(self, tags: dict[str, str]) -> None:
        """Queue run tags (sent with the next flush)."""
        if not self.enabled:
            return
        from mlflow.entities import RunTag

        self._tags += [RunTag(k, str(v)[:MAX_TAG_VALUE]) for k, v in tags.items()]

    def flush(self) -> None:
        """Send queued metrics and tags (MLflow's batch limits: 1000 metrics, 100 tags per call)."""
        if not self.enabled:
            return
        faults.hit("mlflow-log")
        while self._metrics or self._tags:
            ms, self._metrics = self._metrics[:900], self._metrics[900:]
            ts, self._tags = self._tags[:100], self._tags[100:]
            self._later(self.client.log_batch, self.run_id, metrics=ms, tags=ts)

    def record(self, role: str, ref: ArtifactRef, tag: bool = False) -> None:
        """Remember an artifact for lineage (and tag it when it is a main input/output)."""
        self.lineage.append({"role": role, "kind": ref.kind, "key": ref.key, "sha256": ref.sha256, "uri": ref.uri})
        if tag:
            self.tag({f"lineage.{role}": f"{ref.kind}/{ref.key}@{ref.sha256}"})

    def log_dataset(self, name: str, ref: ArtifactRef, context: str = "training") -> None:
        """The taskset as an MLflow dataset input; its digest is the artifact's sha256."""
        if not self.enabled:
            return
        from mlflow.entities import Dataset, DatasetInput, InputTag

        ds = Dataset(name=name, digest=ref.sha256[:36], source_type="local", source=json.dumps({"uri": ref.uri}))
        self._later(self.client.log_inputs, self.run_id,
                    datasets=[DatasetInput(ds, tags=[InputTag("mlflow.data.context", context)])])

    def log_files(self, files: dict[str, Any]) -> None:
        """Write JSON/bytes payloads to one temp dir and log them as run artifacts in one call."""
        if not self.enabled:
            return
        blobs = {name: payload if isinstance(payload, bytes) else json.dumps(payload, indent=1, default=str).encode()
                 for name, payload in files.items()}  # (serialised now: the payloads may change after this call)

        def write(run_id: str) -> None:
            with tempfile.TemporaryDirectory() as tmp:
                for name, blob in blobs.items():
                    p = Path(tmp) / name
                    p.parent.mkdir(parents=True, exist_ok=True)
                    p.write_bytes(blob)
                self.client.log_artifacts(run_id, tmp)

        self._later(write, self.run_id)

    def log_tables(self, tables) -> None:
        """Log tables {artifact path: (columns, rows)} as JSON artifacts the MLflow UI shows as sortable tables (the
        format of MLflow's `log_table`, listed in the run's `mlflow.loggedArtifacts` tag). A path logged again is
        replaced, never appended to, so a resumed run logs each table once. `tables` may be a function returning
        them: it then runs on the writer thread, behind the flow (reading the rows back costs ~10 ms an update)."""
        if not self.enabled:
            return

        def write(run_id: str) -> None:
            made = tables() if callable(tables) else tables
            if not made:
                return
            with tempfile.TemporaryDirectory() as tmp:
                for path, (cols, rows) in made.items():
                    p = Path(tmp) / path
                    p.parent.mkdir(parents=True, exist_ok=True)
                    p.write_text(json.dumps({"columns": cols, "data": rows}, default=str))
                self.client.log_artifacts(run_id, tmp)
            with self._tables_lock:
                known = {t["path"] for t in self._tables}
                self._tables += [{"path": p, "type": "table"} for p in made if p not in known]
                value = json.dumps(self._tables)
            if len(value) <= MAX_TAG_VALUE:  # (beyond it the tables stay readable as JSON files in the artifacts)
                self.client.set_tag(run_id, "mlflow.loggedArtifacts", value)

        self._later(write, self.run_id)

    def _later(self, fn, *args, **kwargs) -> None:
        """Run an MLflow write on the tracker's writer thread, in order, while the flow goes on (each write costs
        ~5 ms of SQLite and SQLAlchemy, ~50 ms per flow run). A write that failed is raised here, at the next
        write, or by `drain`."""
        done = [f for f in self._pending if f.done()]
        self._pending = [f for f in self._pending if not f.done()]
        _raise_first(done)
        if self._writer is None:
            self._writer = ThreadPoolExecutor(1, thread_name_prefix="mlflow-writer")
        self._pending.append(self._writer.submit(self._call, fn, *args, **kwargs))

    def drain(self) -> None:
        """Wait for every queued MLflow write; raise the first that failed (after all of them ran)."""
        pending, self._pending = self._pending, []
        _raise_first(pending)

    @staticmethod
    def _call(fn, *args, **kwargs):
        """An MLflow write, retried when it lost a race with another run writing the same store: SQLite's
        `database is locked`, or two runs logging the same taskset dataset at once (MLflow looks the dataset up,
        then inserts it: the slower insert breaks the datasets table's unique key; on retry it finds the row).
        Up to 8 times after 0.1 s, 0.2 s, ... 12.8 s (MlflowException / sqlalchemy's errors carry sqlite3's
        message)."""
        from coopflow.stages.common.retry import with_retries

        return with_retries(lambda: fn(*args, **kwargs), 8, 0.1, _lost_race)

    def dead_runs(self, run_key: str) -> list[str]:
        """Runs of this run key still marked RUNNING whose process is gone (killed on this machine), oldest first."""
        if not self.enabled:
            return []
        runs = self.client.search_runs([self.experiment_id], f"tags.`coopflow.run_key` = '{run_key}' and "
                                       "attributes.status = 'RUNNING'", order_by=["attributes.start_time ASC"])
        host = owner_tags()["coopflow.host"]
        out = []
        for r in runs:
            t = r.data.tags
            pid = t.get("coopflow.pid", "")
            if t.get("coopflow.host") == host and pid.isdigit() and not process_alive(int(pid)):
                out.append(r.info.run_id)
        return out

    def finished_run(self, run_key: str, since_ms: int) -> str | None:
        """The newest run of this run key that finished after `since_ms` (epoch ms), if any."""
        if not self.enabled:
            return None
        runs = self.client.search_runs([self.experiment_id], f"tags.`coopflow.run_key` = '{run_key}' and "
                                       "attributes.status = 'FINISHED'", order_by=["attributes.end_time DESC"],
                                       max_results=1)
        return runs[0].info.run_id if runs and (runs[0].info.end_time or 0) >= since_ms else None

    def mark_killed(self, run_id: str) -> None:
        """Close a run whose process died (MLflow's KILLED status)."""
        if self.enabled:
            self._call(self.client.set_terminated, run_id, status="KILLED")

    def finish(self, ok: bool) -> None:
        """Send what is queued, wait for every write, then mark the run FINISHED (FAILED when not `ok`). A failed
        write fails a run that was ok (its error is raised); a run already failing keeps its own error."""
        if not (self.enabled and self.run_id):
            return
        try:
            self.flush()
            self.drain()
        except Exception as err:
            self._call(self.client.set_terminated, self.run_id, status="FAILED")
            if ok:
                raise
            logging.getLogger(__name__).warning("MLflow logging of failed run %s failed too: %s", self.run_id, err)
            return
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)
                self._writer = None
        self._call(self.client.set_terminated, self.run_id, status="FINISHED" if ok else "FAILED")
