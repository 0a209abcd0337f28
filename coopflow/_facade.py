"""The Python API: CoMLRL 1.4.3's trainer classes as a thin facade over coopflow's stages.

A trainer takes the reference's constructor arguments, validates them with the reference's error
phrases, loads the agents (and critics / frozen references) so the public attributes exist, and on
`.train()` turns itself into a coopflow run config and runs the same stages the Prefect flows run:

- in-memory functions (reward, processor, formatters, transition, metrics callback) are registered
  under a fingerprint of their qualified name and source (`mem:<sha>`), so artifact keys change
  when the function does;
- in-memory datasets are stored once as a `dataset` artifact keyed by their fingerprints
  (`save_to_disk`), in-memory models as a `model` artifact keyed by their weights; string sources are
  used as they are, so a trainer and a flow with the same config and seed produce the same artifact keys;
- `wandb_config` maps onto MLflow: `project` → experiment, `name` → run name, `tags` → run tags.

After training the trained weights are copied into `trainer.agents` (as the reference trains its
agents in place) and `save_model(dir)` writes the reference's layout.
"""

import copy
import hashlib
from pathlib import Path
from typing import Any

import torch

from coopflow.artifacts import ArtifactStore, key_for
from coopflow.schemas.config import RunConfig, validate_config

__all__ = ["FacadeTrainer", "callable_ref"]


def callable_ref(fn, builtins: dict | None = None) -> str:
    """How a config names an in-process function: a built-in's name, its import path when it is a module-level
    function of an importable module (so flows and deployments can load it too), else 'mem:<fingerprint>'."""
    import importlib

    from coopflow.stages.common.user_code import register_callable

    for name, b in (builtins or {}).items():
        if fn is b:
            return name
    mod, qual = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if mod and mod != "__main__" and qual and "<" not in qual and "." not in qual:
        try:
            if getattr(importlib.import_module(mod), qual, None) is fn:
                return f"{mod}:{qual}"
        except ImportError:
            pass
    return register_callable(fn)


def _is_model(x) -> bool:
    return hasattr(x, "state_dict") and hasattr(x, "save_pretrained")


def _weights_sha(model) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(-1).view(dtype=torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _tagged():
    from coopflow.trainers.preference.centralized import TaggedCentralizedComparatorAdapter

    return TaggedCentralizedComparatorAdapter()


class FacadeTrainer:
    """Shared constructor, train, evaluate and save for every trainer class (composition, not a hierarchy).

    Subclasses set `algorithm` (a coopflow algorithm name) and `config_class` (the pydantic config)."""

    algorithm = "magrpo"
    config_class: type = None  # set by each public trainer class

    def __init__(self, agent_model: str | Any = None, agents: list | None = None, num_agents: int | None = None,
                 tokenizer=None, model_config: dict | None = None, train_dataset=None, eval_dataset=None,
                 dataset_type: str | None = None, reward_func=None, reward_processor=None, formatters=None,
                 external_transition=None, wandb_config: dict | None = None, eval_logger=None, eval_aggregator=None,
                 metrics_callback=None, args=None, critic_model: str | Any = None, critics: list | None = None,
                 data_dir: str | None = None, seed: int = 0, centralized_adapter=None,
                 centralized_comparator_adapter=None, model: str | Any = None):
        from coopflow.flows.env import configure
        from coopflow.stages.score.rewards import BUILTIN_REWARDS

        if model is not None:  # `model=`: the reference README's name for agent_model
            if agent_model is not None:
                raise ValueError("pass the agent model once: model= and agent_model= name the same argument")
            agent_model = model

        configure(data_dir)  # embedded defaults (Prefect home, MLflow DB) under the data dir, before Prefect loads
        self.args = args if args is not None else self.config_class()
        if not isinstance(self.args, self.config_class):
            raise TypeError(f"args must be a {self.config_class.__name__}, got {type(self.args).__name__}")
        # num_agents: the argument, else args.num_agents when set explicitly, else 2 (the reference's default)
        args_n = self.args.num_agents if "num_agents" in self.args.model_fields_set else None
        self.centralized = self.args.collaboration_mode == "centralized"
        adapter = centralized_adapter if centralized_adapter is not None else centralized_comparator_adapter
        if self.centralized:  # one joint actor writes the N roles (num_agents counts the roles)
            actors = list(agents) if agents is not None else ([agent_model] if agent_model is not None else [])
            if len(actors) != 1:
                raise ValueError(f"centralized collaboration trains exactly one actor (the joint policy); got "
                                 f"{len(actors)} agent models")
            roles = num_agents if num_agents is not None else (args_n or 2)
            if args_n is not None and roles != args_n:
                raise ValueError(f"conflict: args.num_agents={args_n} roles but num_agents={roles}")
            agents, agent_model = (actors, None) if agents is not None else (None, agent_model)
            num_agents = 1
            args_n = None
        # --- the reference's argument checks, in its order and with its phrases
        if reward_func is None or not callable(reward_func):
            raise ValueError("reward_func must be a callable that scores the agents' joint completions")
        if agent_model is None and not agents:
            raise ValueError("Either agent_model or agents must be provided")
        if agents is not None and agent_model is not None:
            if isinstance(agent_model, str) and (len(agents) != num_agents or any(a != agent_model for a in agents)):
                raise ValueError("conflict between agent_model and agents: agents must list num_agents copies of "
                                 "agent_model (or drop agent_model for heterogeneous agents)")
        if agents is None and not isinstance(agent_model, str) and num_agents > 1:
            raise ValueError("agent_model should be a string to create homogeneous agents (a pretrained identifier "
                             "string or directory); pass model objects as agents=[...]")
        if num_agents is None:
            num_agents = args_n or 2
        n = len(agents) if agents is not None and agent_model is None else num_agents
        if args_n is not None and args_n != n:
            raise ValueError(f"conflict: args.num_agents={args_n} but {n} agents were given")
        roles = roles if self.centralized else n
        self._check_critic_flag(critic_model, critics)
        objects = agents is not None and any(_is_model(a) for a in agents)
        toks = tokenizer if isinstance(tokenizer, (list, tuple)) else None
        if toks is not None and len(toks) != n:
            raise ValueError(f"tokenizers length {len(toks)} does not match num_agents {n}")
        if objects and tokenizer is None:
            raise ValueError("agents given as model objects need tokenizer (one, or a list of num_agents)")
        if self.args.num_turns > 1 and external_transition is None:
            raise ValueError("num_turns > 1 requires an external_transition(prompt=..., agent_completions=..., "
                             "num_agents=..., prompt_history_per_agent=..., response_history_per_agent=...)")
        self._check_critics(critic_model, critics, n)
        if formatters is not None and isinstance(formatters, (list, tuple)) and len(formatters) != roles:
            raise ValueError(f"formatters length {len(formatters)} does not match num_agents {roles}")
        rdev = self.args.reference_devices
        if isinstance(rdev, (list, tuple)) and len(rdev) not in (1, n):
            raise ValueError(f"reference_devices length ({len(rdev)}) must be 1 or {n}.")
        if adapter is not None:
            from coopflow.stages.tasks.centralized import check_adapter

            check_adapter(adapter, type(adapter).__name__)

        # --- what the run config will reference
        self.num_agents = n  # trained policies (1 under centralized collaboration)
        self.num_roles = roles
        self.centralized_adapter = adapter
        if self.centralized:  # the reward as the joint actor sees it: split into roles, scored by the task reward
            from coopflow.trainers.preference.collaboration import CentralizedCollaboration

            self.centralized_adapter = adapter if adapter is not None else _tagged()
            reward_func = CentralizedCollaboration(self.centralized_adapter, formatters, reward_func, roles)
        self._centralized_eval_items: list = []
        self.verbose, self.env_step = True, 0
        self.model_config = dict(model_config or {})
        self.train_dataset, self.eval_dataset, self.dataset_type = train_dataset, eval_dataset, dataset_type
        self.reward_func, self.reward_processor = reward_func, reward_processor
        self.formatters, self.external_transition = formatters, external_transition
        self.wandb_config, self.metrics_callback = dict(wandb_config or {}), metrics_callback
        self.eval_logger, self.eval_aggregator = eval_logger, eval_aggregator
        self.data_dir, self.seed = data_dir, seed
        task = reward_func.reward_func if self.centralized else reward_func
        self._reward_name = callable_ref(task, BUILTIN_REWARDS)
        self._critic_src = critic_model
        self._critics_src = critics
        self._last: dict | None = None

        # --- load what the public attributes expose (no tokenizer call, no generation)
        from coopflow.stages.agents.models import load_agent
        from coopflow.stages.agents.state import adamw

        dtype = self._dtype()
        if agents is not None and agent_model is None:
            items = list(agents)
        else:
            items = [agent_model] * n
        self.agents, self.tokenizers, self._sources = [], [], []
        for i, a in enumerate(items):
            if _is_model(a):
                tok = toks[i] if toks is not None else tokenizer
                self.agents.append(a)
                self.tokenizers.append(tok)
                self._sources.append(None)  # snapshotted to a directory at train time
            else:
                src = str(a)
                given = toks[i] if toks is not None else tokenizer
                model, tok = load_agent(self._load_source(src), dtype, self._attn(), tokenizer=given)
                self.agents.append(model)
                self.tokenizers.append(tok)
                self._sources.append(src)
        self.optimizers = [adamw([p for p in m.parameters() if p.requires_grad], self.args.agent_learning_rate)
                           for m in self.agents]
        self.reference_models = []
        if self.args.reference_kl_enabled:
            for m in self.agents:
                ref = copy.deepcopy(m).eval()
                ref.requires_grad_(False)
                self.reference_models.append(ref)
        self.critics, self.critic_optimizers = self._load_critics(n, dtype)
        from coopflow.utils.model_loading import infer_model_name

        self.model_name = infer_model_name(agent_model if agent_model is not None else items[0])
        self.agent_devices = [next(m.parameters()).device for m in self.agents]
        self.device = self.agent_devices[0]

    @property
    def agent_models(self) -> list:
        """The agents' models (the same objects as `agents`; trained in place by `train()`)."""
        return self.agents

    # --- critics (IAC / MAAC override) --------------------------------------------------------------

    def _check_critic_flag(self, critic_model, critics) -> None:
        """Critic sources the trainer's critic setting rules out (checked first, as the reference does)."""

    def _check_critics(self, critic_model, critics, n: int) -> None:
        if critic_model is not None or critics:
            raise ValueError(f"{type(self).__name__} has no critic: critic_model/critics are for IAC and MAAC")

    def _load_critics(self, n: int, dtype: str) -> tuple[list, list]:
        return [], []

    # --- sources and config -------------------------------------------------------------------------

    def _dtype(self) -> str:
        mc = self.model_config
        d = mc.get("torch_dtype") or mc.get("dtype") or (mc.get("model_kwargs") or {}).get("torch_dtype") \
            or (mc.get("model_kwargs") or {}).get("dtype") or "float32"
        return str(d).replace("torch.", "")

    def _attn(self) -> str | None:
        mc = self.model_config
        if "attn_implementation" in mc:
            return mc["attn_implementation"]
        return (mc.get("model_kwargs") or {}).get("attn_implementation", "sdpa")

    def _load_source(self, src: str) -> str:
        """'tiny' and catalog names → their directory in the store (built / converted once); anything else as given."""
        from coopflow.stages.agents.catalog import is_catalog_name

        if src != "tiny" and not is_catalog_name(src):
            return src
        from coopflow.stages.planning.context import resolve_model_sources
        from coopflow.stages.planning.settings import RunSettings

        cfg = self._base_config()
        return resolve_model_sources([src], RunSettings.of(cfg), ArtifactStore.of(cfg), "agents")[0][0]

    def _base_config(self) -> RunConfig:
        """The smallest run config of this trainer: where its data dir is (and its store's remote mirror)."""
        return validate_config({"agents": {"agent_model": "tiny"}, "data_dir": self.data_dir,
                                "trainer": {"num_turns": 1}})

    def _data_root(self) -> Path:
        return self._base_config().resolved_data_dir()

    def _snapshot(self, model, tok, root: Path) -> str:
        """An in-memory model (+ tokenizer) as a `model` artifact keyed by its weights; returns its directory."""
        def write(d: Path) -> None:
            model.save_pretrained(d)
            tok.save_pretrained(d)

        store = ArtifactStore.at(root, self._base_config())
        return str(store.open_dir(store.put_dir("model", key_for("model", {"weights": _weights_sha(model)}), write)))

    def _taskset(self, root: Path) -> dict:
        if self.train_dataset is None:
            raise ValueError("train_dataset is required to train (an HF datasets.Dataset with the task items)")
        from datasets import DatasetDict

        ev = self.eval_dataset if self.eval_dataset is not None else self.train_dataset

        def write(d: Path) -> None:
            import datasets

            datasets.disable_progress_bars()
            DatasetDict({"train": self.train_dataset, "eval": ev}).save_to_disk(str(d))

        store = ArtifactStore.at(root, self._base_config())
        key = key_for("dataset", {"train": self.train_dataset._fingerprint, "eval": ev._fingerprint})
        d = store.open_dir(store.put_dir("dataset", key, write))
        cols = self.train_dataset.column_names
        out = {"name": str(d), "split": "train", "eval_split": "eval"}
        if "prompt" not in cols:  # the default formatter's text; formatters usually build the real prompts
            text = next((c for c in cols if isinstance(self.train_dataset[0][c], str)), cols[0])
            out["prompt_template"] = "{" + text + "}"
        return out

    def _processor_spec(self) -> str | None:
        p = self.reward_processor
        if p is None:
            return None
        return getattr(p, "spec", None) or callable_ref(p)

    def _formatter_cfg(self):
        f = self.formatters
        if f is None:
            return None
        if isinstance(f, (list, tuple)):
            return [{"function": callable_ref(x)} for x in f]
        return {"function": callable_ref(f)}

    def run_config(self) -> RunConfig:
        """The coopflow run config this trainer runs (same stages, same keys as the flows)."""
        root = self._data_root()
        srcs = [s if s is not None else self._snapshot(m, t, root)
                for s, m, t in zip(self._sources, self.agents, self.tokenizers)]
        agents: dict = {"num_agents": self.num_roles, "dtype": self._dtype(), "attn_implementation": self._attn()}
        if len(set(srcs)) == 1:
            agents["agent_model"] = srcs[0]
        else:
            agents["agents"] = srcs
        tracking = {"experiment": self.wandb_config.get("project") or "coopflow"}
        if self.wandb_config.get("name"):
            tracking["run_name"] = self.wandb_config["name"]
        data: dict = {"algorithm": self.algorithm, "agents": agents, "taskset": self._taskset(root),
                      "reward": {"name": self._reward_name, "processor": self._processor_spec()},
                      "trainer": {**self.args.model_dump(), "num_agents": self.num_roles}, "seed": self.seed,
                      "data_dir": str(root), "tracking": tracking}
        if self.centralized_adapter is not None:
            from coopflow.stages.common.user_code import register_object

            data["centralized_adapter"] = register_object(self.centralized_adapter)
        rr = getattr(self.reward_func, "reward_range", None)
        if rr is not None:
            data["reward"]["reward_range"] = list(rr)
        formatters = self._formatter_cfg()
        if formatters is not None:
            data["formatters"] = formatters
        if self.external_transition is not None and self.args.num_turns > 1:
            data["transition"] = {"name": callable_ref(self.external_transition)}
        if self.metrics_callback is not None:
            data["metrics_callback"] = callable_ref(self.metrics_callback)
        if self.eval_logger is not None and self.eval_aggregator is not None:  # the reference uses them as a pair
            data["eval_logger"] = callable_ref(self.eval_logger)
            data["eval_aggregator"] = callable_ref(self.eval_aggregator)
        data.update(self._critic_section(root))
        return validate_config(data, self.algorithm)

    def _critic_section(self, root: Path) -> dict:
        return {}

    # --- train / evaluate / save ---------------------------------------------------------------------

    def train(self, as_flow: bool = False, show_progress: bool = True, continue_run: str | None = None) -> dict:
        """Run the stages in this process through coopflow's run driver (the one `coopflow run` and deployments
        use: run-key lock, resumption of a killed run's MLflow run, remote mirror, lineage); `as_flow=True`
        runs the same driver as the Prefect flow instead.

        `continue_run` (or `wandb_config={"id": RUN_ID, "resume": ...}`) continues an earlier, shorter run of
        this config (e.g. more epochs) into the same MLflow run, env_step continuing; the driver checks that
        the earlier run belongs to this config. Returns the run summary; the trained weights are copied into
        `self.agents`."""
        cfg = self.run_config()
        continue_run = continue_run or (self.wandb_config.get("id") if self.wandb_config.get("resume") else None)
        if as_flow:
            from coopflow.flows.train import FLOWS

            kw = {"continue_run": continue_run} if continue_run else {}
            out = FLOWS[f"train-{self.algorithm}"](config=cfg.model_dump(mode="json"), show_progress=show_progress,
                                                   **kw)
        else:
            from coopflow._direct import run_tracked

            out = run_tracked(cfg, self.wandb_config.get("tags"), show_progress, self._live_session(cfg),
                              continue_run)
        self._last = out
        self._load_trained(Path(out["checkpoint"]))
        self.env_step = int(out.get("env_steps") or 0)
        return out

    def _live_session(self, cfg: RunConfig):
        """A run session that starts from this trainer's own agents (trained in place, as in the reference, and
        generating with their own `generate`), when they can run in this process: not under mp workers, and not
        for the actor-critic runs (their critics and heads load from the store)."""
        from coopflow.stages.agents.state import AgentState, Policies
        from coopflow.stages.planning.context import resolve_sources
        from coopflow.stages.planning.plan import is_actor_critic
        from coopflow.stages.planning.session import Session

        t = cfg.trainer
        self._prepare_tokenizers()
        if t.parallel_training == "mp" or is_actor_critic(cfg) or t.uses_critics:
            return None
        refs = self.reference_models if t.reference_kl_enabled and self.reference_models else [None] * self.num_agents
        agents = [AgentState(m, tok, t.agent_learning_rate, optimizer=opt, reference=ref)
                  for m, tok, opt, ref in zip(self.agents, self.tokenizers, self.optimizers, refs)]
        paths, _ = resolve_sources(cfg, ArtifactStore.of(cfg))
        return Session(initial=Policies(agents), initial_sources=tuple(paths))

    def _prepare_tokenizers(self) -> None:
        """Batched generation pads on the left and needs a pad token (set when the agents first generate)."""
        for tok in self.tokenizers:
            if tok is not None and hasattr(tok, "padding_side"):
                tok.padding_side = "left"
                if getattr(tok, "pad_token", None) is None and getattr(tok, "eos_token", None) is not None:
                    tok.pad_token = tok.eos_token

    def _load_trained(self, ckpt: Path) -> None:
        """Copy a checkpoint's agent weights into the live agents (and critics)."""
        from transformers import AutoModelForCausalLM

        from coopflow.stages.agents.checkpoint import CheckpointLayout

        lay = CheckpointLayout(ckpt)
        for i, m in enumerate(self.agents):
            trained = AutoModelForCausalLM.from_pretrained(lay.agent(i), dtype=next(m.parameters()).dtype)
            m.load_state_dict(trained.state_dict())

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """Evaluation metrics (`eval/turn_t/reward_mean`, …) of the current agents on the eval dataset."""
        from coopflow.flows import driver
        from coopflow.stages.agents.state import AgentState, Policies

        cfg = self.run_config()
        self._prepare_tokenizers()
        pol = Policies([AgentState(m, t, self.args.agent_learning_rate) for m, t in zip(self.agents, self.tokenizers)])
        n = num_eval_samples if num_eval_samples is not None else (cfg.trainer.eval_num_samples or None)
        return driver.evaluate_policies(cfg, driver.inline_runner(), pol, n, "facade-eval")

    def save_model(self, output_dir: str) -> None:
        """Write `agent_i/` (+ critics as the reference lays them out); the trained checkpoint when there is one."""
        import shutil

        from coopflow.stages.agents.checkpoint import CheckpointLayout

        out = CheckpointLayout(Path(output_dir))
        out.root.mkdir(parents=True, exist_ok=True)
        if self._last is not None:  # the checkpoint's agent dirs (with IAC critics inside) and MAAC's critic
            src = CheckpointLayout(Path(self._last["checkpoint"]))
            for a, b in [(src.agent(i), out.agent(i)) for i in range(self.num_agents)] + \
                    [(src.central_critic, out.central_critic)]:
                if a.is_dir():
                    shutil.copytree(a, b, dirs_exist_ok=True)
            return
        for i, (m, t) in enumerate(zip(self.agents, self.tokenizers)):
            m.save_pretrained(out.agent(i))
            t.save_pretrained(out.agent(i))
