"""Run configuration: the single source of truth for every field a coopflow run reads.

A run config is one YAML/JSON document with a few sections:

    algorithm: magrpo            # magrpo | mareinforce | marloo | maremax | iac | maac | madpo | marlhf | ...-iter
    agents:    {agent_model: tiny, num_agents: 2}
    taskset:   {name: story-length-ratio, num_items: 16}
    reward:    {name: length_ratio}
    trainer:   {...}             # the reference's MAGRPOConfig fields, same names and defaults
    seed: 0

`trainer` mirrors CoMLRL 1.4.3's trainer configs (MAGRPOConfig, IACConfig, MAACConfig, MADPOConfig, MARLHFConfig and
the iterative ones) field for field, including their defaults and validations; everything else is pipeline
configuration. Each trainer field is declared once, with one set of limits and one description: `_TrainerBase` holds
the fields every trainer has. Every trainer config has exactly one trainer base; the field sets a second lineage
would bring are mixins put in front of it (`_CriticFields` / `_IACFields`, the actor-critic fields MARLHF hands to a
maac/iac backend, see `rl_trainer_fields`; `_IterativeFields`, the rounds of the iterative trainers). A subclass
re-declares a field only through `_override`: another default with the base's limits and description (a changed
limit or description is spelt out there). Every model is `extra="forbid"`, so a misspelt key fails with a message
naming it. `load_config` reads a file, applies `--set a.b=c` overrides with the same dotted paths and validates,
before any model loads.

The modules, by concern: `common` (the strict base, aliases, path helpers, ConfigError), `agents`, `tasks` (taskset,
reward, transition, formatters), `trainer` (MAGRPO family, actor-critic), `preference` (MADPO, MARLHF, iterative),
`run` (the run configs and pipeline sections) and `loading` (files, overrides, validation). Import from here.
"""

from coopflow.schemas.config.agents import AgentsConfig, LoraSettings
from coopflow.schemas.config.common import (ALGORITHM_ADVANTAGE, COLLABORATION_ALIASES, GENERATION_ALIASES,
                                            JOINT_MODE_ALIASES, ConfigError, data_dir_path, field_limits,
                                            is_local_model_path, missing_model_dir_message, per_agent_values,
                                            store_path)
from coopflow.schemas.config.loading import (_parse_value, apply_overrides, format_validation_error, load_config,
                                             read_config_file, validate_config)
from coopflow.schemas.config.preference import (COMPARATOR_ALIASES, PAIR_SELECTIONS, REPLAY_MODES, RL_ALIASES,
                                                MADPOConfig, MADPOIterConfig, MARLHFConfig, MARLHFIterConfig,
                                                check_replay)
from coopflow.schemas.config.run import (RUN_CONFIGS, CriticConfig, IACRunConfig, MAACRunConfig, MADPOIterRunConfig,
                                         MADPORunConfig, MARLHFIterRunConfig, MARLHFRunConfig, RayConfig, RunConfig,
                                         SandboxConfig, TrackingConfig, rl_trainer_fields)
from coopflow.schemas.config.tasks import FormatterConfig, RewardConfig, TasksetConfig, TransitionConfig
from coopflow.schemas.config.trainer import (ActorCriticConfig, CentralizedMAGRPOConfig, IACConfig, MAACConfig,
                                             MAGRPOConfig, MAREINFORCEConfig, MAReMaxConfig, MARLOOConfig,
                                             _TrainerBase, parallel_mode)

__all__ = [
    "ALGORITHM_ADVANTAGE", "COLLABORATION_ALIASES", "COMPARATOR_ALIASES", "GENERATION_ALIASES", "JOINT_MODE_ALIASES",
    "PAIR_SELECTIONS", "REPLAY_MODES", "RL_ALIASES", "RUN_CONFIGS",
    "ActorCriticConfig", "AgentsConfig", "CentralizedMAGRPOConfig", "ConfigError", "CriticConfig", "FormatterConfig",
    "IACConfig", "IACRunConfig", "LoraSettings", "MAACConfig", "MAACRunConfig", "MADPOConfig", "MADPOIterConfig",
    "MADPOIterRunConfig", "MADPORunConfig", "MAGRPOConfig", "MAREINFORCEConfig", "MARLHFConfig", "MARLHFIterConfig",
    "MARLHFIterRunConfig", "MARLHFRunConfig", "MARLOOConfig", "MAReMaxConfig", "RayConfig", "RewardConfig",
    "RunConfig", "SandboxConfig", "TasksetConfig", "TrackingConfig", "TransitionConfig",
    "apply_overrides", "check_replay", "data_dir_path", "field_limits", "format_validation_error",
    "is_local_model_path", "load_config", "missing_model_dir_message", "parallel_mode", "per_agent_values",
    "read_config_file",
    "rl_trainer_fields", "store_path", "validate_config",
]
# Also importable from here, for the modules that use them: _TrainerBase (the trainer configs' common base) and
# _parse_value (the CLI's override values).
