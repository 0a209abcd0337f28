"""coopflow's Python API: CoMLRL 1.4.3's trainer and config classes over coopflow's stages.

Move a CoMLRL script by replacing the import prefix `comlrl` with `coopflow`:

    from coopflow.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    trainer = MAGRPOTrainer(agent_model="tiny", num_agents=2, reward_func=my_reward,
                            train_dataset=ds, args=MAGRPOConfig(num_turns=1, ...))
    trainer.train()
"""

__version__ = "0.1.0"


def rollouts(run=None, data_dir=None, updates=None, eval=False):
    """A run's joint answers (each agent's completion, the joint reward, the advantage) as a pandas DataFrame:
    see `coopflow._inspect.rollouts`."""
    from coopflow._inspect import rollouts as _rollouts

    return _rollouts(run, data_dir, updates, eval)
