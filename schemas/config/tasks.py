"""The task-side sections: `taskset` (the items), `reward` (the shared reward), `transition` (the environment step
between turns) and `formatters` (how an agent's prompt is built from an item)."""

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from coopflow.schemas.config.common import _Strict



class TasksetConfig(_Strict):
    """Where the task items come from (built-in name, local file or HF `datasets` dataset)."""

    name: str = Field("story-length-ratio",
                      description="Built-in taskset name, a local .parquet/.jsonl/.json/.csv file, a dir saved by "
                                  "datasets' save_to_disk, or 'hf:<dataset id>'.")
    split: str = Field("train", description="Split to train on (for files: all rows, less those eval_fraction "
                                            "holds out; for HF datasets: the split name).")
    eval_split: str | None = Field(
        None, description="Split to evaluate on; null uses the source's own eval split, else eval_fraction / "
                          "eval_file, else the training items (with a warning).")
    prompt_column: str = Field("prompt", description="Column holding the prompt text.")
    prompt_template: str | None = Field(
        None, description="Python format string over the row's columns that builds the prompt, e.g. 'Summarize: {text}'.")
    num_items: int | None = Field(None, ge=1, description="Use only the first N training items (null: all).")
    num_eval_items: int | None = Field(None, ge=1, description="Use only the first N eval items (null: all).")
    eval_fraction: float | None = Field(
        None, ge=0.0, lt=1.0, description="Hold out this fraction of a source without an eval split of its own (a "
                                          "file, an hf: split) as the eval split, chosen by a seeded hash of each row.")
    eval_file: str | None = Field(
        None, description="A separate .parquet/.jsonl/.json/.csv file of eval items (same columns) for a source "
                          "without an eval split of its own; its ids must not repeat training ids.")
    eval_split_seed: int = Field(0, description="Seed of the eval_fraction hash: another seed holds out other rows.")

    @model_validator(mode="after")
    def _held_out(self) -> "TasksetConfig":
        if self.eval_fraction is not None and self.eval_file is not None:
            raise ValueError("taskset.eval_fraction and taskset.eval_file both set: choose one held-out eval split")
        if self.eval_fraction == 0.0:
            raise ValueError("taskset.eval_fraction 0 holds out nothing: leave it null to evaluate on the training "
                             "items, or set a fraction in (0, 1)")
        given = "eval_fraction" if self.eval_fraction is not None else "eval_file" if self.eval_file else None
        if given and self.eval_split is not None:
            raise ValueError(f"taskset.{given} and taskset.eval_split both set: eval_split names the source's own "
                             f"eval split, {given} makes one from a source without it")
        if self.eval_file is not None and not self.eval_file.strip():
            raise ValueError("taskset.eval_file is empty: give a file path or null")
        return self

    def key_fields(self) -> dict:
        """The fields a taskset key holds: the held-out-split fields only when set, so the keys of configs without
        them are those they had before these fields existed."""
        data = self.model_dump()
        for name in ("eval_fraction", "eval_file"):
            if data[name] is None:
                data.pop(name)
        if self.eval_fraction is None:  # the seed only matters to a fraction's split
            data.pop("eval_split_seed")
        return data


# --- reward --------------------------------------------------------------------------------------


class RewardConfig(_Strict):
    """The shared reward of a joint action: one float for one completion per agent (a team reward)."""

    name: str = Field("length_ratio", description="Built-in reward name or an import path 'module:function'.")
    kwargs: dict[str, Any] = Field(default_factory=dict,
                                   description="Keyword arguments bound to the reward function (functools.partial).")
    processor: str | None = Field(
        None, description="Reward processor: identity | clamp:MIN:MAX | scale:F | shift:V | sigmoid_scale | "
                          "exponential_scale:F | normalize_by_length:MAX | 'module:function'.")
    timeout_s: float | None = Field(
        300.0, gt=0, description="Seconds one reward call may take before the run fails with an error naming the "
                                 "reward (a hung reward never blocks a run forever); null = no limit.")
    retries: int = Field(0, ge=0, description="Retries of a reward call that raised (for rewards calling flaky "
                                              "services), after 0.5 s, 1 s, 2 s, ...; a timeout is not retried.")
    workers: int = Field(1, ge=1, description="Reward calls run at once: 1 = serially in this process; N > 1 fans "
                                              "each scoring stage's calls out to `executor` (scores identical).")
    executor: Literal["process", "dask", "ray"] = Field(
        "process", description="Where reward calls run when workers > 1: process (a local pool of N processes; the "
                               "reward must be importable by name), dask (Dask distributed: executor_address, or a "
                               "local cluster of N workers) or ray (Ray tasks, N in flight; the `ray` section's "
                               "cluster).")
    executor_address: str | None = Field(None, description="Dask scheduler address (tcp://host:8786) for executor "
                                                           "dask; null = a local cluster started for the run.")
    reward_range: tuple[float, float] | None = Field(
        None, description="Declared [min, max] of the raw reward; null uses the function's `reward_range` attribute "
                          "(set_reward_range) if any. Used to warn when early termination makes turns unreachable.")

    @field_validator("reward_range")
    @classmethod
    def _range(cls, v):
        if v is not None and not (all(map(lambda x: x == x and abs(x) != float("inf"), v)) and v[0] < v[1]):
            raise ValueError(f"reward_range must be finite [min, max] with min < max, got {list(v)}")
        return v


# --- transition (multi-turn) ---------------------------------------------------------------------


class TransitionConfig(_Strict):
    """The environment step between turns: builds each agent's next prompt from the last joint answer."""

    name: str = Field("plain", description="plain (show the previous answers, ask to revise) | feedback (also tell "
                                           "the agents the joint answer's score and lengths) | 'module:function'.")
    kwargs: dict[str, Any] = Field(default_factory=dict,
                                   description="Keyword arguments bound to the transition (e.g. instruction: '...').")


# --- formatters ----------------------------------------------------------------------------------


class FormatterConfig(_Strict):
    """How an agent's prompt is built from a task item (one formatter for all agents, or one per agent)."""

    template: str | None = Field(
        None, description="Python format string over the item's fields, e.g. 'Write briefly: {prompt}'. "
                          "null uses item['prompt'] unchanged.")
    function: str | None = Field(None, description="Import path 'module:function' of a formatter f(item) -> str.")
    chat_template: bool = Field(False, description="Wrap the prompt in the tokenizer's chat template as a user turn.")
    system_prompt: str | None = Field(None, description="System message used with chat_template.")

    @model_validator(mode="after")
    def _one(self) -> "FormatterConfig":
        if self.template is not None and self.function is not None:
            raise ValueError("a formatter takes either template or function, not both")
        return self
