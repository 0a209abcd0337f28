"""Prompt formatters: how each agent's prompt is built from a task item.

A formatter is a template over the item's fields (`'Be brief: {prompt}'`), a user function
`f(item) -> str` by import path, or the default `item['prompt']`; optionally wrapped in the
tokenizer's chat template. Each agent may have its own.
"""

from collections.abc import Callable

from coopflow.schemas.config import FormatterConfig
from coopflow.stages.common.user_code import load_callable


def build_formatter(cfg: FormatterConfig, tokenizer=None) -> Callable[[dict], str]:
    """Formatter function of one agent."""
    if cfg.function:
        base = load_callable(cfg.function, "formatter")
    elif cfg.template is not None:
        template = cfg.template

        def base(item: dict) -> str:
            try:
                return template.format(**item)
            except KeyError as err:
                raise ValueError(f"formatter template {template!r} uses field {err} missing from the item "
                                 f"(fields: {sorted(k for k in item if not k.startswith('_'))})") from None
    else:
        def base(item: dict) -> str:
            return str(item.get("prompt", ""))

    if not cfg.chat_template:
        return base
    wrap = chat_wrapper(cfg, tokenizer)

    def chat(item: dict) -> str:
        return wrap(base(item))

    return chat


def chat_wrapper(cfg: FormatterConfig, tokenizer) -> Callable[[str], str]:
    """text -> the tokenizer's chat template around it as a user turn (with cfg's system prompt)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError("formatter chat_template: true, but the agent's tokenizer has no chat template")

    def wrap(text: str) -> str:
        msgs = ([{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else [])
        msgs.append({"role": "user", "content": text})
        return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)

    return wrap


def role_formatter(cfg: FormatterConfig) -> Callable[[dict], str]:
    """A role's prompt as plain text for a centralized adapter: the system prompt (if any) above the prompt;
    the chat template, if asked for, goes around the joint prompt instead."""
    base = build_formatter(cfg.model_copy(update={"chat_template": False}))
    if not cfg.system_prompt:
        return base
    return lambda item: f"{cfg.system_prompt}\n\n{base(item)}"
