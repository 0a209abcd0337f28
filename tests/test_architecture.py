"""The layering the README describes, checked on the source: one import package (`coopflow`, whose parts keep
their folders at the repository's top), no import cycle, no Prefect or MLflow in stages/, stages/ only in
subpackages, and the lower layers never import the higher ones."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PARTS = ("artifacts", "schemas", "stages", "flows")
"""Folders at the repository's top that install as `coopflow.<part>` (pyproject's package-dir)."""
LAYER = {"schemas": 0, "artifacts": 1, "stages": 2, "flows": 3, "facade": 3}


def _modules() -> dict[str, Path]:
    """Every module of the `coopflow` package by its import name, from the folders it is installed from."""
    out = {}
    for folder, prefix in [(p, ("coopflow", p)) for p in PARTS] + [("coopflow", ("coopflow",))]:
        for p in (REPO / folder).rglob("*.py"):
            name = ".".join(prefix + p.relative_to(REPO / folder).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = p
    return out


def _layer(module: str) -> int:
    """schemas < artifacts < stages < flows = the Python API facade (coopflow.trainers, coopflow.envs, ...)."""
    part = module.split(".")[1] if module.count(".") else ""
    return LAYER[part if part in PARTS else "facade"]


def _runtime_imports(path: Path) -> set[str]:
    """Every module named by an import that runs (anywhere in the file, except under `if TYPE_CHECKING:`)."""
    found, stack = set(), [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update([node.module] + [f"{node.module}.{a.name}" for a in node.names])
        stack.extend(ast.iter_child_nodes(node))
    return found


def _graph(typing_too: bool = False) -> dict[str, set[str]]:
    mods = _modules()
    names = (lambda p: _runtime_imports(p) | _all_imports(p)) if typing_too else _runtime_imports

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    return {m: {t for t in map(resolve, names(p)) if t and t != m} for m, p in mods.items()}


def test_no_import_cycle():
    """Not even through imports made only for type checking."""
    graph, state, cycles = _graph(typing_too=True), {}, []
    assert "coopflow.stages.loops.run" in graph  # the walk sees the installed names

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for t in sorted(graph[m]):
            if state.get(t) == "open":
                cycles.append(path[path.index(t):] + [t])
            elif t not in state:
                visit(t, path + [t])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == [], cycles


def test_stages_import_neither_prefect_nor_mlflow():
    for p in (REPO / "stages").rglob("*.py"):
        bad = {m for m in _runtime_imports(p) if m.split(".")[0] in ("prefect", "mlflow")
               or (m.startswith("coopflow.") and _layer(m) > LAYER["stages"])}
        assert not bad, f"{p.relative_to(REPO)} imports {sorted(bad)}"


def test_lower_layers_never_import_higher_ones():
    for m, targets in _graph().items():
        for t in targets:
            assert _layer(t) <= _layer(m), f"{m} imports {t}"


def test_one_import_package():
    """Our own code is imported as `coopflow.<part>` only: never by a part's folder name (from a checkout's root
    `import stages` would load a second copy of the same files)."""
    for name, p in _modules().items():
        bad = {m for m in _runtime_imports(p) | _all_imports(p) if m.split(".")[0] in PARTS}
        assert not bad, f"{p.relative_to(REPO)} imports {sorted(bad)}"


def _all_imports(path: Path) -> set[str]:
    """Every module an import statement names (type-checking ones too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_stages_tree_is_the_pipeline():
    """stages/ holds only phase subpackages (no flat modules beside them)."""
    top = sorted(p.name for p in (REPO / "stages").iterdir() if p.suffix == ".py" or
                 (p.is_dir() and (p / "__init__.py").is_file()))
    assert top == ["__init__.py", "agents", "common", "evaluate", "fit", "loops", "operations", "planning",
                   "rollout", "score", "tasks", "update"]


STAGE_LEVEL = {"common": 0, "agents": 1, "tasks": 2, "rollout": 2, "score": 2, "fit": 2, "update": 2, "evaluate": 2,
               "planning": 3, "loops": 4, "operations": 5}
"""The rooms inside stages/, lowest first: shared helpers, the model machinery, the pipeline's phases, run planning
(context, plan, inputs, keys, budget, session), the algorithm drivers (segment and round loops), operations
(preflight, gc). A room imports its own level and below (phases use each other where the pipeline needs it)."""


def test_rooms_inside_stages_depend_downwards_only():
    assert set(STAGE_LEVEL) == {p.name for p in (REPO / "stages").iterdir() if (p / "__init__.py").is_file()}
    bad = []
    for m, p in _modules().items():
        if not m.startswith("coopflow.stages.") or m.count(".") < 3:
            continue
        room = m.split(".")[2]
        for t in _runtime_imports(p) | _all_imports(p):
            if t.startswith("coopflow.stages.") and t.count(".") >= 2:
                other = t.split(".")[2]
                if other in STAGE_LEVEL and STAGE_LEVEL[other] > STAGE_LEVEL[room]:
                    bad.append(f"{m} imports {t}")
    assert bad == [], bad


def test_no_module_level_live_state_in_stages():
    """No module global holds live models or counters (they belong to a run's Session)."""
    for p in (REPO / "stages").rglob("*.py"):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                name = getattr(node.value.func, "id", getattr(node.value.func, "attr", ""))
                assert name not in ("Counter", "LivePolicies", "Session", "Policies"), \
                    f"{p.relative_to(REPO)}: module-level {name}()"


PROBE_ALLOWED = {
    # (file, object): getattr-with-a-default on something that is not a config model, though the attribute's name
    # is also a config field's
    ("flows/cli.py", "args"): "argparse namespace: not every subcommand has --data-dir",
    ("stages/agents/models.py", "policies"): "a policy group: only MAAC's holds a central critic",
    ("stages/score/rewards.py", "fn"): "a reward function's set_reward_range attribute",
    ("stages/score/rewards.py", "getattr(fn, 'func', None)"): "a partial's reward function",
    ("stages/score/scores.py", "caller"): "a reward caller's name",
    ("stages/tasks/envs/expert.py", "self.tok"): "a Hugging Face tokenizer",
    ("stages/tasks/formatters.py", "tokenizer"): "a Hugging Face tokenizer",
    ("coopflow/_facade.py", "self.reward_func"): "the user's reward function",
    ("coopflow/utils/reference_kl.py", "args"): "the reference's helper API (comlrl.utils.reference_kl) takes any "
                                               "args object, e.g. a SimpleNamespace",
}


def test_config_fields_are_read_not_probed():
    """Code reads a config's fields directly (`t.joint_mode`): no `getattr(obj, "<field>", default)` for a field some
    model in coopflow.schemas.config declares. A config whose algorithm has one fixed value answers with a property
    (e.g. the actor-critic configs' joint_mode), so a misspelt or removed field fails loudly instead of silently
    taking a default."""
    from pydantic import BaseModel

    import coopflow.schemas.config as C

    fields = {f for m in vars(C).values() if isinstance(m, type) and issubclass(m, BaseModel) for f in m.model_fields}
    found = []
    for folder in ("flows", "stages", "coopflow", "schemas"):
        for p in sorted((REPO / folder).rglob("*.py")):
            rel = p.relative_to(REPO).as_posix()
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                        and len(node.args) == 3 and isinstance(node.args[1], ast.Constant) \
                        and node.args[1].value in fields and (rel, ast.unparse(node.args[0])) not in PROBE_ALLOWED:
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "read these fields directly (give the configs without the field a property):\n" + \
        "\n".join(found)
