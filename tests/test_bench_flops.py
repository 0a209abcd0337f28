"""bench/flops.py: the efficiency figure's FLOP count, against values worked out by hand, and the count of a real
coopflow run read back from its rollout tables."""

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import flops  # noqa: E402


def _model_dir(tmp_path: Path) -> Path:
    cfg = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
           "num_key_value_heads": 1, "vocab_size": 10}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_shape_counts_every_projection_and_the_lm_head(tmp_path):
    s = flops.Shape.of(_model_dir(tmp_path))
    assert (s.head_dim, s.kv_heads) == (4, 1)
    # per layer: q 8x8 + k, v 8x4 each + o 8x8 + gate, up, down 8x16 each = 64 + 64 + 64 + 384; x2 layers; + head 80
    assert s.matmul_params == 2 * (64 + 2 * 32 + 64 + 3 * 128) + 80 == 1232
    # 3 tokens whose attention contexts sum to 6 (a causal prefill of 3): 2*1232*3 + 4*2 layers*(2*4)*6
    assert s.forward(3, 6) == 2 * 1232 * 3 + 4 * 2 * 8 * 6 == 7776


def test_a_generate_call_counts_prompts_once_and_each_sampled_token(tmp_path):
    s = flops.Shape.of(_model_dir(tmp_path))
    w = flops.Work()
    # one distinct prompt of 3 tokens, two rows sampling 2 and 1 tokens
    w.add_call(s, [3], [(3, 2), (3, 1)])
    prefill = s.forward(3, 1 + 2 + 3)
    decode = s.forward(1, 4)  # row 1's second token: one forward at position 4 over 4 slots; row 2 needs none
    loss = prefill + s.forward(2, 4 + 5) + s.forward(1, 4)  # completions on their prompt: contexts 4, 5 and 4
    assert w.generate == pytest.approx(prefill + decode)
    assert w.update == pytest.approx(3 * loss)
    assert (w.calls, w.prompt_tokens, w.sampled_tokens) == (1, 3, 3)
    assert flops.rates(w, {"generate": 2.0, "train": 0.0}) == {"generate_gflops": round(w.generate / 2.0 / 1e9, 1)}
    # the same call as bench/peer_run.py records it
    assert flops.Work.of_calls(s, [{"distinct": [3], "rows": [[3, 2], [3, 1]]}]).as_dict() == w.as_dict()


def test_a_coopflow_runs_work_is_read_from_its_rollouts(tmp_path, tiny_model_dir):
    from coopflow.schemas.config import load_config
    from coopflow.flows.driver import run_inline

    cfg = load_config(REPO / "configs" / "magrpo-story.yaml",
                      [f"agents.agent_model={tiny_model_dir}", f"data_dir={tmp_path / 'data'}", "taskset.num_items=2",
                       "trainer.num_train_epochs=1", "trainer.max_new_tokens=4"], algorithm="magrpo")
    run_inline(cfg)
    w = flops.coopflow_work(tmp_path / "data", tiny_model_dir)
    # 2 items x 2 agents, one call each (rbs 1); K=4 samples of at most 4 tokens per call
    assert w.calls == 4 and 0 < w.sampled_tokens <= 4 * 4 * 4
    assert w.generate > 0 and w.update > 2 * w.generate  # the loss reruns the prompt and the completions, x3
