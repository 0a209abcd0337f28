"""An HTTP comparator for iterative rounds: candidates from an external model service.

One POST per request with the standard library (`urllib`); formats:

- `generic` (default): {prompt, agent_idx, num_return_sequences, max_new_tokens, temperature, top_p,
  top_k, batch_item, model?, **extra_body}; the completions are read at the dotted path
  `response_field` (default `completions`), falling back to completions / responses / outputs /
  choices; items are strings or dicts with text / content / completion / response / message.content;
- `openai` (`openai_chat`, `chat`): chat completions {model, messages, n, max_tokens, temperature,
  top_p}; n per request capped by `max_n_per_request` (1 for DeepSeek URLs/models); text in
  choices[].message.content (or .text);
- `anthropic` (`anthropic_messages`, `messages`): one candidate per request, header
  `anthropic-version: 2023-06-01`, the key in `x-api-key` without a prefix; text in content[type=text];
- `openai_responses` (`responses`, `codex`): {model, input, max_output_tokens, ...}; text in
  output[].content[type in output_text|text].

Auth: `key`, or the environment variable named by `key_env`, sent in `key_header` with `key_prefix`;
the key never appears in errors or logs. HTTP 402 raises RuntimeError (insufficient balance); other
HTTP errors and bad responses raise ValueError naming the URL and status; timeouts and 5xx are
retried `retries` times.
"""

import json
import os
import random
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

FORMATS = {"generic": "generic", "openai": "openai", "openai_chat": "openai", "chat": "openai",
           "anthropic": "anthropic", "anthropic_messages": "anthropic", "messages": "anthropic",
           "openai_responses": "responses", "responses": "responses", "codex": "responses"}

_sleep = time.sleep  # the backoff wait (tests record it)


@dataclass
class APIComparator:
    """Calls an HTTP model service for comparator candidates."""

    url: str
    fmt: str = "generic"
    model: str | None = None
    timeout: float = 120.0
    headers: dict = field(default_factory=dict)
    key: str | None = None
    key_env: str | None = None
    key_header: str = "Authorization"
    key_prefix: str = "Bearer"
    extra_body: dict = field(default_factory=dict)
    response_field: str = "completions"
    max_n_per_request: int | None = None
    retries: int = 2
    backoff_s: float = 0.5  # first retry's wait; doubles each retry

    def __post_init__(self):
        key = str(self.fmt).lower()
        if key not in FORMATS:
            raise ValueError(f"comparator_api_format must be one of {sorted(FORMATS)}; got {self.fmt!r}")
        self.fmt = FORMATS[key]

    # --- transport -------------------------------------------------------------------------------

    def _headers(self) -> dict:
        h = {"Content-Type": "application/json"}
        for name, value in (self.headers or {}).items():  # 'env:VAR' values come from the environment
            if isinstance(value, str) and value.startswith("env:"):
                var = value[4:]
                if var not in os.environ:
                    raise ValueError(f"comparator_api_headers[{name!r}]: environment variable {var} is not set")
                value = os.environ[var]
            h[name] = value
        key = self.key or (os.environ.get(self.key_env) if self.key_env else None)
        if self.fmt == "anthropic":
            h["anthropic-version"] = "2023-06-01"
            if key:
                h["x-api-key"] = key
        elif key:
            h[self.key_header] = f"{self.key_prefix} {key}".strip() if self.key_prefix else key
        return h

    def _post(self, body: dict) -> dict:
        data = json.dumps(body).encode()
        last = None
        for attempt in range(self.retries + 1):
            if attempt:  # exponential backoff with jitter before a retry: 0.5 s, 1 s, 2 s, ... (at most 30 s)
                _sleep(min(30.0, self.backoff_s * 2 ** (attempt - 1)) * (0.8 + 0.4 * random.random()))
            req = urllib.request.Request(self.url, data=data, headers=self._headers(), method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    raw = resp.read().decode(errors="replace")
                return json.loads(raw or "{}")
            except urllib.error.HTTPError as err:
                if err.code == 402:
                    raise RuntimeError(f"comparator API {self.url} answered HTTP 402: insufficient balance") from None
                if err.code < 500:
                    raise ValueError(f"comparator API {self.url} answered HTTP {err.code}") from None
                last = f"HTTP {err.code}"
            except (TimeoutError, socket.timeout):
                last = f"timed out after {self.timeout:g} s"
            except urllib.error.URLError as err:
                if isinstance(err.reason, (TimeoutError, socket.timeout)):
                    last = f"timed out after {self.timeout:g} s"
                else:
                    raise ValueError(f"comparator API {self.url} unreachable: {err.reason}") from None
            except json.JSONDecodeError:  # a proxy's error page, a truncated answer: retried like a 5xx
                snippet = " ".join(raw[:80].split())
                key = self.key or (os.environ.get(self.key_env) if self.key_env else None)
                if key:
                    snippet = snippet.replace(key, "***")
                last = f"a body that is not JSON ({snippet!r})"
        raise ValueError(f"comparator API {self.url} failed after {self.retries + 1} attempts: {last}")

    # --- formats ---------------------------------------------------------------------------------

    def complete(self, prompt: str, n: int, agent_idx: int, max_new_tokens: int, temperature: float, top_p: float,
                 top_k: int | None, item: dict | None = None) -> list[str]:
        """n completions of `prompt` (for agent `agent_idx`)."""
        out: list[str] = []
        while len(out) < n:
            want = n - len(out)
            if self.fmt == "generic":
                body = {"prompt": prompt, "agent_idx": agent_idx, "num_return_sequences": want,
                        "max_new_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k,
                        "batch_item": _jsonable(item or {}), **({"model": self.model} if self.model else {}),
                        **self.extra_body}
                got = _generic_texts(self._post(body), self.response_field)
            elif self.fmt == "openai":
                cap = self.max_n_per_request or want
                if "deepseek" in self.url.lower() or "deepseek" in str(self.model or "").lower():
                    cap = 1
                body = {"model": self.model, "messages": [{"role": "user", "content": prompt}], "n": min(want, cap),
                        "max_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p, **self.extra_body}
                got = [(c.get("message") or {}).get("content") or c.get("text") or ""
                       for c in self._post(body).get("choices", [])]
            elif self.fmt == "anthropic":
                body = {"model": self.model, "max_tokens": max_new_tokens, "temperature": temperature, "top_p": top_p,
                        "messages": [{"role": "user", "content": prompt}], **self.extra_body}
                got = ["".join(c.get("text", "") for c in self._post(body).get("content", []) if c.get("type") == "text")]
            else:  # responses
                body = {"model": self.model, "input": prompt, "max_output_tokens": max_new_tokens,
                        "temperature": temperature, "top_p": top_p, **self.extra_body}
                got = ["".join(c.get("text", "") for o in self._post(body).get("output", [])
                               for c in (o.get("content") or []) if c.get("type") in ("output_text", "text"))]
            if not got:
                raise ValueError(f"comparator API {self.url} returned no completions")
            out += [str(g) for g in got[:want]]
        return out


def _jsonable(item: dict) -> dict:
    return {k: v for k, v in item.items() if not k.startswith("_") and isinstance(v, (str, int, float, bool, type(None)))}


def _text(x) -> str:
    if isinstance(x, str):
        return x
    if isinstance(x, dict):
        for k in ("text", "content", "completion", "response"):
            if isinstance(x.get(k), str):
                return x[k]
        msg = x.get("message")
        if isinstance(msg, dict) and isinstance(msg.get("content"), str):
            return msg["content"]
    raise ValueError(f"cannot read a completion from {str(x)[:80]!r}")


def _generic_texts(resp: dict, path: str) -> list[str]:
    node = resp
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if node is None:
        node = next((resp[k] for k in ("completions", "responses", "outputs", "choices") if k in resp), None)
    if not isinstance(node, list):
        raise ValueError(f"comparator API response has no list at {path!r} (keys: {sorted(resp)[:8]})")
    return [_text(x) for x in node]
