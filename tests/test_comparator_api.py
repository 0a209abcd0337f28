"""The HTTP comparator against a small server this test starts on 127.0.0.1 (no real endpoint)."""

import json
import time
from http.server import BaseHTTPRequestHandler

import pytest

from coopflow.stages.rollout.comparator_api import APIComparator
from tests import helpers

SEEN: list[dict] = []


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        SEEN.append({"path": self.path, "body": body, "headers": {k.lower(): v for k, v in self.headers.items()}})
        if self.path == "/broke":
            return self._send(402, {"error": "pay"})
        if self.path == "/bad":
            return self._send(400, {"error": "nope"})
        if self.path == "/garbage":  # a proxy's error page with status 200, echoing the request's key
            data = f"<html>bad gateway {self.headers.get('authorization')}</html>".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return self.wfile.write(data)
        if self.path == "/slow":
            time.sleep(1.0)
        if self.path == "/flaky" and sum(1 for s in SEEN if s["path"] == "/flaky") == 1:
            return self._send(503, {"error": "later"})
        if self.path.startswith("/openai"):
            n = body["n"]
            return self._send(200, {"choices": [{"message": {"content": f"oa{i}"}} for i in range(n)]})
        if self.path == "/anthropic":
            return self._send(200, {"content": [{"type": "text", "text": "claude says"}]})
        if self.path == "/responses":
            return self._send(200, {"output": [{"content": [{"type": "output_text", "text": "resp"}]}]})
        n = body["num_return_sequences"]
        return self._send(200, {"data": {"items": [{"text": f"g{body['agent_idx']}-{i}"} for i in range(n)]}})

    def _send(self, code, obj):
        helpers.send_json(self, code, obj)


@pytest.fixture(scope="module")
def server():
    yield from helpers.loopback_server(Handler)


def _call(api, n=2):
    return api.complete("write", n, 1, 16, 0.7, 0.9, 50, {"prompt": "write", "_item_id": 3})


def test_generic_format_payload_path_and_auth_from_env(server, monkeypatch):
    monkeypatch.setenv("CMP_KEY", "s3cret")
    SEEN.clear()
    api = APIComparator(f"{server}/gen", "generic", model="m1", key_env="CMP_KEY", response_field="data.items",
                        extra_body={"stop": ["\n"]})
    assert _call(api, 3) == ["g1-0", "g1-1", "g1-2"]
    req = SEEN[-1]
    assert req["body"]["num_return_sequences"] == 3 and req["body"]["model"] == "m1" and req["body"]["stop"] == ["\n"]
    assert req["body"]["batch_item"] == {"prompt": "write"}  # private fields are not sent
    assert req["headers"]["authorization"] == "Bearer s3cret"


def test_openai_anthropic_and_responses_formats(server):
    SEEN.clear()
    oa = APIComparator(f"{server}/openai", "chat", model="gpt", max_n_per_request=2)
    assert _call(oa, 3) == ["oa0", "oa1", "oa0"]  # n capped at 2 per request: two requests
    assert [s["body"]["n"] for s in SEEN] == [2, 1] and SEEN[0]["body"]["messages"][0]["content"] == "write"
    ds = APIComparator(f"{server}/openai", "openai", model="deepseek-chat")
    SEEN.clear()
    _call(ds, 2)
    assert [s["body"]["n"] for s in SEEN] == [1, 1]  # forced to 1 for DeepSeek
    an = APIComparator(f"{server}/anthropic", "anthropic", model="claude", key="k")
    SEEN.clear()
    assert _call(an, 2) == ["claude says", "claude says"] and len(SEEN) == 2  # one candidate per request
    assert SEEN[0]["headers"]["x-api-key"] == "k" and SEEN[0]["headers"]["anthropic-version"] == "2023-06-01"
    assert "authorization" not in SEEN[0]["headers"]
    rs = APIComparator(f"{server}/responses", "codex", model="o")
    assert _call(rs, 1) == ["resp"]


def test_errors_402_4xx_timeout_and_retry(server):
    with pytest.raises(RuntimeError, match="402: insufficient balance"):
        _call(APIComparator(f"{server}/broke", key="topsecret"))
    with pytest.raises(ValueError, match="HTTP 400") as err:
        _call(APIComparator(f"{server}/bad", key="topsecret"))
    assert "topsecret" not in str(err.value)
    with pytest.raises(ValueError, match="timed out after 0.2 s"):
        _call(APIComparator(f"{server}/slow", timeout=0.2, retries=1))
    SEEN.clear()
    with pytest.raises(ValueError, match=r"failed after 3 attempts: a body that is not JSON \('<html>bad") as err:
        _call(APIComparator(f"{server}/garbage", key="topsecret", retries=2, backoff_s=0.01))
    assert len(SEEN) == 3 and "topsecret" not in str(err.value)
    SEEN.clear()
    assert _call(APIComparator(f"{server}/flaky", response_field="data.items"), 1) == ["g1-0"]  # 503, then retried
    with pytest.raises(ValueError, match="comparator_api_format"):
        APIComparator(server, "grpc")


def test_api_comparator_in_a_round(server, tmp_path):
    from coopflow.schemas.config import validate_config
    from coopflow.stages.loops import rounds as I
    from coopflow.artifacts import ArtifactStore
    from coopflow.stages.planning.context import make_context
    from coopflow.stages.tasks.taskset import build_taskset
    from tests.conftest import small_config

    cfg = small_config(tmp_path)
    cfg["trainer"] = {"num_iterations": 1, "max_new_tokens": 8, "preference_num_candidates": 2, "train_batch_size": 4,
                      "eval_num_samples": 2, "comparator_policy": "http", "comparator_api_url": f"{server}/gen",
                      "comparator_api_response_field": "data.items", "comparator_api_key": "hidden"}
    c = validate_config(cfg, "madpo-iter")
    store = ArtifactStore(tmp_path / "artifacts")
    ctx = make_context(c, store, build_taskset(c.taskset, store))
    res = I.run_rounds(ctx)[0]
    rows = store.read_rows(res["shard"])
    texts = {r["chosen"] for r in rows} | {r["rejected"] for r in rows}
    assert any(t.startswith("g") for t in texts)  # the comparator's side came from the HTTP service


def test_retries_back_off_exponentially(server, monkeypatch):
    """A 5xx or a timeout is retried after 0.5 s, 1 s, 2 s, ... (with +-20 % jitter), not at once."""
    import coopflow.stages.rollout.comparator_api as C

    waits = []
    monkeypatch.setattr(C, "_sleep", waits.append)
    with pytest.raises(ValueError, match="failed after 4 attempts: timed out"):
        _call(APIComparator(f"{server}/slow", timeout=0.05, retries=3))
    assert len(waits) == 3
    for w, base in zip(waits, (0.5, 1.0, 2.0)):
        assert 0.8 * base <= w <= 1.2 * base, waits


def test_secrets_never_reach_flow_parameters_or_mlflow_params(server, monkeypatch):
    """`--set` keys and header values become environment variables (the flow-run parameters Prefect stores hold
    only their names); MLflow params mask whatever secret a config still holds; 'env:VAR' headers resolve."""
    import os

    from coopflow.flows.cli import secrets_to_env
    from coopflow.flows.tracking import public_params as _public
    from coopflow.schemas.config import load_config

    monkeypatch.delenv("COOPFLOW_COMPARATOR_API_KEY", raising=False)
    out = secrets_to_env(["seed=1", "trainer.comparator_api_key=sk-SECRET1",
                          'trainer.comparator_api_headers={"X-Org": "org-SECRET2", "X-Id": "env:MY_ID"}'])
    assert not any("SECRET" in o for o in out), out
    assert os.environ["COOPFLOW_COMPARATOR_API_KEY"] == "sk-SECRET1"
    cfg = load_config(None, out + ["trainer.comparator_policy=api", f"trainer.comparator_api_url={server}/h"],
                      algorithm="madpo-iter")
    assert cfg.trainer.comparator_api_key_env == "COOPFLOW_COMPARATOR_API_KEY"
    monkeypatch.setenv("MY_ID", "id-7")
    headers = APIComparator(server, headers=cfg.trainer.comparator_api_headers,
                            key_env="COOPFLOW_COMPARATOR_API_KEY")._headers()
    assert headers["X-Org"] == "org-SECRET2" and headers["X-Id"] == "id-7"
    assert headers["Authorization"] == "Bearer sk-SECRET1"
    plain = load_config(None, ["trainer.comparator_api_key=sk-SECRET3",
                               'trainer.comparator_api_headers={"X-Org": "o-SECRET4"}'], algorithm="madpo-iter")
    assert "SECRET" not in json.dumps(_public(plain))
    monkeypatch.delenv("MY_ID")
    with pytest.raises(ValueError, match=r"comparator_api_headers\['X-Id'\]: environment variable MY_ID is not set"):
        APIComparator(server, headers={"X-Id": "env:MY_ID"})._headers()


@pytest.mark.slow
def test_the_key_appears_nowhere_after_a_tracked_run(server, tmp_path, capfd):
    """An API-comparator round through the Python API with MLflow tracking: the key, given in the config, is in
    no MLflow table, no artifact file and no output (headers and errors never echo it)."""
    from coopflow._direct import run_tracked
    from coopflow.schemas.config import validate_config
    from tests.conftest import small_config

    key, header = "sk-NEVER-LOGGED-4711", "hdr-NEVER-LOGGED-0815"
    cfg = small_config(tmp_path)
    cfg["trainer"] = {"num_iterations": 1, "max_new_tokens": 8, "preference_num_candidates": 2, "train_batch_size": 4,
                      "eval_num_samples": 2, "comparator_policy": "api", "comparator_api_url": f"{server}/gen",
                      "comparator_api_response_field": "data.items", "comparator_api_key": key,
                      "comparator_api_headers": {"X-Org": header}}
    cfg["tracking"] = {"tracking_uri": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    run_tracked(validate_config(cfg, "madpo-iter"), show_progress=False)
    assert SEEN and SEEN[-1]["headers"]["authorization"] == f"Bearer {key}"  # it was used ...
    out = capfd.readouterr()
    for secret in (key, header):  # ... and stored nowhere
        assert secret not in out.out + out.err
        hits = [p for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
        assert not hits, hits
