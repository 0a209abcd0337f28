"""Stage: reward-distribution ("dataset drift") log of an iterative round, as CoMLRL 1.4.3 logs it.

Per round: 16-bin histograms over the reward's declared range [min, max] (values clipped into it) of
the raw task rewards of the target's and the comparator's candidates, and of the selected pairs'
target / comparator rewards. Written as a JSON artifact with the reference's layout
({iteration, reward_min, reward_max, num_bins, bin_edges, bin_centers, candidate: {target|comparator:
{sample_count, mean, counts, raw_rewards}}, selected: {...}}), as `iter/reward_distribution/*`
metrics, and as small SVG plots (orange target, grey comparator; counts only, no densities).
"""

NUM_BINS = 16


def histogram(values: list[float], lo: float, hi: float, bins: int = NUM_BINS) -> list[int]:
    """Counts in `bins` equal bins over [lo, hi]; values outside are clipped into the end bins."""
    if not hi > lo:
        raise ValueError(f"reward range must have min < max, got [{lo}, {hi}]")
    counts = [0] * bins
    for v in values:
        x = min(max(v, lo), hi)
        counts[min(bins - 1, int((x - lo) / (hi - lo) * bins))] += 1
    return counts


def _side(values: list[float], lo: float, hi: float) -> dict:
    return {"sample_count": len(values), "mean": sum(values) / len(values) if values else None,
            "counts": histogram(values, lo, hi), "raw_rewards": list(values)}


def drift_record(iteration: int, lo: float, hi: float, target: list[float], comparator: list[float],
                 sel_target: list[float], sel_comparator: list[float]) -> dict:
    """The per-round JSON record."""
    step = (hi - lo) / NUM_BINS
    edges = [lo + i * step for i in range(NUM_BINS + 1)]
    return {"iteration": iteration, "reward_min": lo, "reward_max": hi, "num_bins": NUM_BINS, "bin_edges": edges,
            "bin_centers": [(a + b) / 2 for a, b in zip(edges, edges[1:])],
            "candidate": {"target": _side(target, lo, hi), "comparator": _side(comparator, lo, hi)},
            "selected": {"target": _side(sel_target, lo, hi), "comparator": _side(sel_comparator, lo, hi)}}


def drift_metrics(rec: dict) -> dict[str, float]:
    """iter/reward_distribution/* and iter/selected_reward_distribution/* metrics of a record."""
    out: dict[str, float] = {}
    for part, prefix in (("candidate", "iter/reward_distribution/"), ("selected", "iter/selected_reward_distribution/")):
        t, c = rec[part]["target"], rec[part]["comparator"]
        out[prefix + "current_iteration"] = float(rec["iteration"])
        out[prefix + "target_sample_count"] = float(t["sample_count"])
        out[prefix + "comparator_sample_count"] = float(c["sample_count"])
        if t["mean"] is not None:
            out[prefix + "target_mean"] = t["mean"]
        if c["mean"] is not None:
            out[prefix + "comparator_mean"] = c["mean"]
    out["iter/selected_reward_distribution/pair_count"] = float(rec["selected"]["target"]["sample_count"])
    return out


def bar_svg(rec: dict, part: str = "candidate", width: int = 240, height: int = 80) -> str:
    """A 240×80 SVG bar plot of one part's histograms (orange target, grey comparator)."""
    t, c = rec[part]["target"]["counts"], rec[part]["comparator"]["counts"]
    top = max(t + c + [1])
    bw = (width - 20) / NUM_BINS / 2
    bars = []
    for i, (a, b) in enumerate(zip(t, c)):
        x = 16 + i * 2 * bw
        for j, (v, color) in enumerate(((a, "#f28e2b"), (b, "#9d9d9d"))):
            h = (height - 20) * v / top
            bars.append(f'<rect x="{x + j * bw:.1f}" y="{height - 12 - h:.1f}" width="{bw:.1f}" height="{h:.1f}" '
                        f'fill="{color}"/>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">' + "".join(bars)
            + f'<text x="{width / 2:.0f}" y="{height - 1}" font-size="8" text-anchor="middle">reward</text>'
            + f'<text x="2" y="10" font-size="8">count</text></svg>')
