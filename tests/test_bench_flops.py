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
    calls = flops.coopflow_calls(tmp_path / "data")
    assert sorted(c["agent"] for c in calls) == [0, 0, 1, 1]  # each agent's calls, for the per-agent floors


def test_floors_take_the_larger_of_the_weight_read_and_the_arithmetic_per_decode_step(tmp_path):
    s = flops.Shape.of(_model_dir(tmp_path))  # 1232 matmul weights
    # 1000 FLOP/s, 1000 B/s, bf16 weights (2 bytes), 1000 B/s of durable writes
    lim = flops.Limits(peak=1e-6, read=1e-6, weight_bytes=2, disk=1e-6)
    # the call of the test above: prompt of 3, rows sampling 2 and 1 tokens
    gen, upd = flops.call_floor(s, [3], [(3, 2), (3, 1)], lim)
    prefill = 2 * 1232 * 3 + 4 * 2 * 8 * 6  # 7776 FLOP at 1000 FLOP/s
    step = 2 * 1232 * 1 + 4 * 2 * 8 * 4  # one decode step, one live row at position 4: 2720 FLOP > 2464 bytes read
    assert gen == pytest.approx((prefill + step) / 1000)
    loss = prefill + (2 * 1232 * 2 + 4 * 2 * 8 * 9) + step
    assert upd == pytest.approx(3 * loss / 1000)
    slow_read = flops.Limits(peak=1e-6, read=1e-7, weight_bytes=2, disk=1e-6)  # 100 B/s: the weight read binds
    assert flops.call_floor(s, [3], [(3, 2), (3, 1)], slow_read)[0] == pytest.approx(prefill / 1000 + 1232 * 2 / 100)

    # two agents: side by side (a core each) the slower one's floor, taking turns the sum over the cores
    calls = [{"agent": 0, "distinct": [3], "rows": [[3, 2], [3, 1]]},
             {"agent": 1, "distinct": [3], "rows": [[3, 1], [3, 1]]}]
    g1, u1 = flops.call_floor(s, [3], [(3, 1), (3, 1)], lim)
    assert g1 < gen
    both = flops.phase_floors(s, calls, lim, side_by_side=True, checkpoint_bytes=3000)
    assert both == {"generate": round(gen, 3), "update": round(upd, 3), "checkpoint": 3.0,
                    "train": round(gen + upd + 3.0, 3)}
    turns = flops.phase_floors(s, calls, lim, side_by_side=False, cores=2)
    assert turns["generate"] == round((gen + g1) / 2, 3) and turns["update"] == round((upd + u1) / 2, 3)
    assert turns["checkpoint"] == 0.0


def test_disk_write_bandwidth_is_measured_with_a_durable_write_and_leaves_nothing(tmp_path):
    gbps = flops.disk_write_bandwidth(tmp_path, nbytes=4 << 20, block=1 << 20, streams=(1, 2))
    assert gbps > 0 and list(tmp_path.iterdir()) == []
