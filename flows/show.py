"""`coopflow show` and `coopflow export`: a run's joint answers in the terminal or as one file.

Both read the store only (`coopflow.stages.operations.rollouts` joins a run's rollouts, scores and advantages, as
for `coopflow.rollouts()`): no model, no config, no server. `show` prints one block per joint action: each agent's completion side by side, with the joint
reward and each completion's advantage; `--compare` puts one item's answers at the first and the last update side
by side.
"""

import shutil
import sys
import textwrap
from pathlib import Path

from coopflow.stages.operations import rollouts as R
from coopflow.stages.operations.rollouts import open_run, select_updates

MAX_LINES = 8
"""Lines of one completion shown per cell (the rest is elided; `coopflow export` has it all)."""


def printable(text: str) -> str:
    """A completion as one displayable string: newlines as ⏎, other control characters as '·'."""
    text = text.replace("\r\n", "\n").replace("\n", " ⏎ ").replace("\t", " ")
    return "".join(c if c.isprintable() else "·" for c in text)


def _cells(texts: list[str], width: int) -> list[str]:
    """Side-by-side columns of wrapped `texts`, each `width` wide, as lines."""
    cols = []
    for t in texts:
        lines = textwrap.wrap(printable(t), width) or [""]
        if len(lines) > MAX_LINES:
            lines = lines[:MAX_LINES - 1] + [lines[MAX_LINES - 1][:width - 1] + "…"]
        cols.append(lines)
    depth = max(len(c) for c in cols)
    return [" │ ".join(c[i].ljust(width) if i < len(c) else " " * width for c in cols).rstrip() for i in range(depth)]


def _width(n_cols: int) -> int:
    total = shutil.get_terminal_size((120, 24)).columns
    return max(20, (total - 3 * (n_cols - 1)) // n_cols)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:+.3f}" if isinstance(v, float) else str(v)


def _joint(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows grouped by joint action (update, turn, node, joint), agents in order."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault((r["update"], r["turn"], r["node_id"], r["joint"]), []).append(r)
    return {k: sorted(v, key=lambda r: r["agent"]) for k, v in out.items()}


def render_joint(rows: list[dict], sort: str | None, limit: int) -> list[str]:
    """One block per joint action: a header (update, item, turn, joint, reward) and the agents' completions."""
    groups = list(_joint(rows).values())
    if sort in ("reward", "-reward"):
        groups.sort(key=lambda g: g[0]["reward"], reverse=sort == "-reward")
    out = []
    for g in groups[:limit]:
        r0 = g[0]
        width = _width(len(g))
        out.append(f"update {r0['update']} · item {r0['item_id']} · turn {r0['turn'] + 1} · joint {r0['joint']} · "
                   f"reward {r0['reward']:.4f} · env_step {r0['env_step']}")
        out.append(" │ ".join((f"agent {r['agent']} · advantage {_fmt(r['advantage'])}"
                                + (f" · own reward {r['agent_reward']:.3f}" if r["agent_reward"] is not None else "")
                                )[:width].ljust(width) for r in g).rstrip())
        out += _cells([r["completion"] for r in g], width)
        out.append("")
    if len(groups) > limit:
        out.append(f"({len(groups) - limit} more joint actions: --limit N shows more, coopflow export writes all)")
    return out


def render_eval(rows: list[dict], sort: str | None, limit: int) -> list[str]:
    """One block per evaluated joint answer (item, sample, turn)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["item_id"], r["sample"], r["turn"]), []).append(r)
    items = [sorted(g, key=lambda r: r["agent"]) for g in groups.values()]
    if sort in ("reward", "-reward"):
        items.sort(key=lambda g: g[0]["reward"], reverse=sort == "-reward")
    out = []
    for g in items[:limit]:
        r0 = g[0]
        out.append(f"eval · item {r0['item_id']} · sample {r0['sample']} · turn {r0['turn'] + 1} · "
                   f"reward {r0['reward']:.4f}")
        out.append(" │ ".join(f"agent {r['agent']}".ljust(_width(len(g))) for r in g).rstrip())
        out += _cells([r["completion"] for r in g], _width(len(g)))
        out.append("")
    if len(items) > limit:
        out.append(f"({len(items) - limit} more evaluated answers: --limit N shows more)")
    return out


def render_compare(first: list[dict], last: list[dict]) -> list[str]:
    """One item's first joint action at the first and at the last update, side by side per agent."""
    a, b = _joint(first), _joint(last)
    ga, gb = next(iter(a.values())), next(iter(b.values()))
    width = _width(2)
    out = [f"item {ga[0]['item_id']}: update {ga[0]['update']} (reward {ga[0]['reward']:.4f})".ljust(width) + " │ " +
           f"update {gb[0]['update']} (reward {gb[0]['reward']:.4f})", ""]
    for ra, rb in zip(ga, gb):
        out.append(f"agent {ra['agent']} · advantage {_fmt(ra['advantage'])}".ljust(width) + " │ " +
                   f"agent {rb['agent']} · advantage {_fmt(rb['advantage'])}")
        out += _cells([ra["completion"], rb["completion"]], width)
        out.append("")
    return out


def show(args) -> int:
    """`coopflow show [RUN]`."""
    store, info = open_run(args.run, args.data_dir)
    head = (f"run {info.key} · {info.updates} updates · {info.env_steps} env steps · "
            f"store {store.root}")
    if info.preference:
        head += ("\na preference run: each pair is two joint actions, its chosen answers (joint 0) and its "
                 "rejected ones (joint 1), with the task reward that ranked them")
    if args.eval:
        rows = R.eval_rows(store, info)
        if args.item is not None:
            rows = [r for r in rows if r["item_id"] == args.item]
        if not rows:
            print(f"{head}\nno evaluation of this run's final checkpoint is stored (or none for item {args.item})",
                  file=sys.stderr)
            return 1
        lines = render_eval(rows, args.sort, args.limit)
    elif args.compare:  # the item's first and last training update
        rows = R.joint_rows(store, info)
        item = args.item if args.item is not None else rows[0]["item_id"]
        mine = [r for r in rows if r["item_id"] == item]
        ups = sorted({r["update"] for r in mine})
        if len(ups) < 2:
            print(f"item {item} was trained in {'one update' if ups else 'no update'} of run {info.key[:12]}"
                  f"{f' ({ups[0]})' if ups else ''}: nothing to compare (an item is trained once per epoch)",
                  file=sys.stderr)
            return 1
        lines = render_compare([r for r in mine if r["update"] == ups[0]], [r for r in mine if r["update"] == ups[-1]])
    else:
        upd = select_updates(store, info, args.update if args.update is not None else "last")
        rows = R.joint_rows(store, info, upd)
        if args.item is not None:
            rows = [r for r in rows if r["item_id"] == args.item]
        if not rows:
            print(f"{head}\nno joint action of item {args.item} in update(s) {upd}", file=sys.stderr)
            return 1
        lines = render_joint(rows, args.sort, args.limit)
    print(head + "\n")
    print("\n".join(lines).rstrip())
    return 0


def export(args) -> int:
    """`coopflow export RUN --out FILE.parquet | DIR`."""
    from coopflow.artifacts.export import export_dataset, export_parquet

    store, info = open_run(args.run, args.data_dir)
    rows = R.eval_rows(store, info) if args.eval else R.joint_rows(store, info)
    cols = R.EVAL_COLUMNS if args.eval else R.COLUMNS
    out = Path(args.out)
    if out.suffix == ".parquet":
        export_parquet(out, rows, cols)
        how = f"pandas.read_parquet('{out}') or datasets.load_dataset('parquet', data_files='{out}')"
    else:
        export_dataset(out, rows, cols)
        how = f"datasets.load_from_disk('{out}')"
    print(f"{len(rows)} rows of run {info.key} -> {out} (load with {how})")
    return 0
