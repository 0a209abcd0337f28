"""MLflow tracking for flow runs: one MLflow run per flow run, always addressed by explicit run_id.

What a run holds:
- params: the full resolved config, flattened to dotted keys;
- metrics keyed by `env_step` with the reference's names (`turn_1/reward_mean`,
  `turn_1/expected_return`, `eval/turn_1/...`) plus `timing/*` per stage and tokens/s;
- artifacts: `reward_curve.png`, `rollout_samples.json`, `lineage.json`, `summary.json`, `config.json`;
- lineage: a tag `lineage.<role>` = `<kind>/<key>@<sha256>` for each main input/output artifact,
  the taskset as an MLflow dataset input whose digest is the artifact's sha256, and every artifact
  of the run (rollouts, scores, advantages, checkpoints, eval) in `lineage.json`.
"""

import json
import os
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from artifacts import ArtifactRef, faults
from artifacts.store import process_alive
from artifacts.templates import create_from_template


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
    from mlflow.store.db.utils import _get_alembic_config, _get_latest_schema_revision

    found, head = row[0], _get_latest_schema_revision()
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


def owner_tags() -> dict[str, str]:
    """Which process owns a run: host and pid (a later run of the same key tells a dead owner from a live one)."""
    import socket

    return {"coopflow.host": socket.gethostname(), "coopflow.pid": str(os.getpid())}


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
        """Create (or reopen) the run and log the params."""
        if not self.enabled:
            return None
        if run_id:  # continue an earlier run: its params stay; changed values are recorded as tags
            self._call(self.client.update_run, run_id, status="RUNNING")
            for k, v in owner_tags().items():  # this process owns it now
                self._call(self.client.set_tag, run_id, k, v)
            self.run_id = run_id
            old = self.client.get_run(run_id).data.params
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
        for i in range(0, len(items), 100):
            self._call(self.client.log_batch, self.run_id, params=[Param(p.key, p.value[:6000]) for p in items[i:i + 100]])
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

        self._tags += [RunTag(k, str(v)[:5000]) for k, v in tags.items()]

    def flush(self) -> None:
        """Send queued metrics and tags (MLflow's batch limits: 1000 metrics, 100 tags per call)."""
        if not self.enabled:
            return
        faults.hit("mlflow-log")
        while self._metrics or self._tags:
            ms, self._metrics = self._metrics[:900], self._metrics[900:]
            ts, self._tags = self._tags[:100], self._tags[100:]
            self._call(self.client.log_batch, self.run_id, metrics=ms, tags=ts)

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
        self.client.log_inputs(self.run_id, datasets=[DatasetInput(ds, tags=[InputTag("mlflow.data.context", context)])])

    def log_files(self, files: dict[str, Any]) -> None:
        """Write JSON/bytes payloads to one temp dir and log them as run artifacts in one call."""
        if not self.enabled:
            return
        with tempfile.TemporaryDirectory() as tmp:
            for name, payload in files.items():
                p = Path(tmp) / name
                p.parent.mkdir(parents=True, exist_ok=True)
                if isinstance(payload, bytes):
                    p.write_bytes(payload)
                else:
                    p.write_text(json.dumps(payload, indent=1, default=str))
            self.client.log_artifacts(self.run_id, tmp)

    @staticmethod
    def _call(fn, *args, **kwargs):
        """An MLflow write, retried when SQLite reports `database is locked` (other runs writing the same store):
        up to 8 times after 0.1 s, 0.2 s, ... 12.8 s (MlflowException / sqlalchemy's OperationalError carry
        sqlite3's message)."""
        from stages.common.retry import with_retries

        return with_retries(lambda: fn(*args, **kwargs), 8, 0.1, lambda err: "database is locked" in str(err))

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
        if self.enabled and self.run_id:
            self.flush()
            self._call(self.client.set_terminated, self.run_id, status="FINISHED" if ok else "FAILED")


def reward_curve_png(env_steps: list[int], rewards: list[float], title: str) -> bytes:
    """A small PNG of the training reward curve (matplotlib's Figure + Agg canvas, no pyplot)."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(env_steps, rewards, marker=".", linewidth=1)
    ax.set_xlabel("env_step")
    ax.set_ylabel("turn_1/reward_mean")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


class CurvePNG:
    """Render the reward-curve PNG in a background thread (it overlaps with evaluation)."""

    def __init__(self, steps: list[dict], title: str):
        self.png: bytes | None = None
        self._t = threading.Thread(target=self._render, args=(steps, title), daemon=True)
        self._t.start()

    def _render(self, steps: list[dict], title: str) -> None:
        self.png = reward_curve_png([s["env_step"] for s in steps], [s["reward_mean"] for s in steps], title)

    def result(self) -> bytes | None:
        self._t.join()
        return self.png
