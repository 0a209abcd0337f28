"""coopflow's Python API: CoMLRL 1.4.3's trainer and config classes over coopflow's stages.

Move a CoMLRL script by replacing the import prefix `comlrl` with `coopflow`:

    from coopflow.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    trainer = MAGRPOTrainer(agent_model="tiny", num_agents=2, reward_func=my_reward,
                            train_dataset=ds, args=MAGRPOConfig(num_turns=1, ...))
    trainer.train()
"""

__version__ = "0.1.0"
