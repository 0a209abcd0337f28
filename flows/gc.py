"""`coopflow gc`: the recorded runs of a data dir (MLflow) as gc roots, and the report a person reads.

A recorded run is an MLflow run in the data dir's tracking store that coopflow logged: its `coopflow.run_key` tag
names its final checkpoint, its `lineage.*` tags and `lineage.json` artifact every artifact it read or wrote.
What to keep and delete given those roots is `stages.operations.gc`.
"""

import json
import tempfile
import time
from pathlib import Path

from coopflow.artifacts import ArtifactStore
from coopflow.stages.agents.checkpoint import policy_key_of
from coopflow.stages.planning.budget import human_bytes as human
from coopflow.stages.operations.gc import GcPlan, Roots, apply_gc, plan_gc


def recorded_roots(data: Path, tracking_uri: str | None = None) -> tuple[Roots, list[str]]:
    """The roots of every coopflow run recorded in MLflow (`tracking_uri`, default the data dir's SQLite store),
    and notes for the report (killed runs whose partial work is not protected)."""
    db = data / "mlflow.db"
    if tracking_uri is None and not db.is_file():
        return Roots(), [f"no MLflow store at {db}: no recorded runs"]
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    from coopflow.artifacts.store import process_alive

    client = MlflowClient(tracking_uri=tracking_uri or f"sqlite:///{db}")
    exps = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ALL)]
    arts: set[tuple[str, str]] = set()
    finals: set[str] = set()
    runs, killed, token = 0, 0, None
    while exps:
        page = client.search_runs(exps, "", run_view_type=ViewType.ACTIVE_ONLY, max_results=1000, page_token=token)
        for run in page:
            tags = run.data.tags
            mine = {k: v for k, v in tags.items() if k.startswith("lineage.")}
            if "coopflow.run_key" not in tags and not mine:
                continue  # not a coopflow run
            runs += 1
            if "coopflow.run_key" in tags:
                finals.add(policy_key_of(tags["coopflow.run_key"]))
            for v in mine.values():  # "<kind>/<key>@<sha256>"
                kind, _, rest = v.partition("/")
                arts.add((kind, rest.split("@")[0]))
            for entry in _lineage_file(client, run.info.run_id, run.info.artifact_uri):
                arts.add((entry["kind"], entry["key"]))
                if entry.get("role") == "checkpoint.final":
                    finals.add(policy_key_of(entry["key"]))
            pid = tags.get("coopflow.pid")
            if run.info.status == "RUNNING" and pid and pid.isdigit() and not process_alive(int(pid)):
                killed += 1
        token = page.token
        if not token:
            break
    notes = [f"{killed} killed run(s) (MLflow RUNNING, process gone): their unfinished work counts as unneeded; "
             "rerun them before gc to keep it"] if killed else []
    return Roots(frozenset(arts), frozenset(finals), runs), notes


def _lineage_file(client, run_id: str, artifact_uri: str | None) -> list[dict]:
    """A run's `lineage.json` artifact (empty when it has none: a run killed before its end)."""
    import os
    from urllib.parse import unquote, urlparse

    if artifact_uri and artifact_uri.startswith("file:"):  # the default store: read the file where it is
        f = Path(unquote(urlparse(artifact_uri).path)) / "lineage.json"
        try:
            return json.loads(f.read_text()) if f.is_file() else []
        except (OSError, ValueError):
            return []
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    try:
        if not any(f.path == "lineage.json" for f in client.list_artifacts(run_id)):
            return []
        with tempfile.TemporaryDirectory() as tmp:
            return json.loads(Path(client.download_artifacts(run_id, "lineage.json", tmp)).read_text())
    except Exception:  # an unreadable artifact store: the tags still name the main artifacts
        return []


def report(plan: GcPlan, keep_optimizer: str, grace_min: float) -> list[str]:
    """The plan as lines: per kind what goes, the optimizer state dropped, what stays, the total."""
    lines = []
    kinds = plan.by_kind()
    if kinds:
        lines.append("unneeded by every recorded run (no run's final checkpoint or lineage needs them):")
        lines += [f"  {kind:<12} {n:>5}  {human(b):>10}" for kind, (n, b) in sorted(kinds.items())]
    else:
        lines.append("unneeded artifacts: none")
    if plan.drop_optimizer:
        which = "non-final checkpoints" if keep_optimizer == "last" else "checkpoints"
        lines.append(f"optimizer state of {len(plan.drop_optimizer)} {which} (--keep-optimizer {keep_optimizer}): "
                     f"{human(sum(b for _, b in plan.drop_optimizer))}")
    kept_n = sum(n for n, _ in plan.kept.values())
    lines.append(f"kept: {kept_n} artifacts, {human(sum(b for _, b in plan.kept.values()))}"
                 + (f" ({', '.join(f'{k} {human(b)}' for k, (_, b) in sorted(plan.kept.items()) if b)})"
                    if plan.kept else ""))
    if plan.protected:
        lines.append(f"left alone: {plan.protected} unneeded artifacts written by a running run or in the last "
                     f"{grace_min:g} min (--grace-minutes)")
    lines.append(f"total to free: {human(plan.bytes)}")
    return lines


def gc(data: Path, yes: bool = False, keep_optimizer: str = "all", grace_min: float = 60.0,
       tracking_uri: str | None = None, out=print) -> int:
    """Plan (and with `yes` carry out) a gc of the data dir `data`; prints the report via `out`; exit code."""
    store = ArtifactStore.at(data)  # (local only: gc never deletes from the remote)
    started = time.time()
    roots, notes = recorded_roots(data, tracking_uri)
    plan = plan_gc(store, roots, keep_optimizer, grace_min * 60, started)
    out(f"coopflow gc: {data} ({roots.runs} recorded run(s))")
    for line in report(plan, keep_optimizer, grace_min) + [f"note: {n}" for n in notes]:
        out(line)
    if keep_optimizer == "all":
        extra = sum(b for _, b, final in plan.slimmable if not final)  # what --keep-optimizer last would drop
        if extra:
            out(f"hint: --keep-optimizer last would also free {human(extra)} (optimizer state of non-final "
                "checkpoints; resuming from them replays their segment's stored updates)")
    if not yes:
        out("dry run: nothing was changed; rerun with --yes to delete")
        return 0
    if roots.runs == 0 and plan.delete:
        out("refused: no recorded runs, so every run artifact would go (runs with tracking.enabled: false are not "
            "recorded); delete artifact directories by hand instead")
        return 2
    n, freed = apply_gc(store, plan, started)
    out(f"done: {n} artifacts deleted or slimmed, {human(freed)} freed")
    return 0
