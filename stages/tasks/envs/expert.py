"""Multi-turn `expert_edits` for the coding environment: an external model reviews the team's code.

After each turn the team's program (the problem's imports, the helper's `aux`, the main function) goes to
an *expert* model with the problem. The expert answers with JSON, one suggestion per role:
`{"aux": "...", "main": "..."}` (one agent: `{"main": "..."}`). Each agent's next prompt is the problem
(`original_prompt`), its own previous code (`previous_response`) and the expert's suggestion for its role,
asking for a revision. As in the reference's coding environment, the expert sees the code, not the
tests, and a failed call (network error, no JSON) is retried and then gives empty suggestions: training
goes on, and `failures` counts it.

The expert is either an HTTP model service (`url` + `format`, any of the comparator formats: OpenAI
chat, Anthropic messages, ...) or a local HF model (`local_model`: a model dir such as one written by
`coopflow models install NAME --dir DIR`, or an HF id), loaded once per run. `expert_model` names the
reference's presets: `deepseek-coder` (api.deepseek.com, key in DEEPSEEK_API_KEY), `claude-*`
(api.anthropic.com, ANTHROPIC_API_KEY), `qwen3-coder*` (DashScope, DASHSCOPE_API_KEY).

    transition: {name: coopflow.envs.expert:ExpertEdits, kwargs: {expert_model: deepseek-coder}}
    transition: {name: coopflow.envs.expert:ExpertEdits, kwargs: {local_model: ./models/coder}}
"""

import json
import logging

from coopflow.stages.rollout.comparator_api import APIComparator
from coopflow.stages.tasks.envs.coding import _preamble, extract_code

LOG = logging.getLogger("coopflow.expert")

PRESETS = {  # expert_model prefix -> (url, format, key env var), the services the reference's env calls
    "deepseek": ("https://api.deepseek.com/chat/completions", "openai", "DEEPSEEK_API_KEY"),
    "claude": ("https://api.anthropic.com/v1/messages", "anthropic", "ANTHROPIC_API_KEY"),
    "qwen3-coder": ("https://dashscope-intl.aliyuncs.com/compatible-mode/v1/chat/completions", "openai",
                    "DASHSCOPE_API_KEY"),
}


def expert_request(item_prompt: str, entry_point: str, main: str, helper: str | None) -> str:
    """The expert's instructions: the problem, the team's combined code, and the JSON shape to answer in."""
    code = "\n\n".join(p for p in (_preamble(item_prompt), helper, main) if p)
    roles = (f"`aux` is a helper function and `{entry_point}` the main function, which may call `aux`"
             if helper is not None else f"`{entry_point}` is the function to implement")
    keys = '{"aux": "<suggestion for aux>", "main": "<suggestion for the main function>"}' if helper is not None \
        else '{"main": "<suggestion for the function>"}'
    return (f"You review Python code written for the problem below; {roles}.\n\nProblem:\n{item_prompt}\n\n"
            f"Code:\n```python\n{code}\n```\n\nIf a function is missing, give a minimal implementation of it; "
            "otherwise give short, concrete edits; if nothing needs to change, say \"No changes needed.\" "
            f"Reply with JSON only: {keys}")


def parse_edits(text: str, roles: tuple[str, ...]) -> dict[str, str] | None:
    """The last JSON object in `text` that has at least one of `roles` as a key (values as strings; a missing
    role gives ""), or None when there is none."""
    dec, found, i = json.JSONDecoder(), None, text.find("{")
    while i != -1:
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict) and any(r in obj for r in roles):
            found = obj
        i = text.find("{", end)
    if found is None:
        return None
    return {r: "" if found.get(r) is None else str(found[r]) for r in roles}


class _LocalExpert:
    """A local HF causal LM answering one prompt at a time (chat template when the tokenizer has one)."""

    def __init__(self, source: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(source)
        self.model = AutoModelForCausalLM.from_pretrained(source).eval()

    def complete(self, prompt: str, max_new_tokens: int, temperature: float, seed: int) -> str:
        import torch

        if getattr(self.tok, "chat_template", None):
            text = self.tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                add_generation_prompt=True)
        else:
            text = prompt
        enc = self.tok(text, return_tensors="pt")
        torch.manual_seed(seed)
        with torch.no_grad():
            out = self.model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=temperature > 0,
                                      temperature=max(temperature, 1e-5), pad_token_id=self.tok.pad_token_id
                                      or self.tok.eos_token_id)
        return self.tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)


class ExpertEdits:
    """The `expert_edits` transition (constructed once per run with `transition.kwargs`, called per branch)."""

    def __init__(self, expert_model: str | None = None, url: str | None = None, format: str = "openai",
                 key_env: str | None = None, local_model: str | None = None, max_new_tokens: int = 2048,
                 temperature: float = 0.3, timeout_s: float = 60.0, retries: int = 3, original_prompt: bool = True,
                 previous_response: bool = True):
        if local_model and (url or expert_model):
            raise ValueError("expert_edits: give local_model or an HTTP expert (url / expert_model), not both")
        if not local_model and not url:
            name = (expert_model or "deepseek-coder").lower()
            preset = next((v for k, v in PRESETS.items() if name.startswith(k)), None)
            if preset is None:
                raise ValueError(f"expert_edits: unknown expert_model {expert_model!r}; give url (and format) for "
                                 f"another service, or local_model; presets: {sorted(PRESETS)}")
            url, format, key_env = preset[0], preset[1], key_env or preset[2]
        if retries < 1:
            raise ValueError(f"expert_edits: retries must be >= 1, got {retries}")
        self.local = _LocalExpert(local_model) if local_model else None
        self.api = None if local_model else APIComparator(url=url, fmt=format, model=expert_model, timeout=timeout_s,
                                                          key_env=key_env, retries=0)
        self.max_new_tokens, self.temperature, self.retries = max_new_tokens, temperature, retries
        self.original_prompt, self.previous_response = original_prompt, previous_response
        self.calls = self.failures = 0

    def ask(self, request: str, roles: tuple[str, ...]) -> dict[str, str]:
        """The expert's suggestions per role; after `retries` failed attempts, empty ones (logged)."""
        self.calls += 1
        last = "no JSON object with the role keys in the answer"
        for attempt in range(self.retries):
            try:
                if self.local is not None:
                    text = self.local.complete(request, self.max_new_tokens, self.temperature, seed=attempt)
                else:
                    text = self.api.complete(request, 1, 0, self.max_new_tokens, self.temperature, 1.0, None)[0]
            except (ValueError, RuntimeError, OSError) as err:
                last = str(err)
                continue
            edits = parse_edits(text, roles)
            if edits is not None:
                return edits
        self.failures += 1
        LOG.warning("expert_edits: no usable suggestions after %d attempts (%s); the agents get none",
                    self.retries, last)
        return {r: "" for r in roles}

    def __call__(self, *, prompt: str, agent_completions: list[str], num_agents: int, item: dict,
                 prompt_history_per_agent=None, response_history_per_agent=None) -> list[str]:
        if num_agents not in (1, 2):
            raise ValueError(f"expert_edits supports 1 or 2 agents (main, or helper + main), got {num_agents}")
        ep, problem = item["entry_point"], item.get("prompt", prompt)
        roles = ("aux", "main") if num_agents == 2 else ("main",)
        codes = [extract_code(c) for c in agent_completions]
        helper = codes[0] if num_agents == 2 else None
        edits = self.ask(expert_request(problem, ep, codes[-1], helper), roles)
        out = []
        for role, code in zip(roles, codes):
            name = "aux" if role == "aux" else ep
            parts = [f"Problem:\n{problem}"] if self.original_prompt else []
            if self.previous_response:
                parts.append(f"Your previous `{name}`:\n{code.strip() or '<no code>'}")
            parts.append(f"An expert reviewer suggests:\n{edits[role].strip() or 'No suggestions.'}")
            parts.append(f"Revise `{name}` accordingly. Reply with only its Python code.")
            out.append("\n\n".join(parts))
        return out
