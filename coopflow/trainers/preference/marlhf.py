"""MARLHF: a joint reward model, then online MARL on it (CoMLRL's `comlrl.trainers.preference.marlhf`)."""

from coopflow._facade import FacadeTrainer
from coopflow.schemas.config import MARLHFConfig
from coopflow.stages.fit.reward_model import JointRewardModel

__all__ = ["JointRewardModel", "MARLHFConfig", "MARLHFTrainer"]


class MARLHFTrainer(FacadeTrainer):
    """Pairs → Bradley–Terry joint reward model → the `rl_algorithm` backend on it (eval: task reward).
    For the iac/maac backends `critic_model` (a source string) sets the critic, as `critic_model_name`."""

    algorithm = "marlhf"
    config_class = MARLHFConfig

    def _check_critics(self, critic_model, critics, n: int) -> None:
        if critics or (critic_model is not None and not isinstance(critic_model, str)):
            raise ValueError("MARLHF takes the critic of its iac/maac backend as critic_model (a source string)")
        if critic_model is not None:
            self.args = self.args.model_copy(update={"critic_model_name": critic_model})
