"""flows.tracking: the reward-curve SVG and the tracker's batching of its first writes."""

import xml.etree.ElementTree as ET

import pytest

from flows.tracking import Tracker, _ticks, reward_curve_svg

SVG = "{http://www.w3.org/2000/svg}"


def test_ticks_are_round_and_cover_the_range():
    assert _ticks(4, 16) == [0, 5, 10, 15, 20]
    assert _ticks(0.1, 0.5) == [0.1, 0.2, 0.3, 0.4, 0.5]  # (0.5 - 0.1) / 0.1 is 4.000000000000001
    assert _ticks(-1.2, 3.7) == [-2, 0, 2, 4]
    assert _ticks(0.3, 0.3) == [-0.5, 0.0, 0.5, 1.0]  # a flat curve still gets an axis


def test_reward_curve_svg_draws_every_finite_point_on_its_axes():
    svg = reward_curve_svg([4, 8, 12, 16], [0.1, 0.5, float("nan"), 0.3], "magrpo <a&b>")
    root = ET.fromstring(svg)  # well-formed, the title escaped
    texts = [t.text for t in root.iter(SVG + "text")]
    assert "magrpo <a&b>" in texts and "env_step" in texts and "turn_1/reward_mean" in texts
    assert {"0.1", "0.5", "0", "20"} <= set(texts)
    dots = [(float(c.get("cx")), float(c.get("cy"))) for c in root.iter(SVG + "circle")]
    assert len(dots) == 3  # the NaN point is left out
    # plot box: x from 64 to 584 for env_step 0..20, y from 276 (0.1) up to 28 (0.5)
    assert dots[0] == pytest.approx((64 + 4 / 20 * 520, 276.0))
    assert dots[1] == pytest.approx((64 + 8 / 20 * 520, 28.0))
    poly = root.find(SVG + "polyline").get("points").split()
    assert len(poly) == 3


def test_reward_curve_svg_of_nothing_finite_is_still_an_image():
    root = ET.fromstring(reward_curve_svg([4], [float("nan")], "t"))
    assert root.tag == SVG + "svg"


def test_a_new_run_gets_its_queued_tags_with_its_params(tmp_path, monkeypatch):
    tr = Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "x", True, artifact_location=(tmp_path / "art").as_uri())
    calls = []
    real = tr.client.log_batch
    monkeypatch.setattr(tr.client, "log_batch", lambda *a, **k: calls.append(k) or real(*a, **k))
    tr.tag({"lineage.taskset": "taskset/abc@123"})
    run_id = tr.start("r", {"coopflow.run_key": "k"}, {"a": 1, "b": {"c": [1, 2]}})
    assert len(calls) == 1 and not tr._tags
    tr.flush()  # nothing queued: no call
    assert len(calls) == 1
    run = tr.client.get_run(run_id)
    assert run.data.tags["lineage.taskset"] == "taskset/abc@123" and run.data.tags["coopflow.run_key"] == "k"
    assert run.data.params == {"a": "1", "b.c": "[1, 2]"}
