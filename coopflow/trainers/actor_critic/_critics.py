"""Critic handling shared by the IAC and MAAC facades (the reference's critic-source rules)."""

from pathlib import Path

from coopflow._facade import FacadeTrainer, _is_model


class CriticTrainer(FacadeTrainer):
    """A trainer whose run has a `critic` section; `critic_count` is N (IAC separate) or 1 (MAAC)."""

    def _critic_count(self, n: int) -> int:
        raise NotImplementedError

    def _check_critic_flag(self, critic_model, critics) -> None:
        if not self._wants_critics() and (critic_model is not None or critics):
            raise ValueError("critics can only be provided when use_separate_critic=True")

    def _check_critics(self, critic_model, critics, n: int) -> None:
        if not self._wants_critics():
            self._check_critic_flag(critic_model, critics)
            return
        want = self._critic_count(n)
        if critics is not None and len(critics) != want:
            raise ValueError(f"critics length {len(critics)} does not match the {want} critic(s) "
                             f"{type(self).__name__} needs")
        if critic_model is None and not critics:
            raise ValueError(f"critics must be provided: pass critic_model (one source, broadcast) or critics "
                             f"(a list of {want}) to {type(self).__name__}")

    def _wants_critics(self) -> bool:
        return True

    def _critic_items(self, n: int) -> list:
        if self._critics_src:
            return list(self._critics_src)
        return [self._critic_src] * self._critic_count(n)

    def _load_critics(self, n: int, dtype: str) -> tuple[list, list]:
        from coopflow.stages.agents.models import load_critic
        from coopflow.stages.agents.state import CriticState
        from coopflow.stages.agents.value_heads import new_head

        if not self._wants_critics():
            return [], []
        t = self.args
        crit = []
        for c in self._critic_items(n):
            if _is_model(c):
                tok = self.tokenizers[0]
                crit.append(CriticState(c, new_head(c, t.critic_value_head_hidden_dim, 0), tok, t.critic_lr))
            else:
                crit.append(load_critic(self._load_source(str(c)), t.critic_lr, t.critic_value_head_hidden_dim,
                                        dtype, self._attn()))
        return crit, [c.ensure_optimizer() for c in crit]

    def _critic_section(self, root: Path) -> dict:
        if not self._wants_critics():
            return {}
        srcs = []
        for item, state in zip(self._critic_items(self.num_agents), self.critics):
            srcs.append(self._snapshot(state.model, state.tokenizer, root) if _is_model(item) else str(item))
        if len(set(srcs)) == 1 and not self._critics_src:
            return {"critic": {"critic_model": srcs[0]}}
        return {"critic": {"critics": srcs}}
