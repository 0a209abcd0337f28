"""`build_formatters`: one prompt function per agent (`comlrl.utils.formatters`)."""

from collections.abc import Callable, Sequence

__all__ = ["build_formatters"]


def build_formatters(formatters: Callable[[dict], str] | Sequence[Callable[[dict], str]] | None, num_agents: int, *,
                     pass_none_external_prompts: bool = True) -> list[Callable[[dict], str]]:
    """None → item['prompt'] for every agent; one function → shared by all; a sequence → one per agent (its
    length must be num_agents). `pass_none_external_prompts` is accepted for compatibility (formatters here
    always receive the item; later turns put the transition's prompt into item['prompt'])."""
    if formatters is None:
        return [lambda item: str(item.get("prompt", ""))] * num_agents
    if callable(formatters):
        return [formatters] * num_agents
    fs = list(formatters)
    if len(fs) != num_agents:
        raise ValueError(f"Number of formatters must match num_agents when providing a sequence "
                         f"({len(fs)} formatters, {num_agents} agents).")
    if not all(callable(f) for f in fs):
        raise TypeError("every formatter must be callable: f(item) -> str")
    return fs
