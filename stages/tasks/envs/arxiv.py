"""Writing environment (arXiv): two agents expand a paper's abstract into its introduction.

The first agent writes the background and motivation, the second the method and its implications; the
two parts should be of similar size, vocabulary and subject, and read as prose. The shared reward is the
reference's gated four-level reward (range 0..3; a level counts only when the one before it passed):

    L1  both parts have min_words..max_words words (128..256, split on whitespace)        +0.5, else 0
    L2  r = chars(part 2) / chars(part 1): 1 on [1.0, 1.3], (r - 0.8)/0.2 on [0.8, 1.0),
        1 - (r - 1.3)/0.2 on (1.3, 1.5]; outside [0.8, 1.5] the reward stops here           +0..1
    L3  u = unique words of part 2 / of part 1 (lower-cased): 0.5 on [0.7, 1.3],
        0.5 (u - 0.5)/0.2 on [0.5, 0.7), 0.5 (1 - (u - 1.3)/0.4) on (1.3, 1.7]; else stop   +0..0.5
    L4  0.4 T + 0.6 J: T = 0 without transition words, else min(0.4 + min(0.05 (c - 1), 0.6), 1)
        for c categories of transition words used (12 categories); J = min(Jaccard of the
        parts' content words, 0.23) / 0.23                                                 +0..1

Data: `taskset.name: arxiv-mini`, eight abstracts written for this project (CC0; 6 train, 2 eval), or
`arxiv:<file.jsonl | file.json | hf id>` with an `abstract_text` (a string or a list of sentences) or
`abstract` column; plain `arxiv:` reads the hub's OpenMLRL/arXiv_abstract (splits train / val; network
needed). `eval_logger` / `eval_aggregator` report each level, the ratios and the range rates.
"""

import json
import re
from pathlib import Path

ARXIV_HF = "OpenMLRL/arXiv_abstract"
_WORD = re.compile(r"\b\w+\b")

# Transition words, by the relation they mark (a category counts once however many of its words appear).
TRANSITIONS = {
    "addition": ("moreover", "furthermore", "in addition", "additionally", "also", "besides"),
    "contrast": ("however", "in contrast", "whereas", "nevertheless", "on the other hand", "although", "yet"),
    "cause": ("because", "since", "due to", "owing to", "as a result of"),
    "result": ("therefore", "thus", "consequently", "hence", "as a result", "accordingly"),
    "example": ("for example", "for instance", "such as", "e.g.", "in particular", "namely"),
    "sequence": ("first", "second", "then", "next", "finally", "subsequently", "lastly"),
    "emphasis": ("indeed", "notably", "importantly", "in fact", "especially", "above all"),
    "comparison": ("similarly", "likewise", "in the same way", "compared with", "compared to"),
    "summary": ("in summary", "in conclusion", "overall", "to summarize", "in short", "to conclude"),
    "time": ("recently", "previously", "meanwhile", "currently", "to date", "so far"),
    "condition": ("if", "unless", "provided that", "in case", "otherwise"),
    "purpose": ("in order to", "so that", "to this end", "with the aim of", "to address"),
}
STOPWORDS = frozenset("""a an the and or but nor so of to in on at by for with from into onto over under as is are was
were be been being am do does did have has had having it its this that these those there here which who whom whose
what when where why how than then not no can could may might must shall should will would we our us you your they
their them he she his her i me my mine also such both each few more most other some any all only own same too very
just about above after again against before below between during further once out off up down through while""".split())

ABSTRACTS = [  # written for coopflow (CC0): plausible, not real papers
    "We study how small language models can share work on a single task. Two models of 135 million parameters each "
    "write one part of a short program, and a shared reward scores the combined result by running tests. We train "
    "both with a group-relative policy gradient and compare against a single model of the same total size. The pair "
    "learns a stable division of labour within a few hundred updates, and its pass rate exceeds the single model on "
    "problems that need a helper function. We release the training pipeline and the evaluation harness.",
    "Weather stations in rural areas often report gaps of several days, which makes local forecasts unreliable. We "
    "propose a method that fills these gaps from neighbouring stations and satellite estimates, weighting each "
    "source by its recent error. On five years of data from 312 stations, the method halves the error of linear "
    "interpolation for gaps longer than two days. We discuss where it fails, mainly in mountain valleys, and what "
    "further data would help.",
    "Sourdough fermentation depends on a community of yeasts and bacteria whose balance changes with temperature and "
    "feeding schedule. We sequenced 48 home starters over eight weeks while their owners kept baking as usual. "
    "Starters fed daily converged to a few dominant species, while those fed weekly stayed more diverse but rose "
    "less reliably. A simple model of growth and acidity reproduces these trends and suggests feeding rules for "
    "bakers who want a predictable rise.",
    "Code review is a bottleneck in many software teams. We analyse 40,000 reviews from open-source projects and "
    "find that the time to first response predicts whether a change is merged better than its size does. We then "
    "test a reviewer-assignment rule that balances load across the team. In a three-month trial with two projects, "
    "median time to first response fell from 19 to 7 hours without lowering the number of comments per review.",
    "Urban trees cool streets in summer, but their benefit depends on species, spacing and the width of the street. "
    "We combine thermal images from a drone with a survey of 2,100 trees in one city to estimate the cooling each "
    "tree provides. Wide crowns over narrow streets give the largest effect, up to four degrees at noon. We turn "
    "the estimates into a planting guide that ranks streets by the cooling gained per tree planted.",
    "Learning a musical instrument as an adult is common, yet little is known about which practice habits predict "
    "progress. We followed 230 adult piano learners using a practice app for six months. Short daily sessions "
    "predicted faster progress than long weekly ones at the same total time, and reading practice mattered more "
    "than repertoire size. We describe the app data, the progress measure we validated with teachers, and the "
    "limits of observational evidence.",
    "Batteries in electric buses lose capacity faster when they are charged quickly in hot weather. We model the "
    "fleet of a mid-sized city as a scheduling problem that chooses when and how fast each bus charges, subject to "
    "its timetable. Compared with the current first-come rule, the schedule cuts estimated capacity loss by 18 "
    "percent and peak grid demand by a quarter, at no cost to punctuality. The method runs in under a minute for "
    "a fleet of 200 buses.",
    "Many online courses lose most of their students in the first two weeks. We ran a randomised trial in four "
    "courses with 9,000 learners, testing short weekly messages from a named tutor against generic reminders. "
    "Personal messages raised completion of the first module by nine points and of the whole course by four. The "
    "effect was largest for learners who had never taken an online course, which suggests where the effort of "
    "writing such messages pays off most.",
]


# --- data -----------------------------------------------------------------------------------------


def abstract_of(item: dict) -> str:
    """The abstract of a row: `abstract_text` (a string or a list of sentences), else `abstract`, else `prompt`."""
    text = item.get("abstract_text", item.get("abstract", item.get("prompt", "")))
    return " ".join(str(t).strip() for t in text) if isinstance(text, (list, tuple)) else str(text or "").strip()


def _item(row: dict, where: str) -> dict:
    text = abstract_of(row)
    if not text:
        raise ValueError(f"{where}: no abstract (each row needs an abstract_text or abstract column)")
    return {"article_id": str(row.get("article_id", "")), "abstract": text, "prompt": text}


def arxiv_mini_splits() -> dict[str, list[dict]]:
    """{'train': 6 abstracts, 'eval': 2}, written for coopflow."""
    rows = [_item({"article_id": f"mini-{i}", "abstract": a}, "arxiv-mini") for i, a in enumerate(ABSTRACTS)]
    return {"train": rows[:6], "eval": rows[6:]}


def arxiv_source(spec: str):
    """(digest, loader) of `taskset.name: arxiv:<file.jsonl | file.json | hf id>` (empty = the hub dataset):
    a file's every 5th row goes to eval; an HF dataset keeps its train / val (or validation / test) splits."""
    spec = spec or ARXIV_HF
    path = Path(spec).expanduser()
    if path.is_file():
        from coopflow.artifacts import sha256_file

        def load_file() -> dict[str, list[dict]]:
            text = path.read_text(encoding="utf-8")
            rows = json.loads(text) if path.suffix.lower() == ".json" else \
                [json.loads(x) for x in text.splitlines() if x.strip()]
            items = [_item(r, f"{path} row {i + 1}") for i, r in enumerate(rows)]
            return {"train": [r for i, r in enumerate(items) if i % 5], "eval": [r for i, r in enumerate(items) if i % 5 == 0]}

        return {"arxiv_file_sha256": sha256_file(path)}, load_file
    if spec.endswith((".json", ".jsonl")) or "/" not in spec:
        raise FileNotFoundError(f"arXiv source {spec!r} is neither a file nor an HF dataset id (owner/name)")

    def load_hf() -> dict[str, list[dict]]:
        import datasets

        ds = datasets.load_dataset(spec)
        ev = next((s for s in ("val", "validation", "test") if s in ds), None)
        return {"train": [_item(dict(r), f"{spec} train") for r in ds["train"]],
                "eval": [_item(dict(r), f"{spec} {ev}") for r in ds[ev]] if ev else []}

    return {"arxiv_hf": spec}, load_hf


# --- prompts (one formatter per role) ---------------------------------------------------------------

_ASK = "Based on this paper abstract, write part of the paper's introduction.\n\nAbstract:\n{abstract}\n\n"


def background_prompt(item: dict) -> str:
    """Agent 1: the background and motivation (a teammate writes the method and implications)."""
    return (_ASK.format(abstract=abstract_of(item)) + "Write the background and motivation: the problem, why it "
            "matters and what is known. A teammate writes the method and its implications; do not cover those. "
            "Reply with 130-250 words of prose.")


def method_prompt(item: dict) -> str:
    """Agent 2: the method and its implications (a teammate writes the background and motivation)."""
    return (_ASK.format(abstract=abstract_of(item)) + "Write the approach and its implications: what the paper "
            "does, how, and what follows from it. A teammate writes the background and motivation; do not cover "
            "those. Reply with 130-250 words of prose.")


# --- the reward -------------------------------------------------------------------------------------


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def transition_categories(text: str) -> int:
    """How many of the 12 categories of transition words appear in `text` (whole words, lower-cased)."""
    low = " " + " ".join(_words(text)) + " "
    return sum(any(f" {' '.join(_words(w))} " in low for w in words) for words in TRANSITIONS.values())


def arxiv_levels(part1: str, part2: str, min_words: int = 128, max_words: int = 256) -> dict[str, float]:
    """Each level's value computed without gating, the measures behind them, and the gated total (the reward)."""
    n1, n2 = len(part1.split()), len(part2.split())
    l1 = 0.5 if min_words <= n1 <= max_words and min_words <= n2 <= max_words else 0.0
    r = len(part2) / len(part1) if part1 else 0.0
    if 1.0 <= r <= 1.3:
        l2 = 1.0
    elif 0.8 <= r < 1.0:
        l2 = (r - 0.8) / 0.2
    elif 1.3 < r <= 1.5:
        l2 = 1.0 - (r - 1.3) / 0.2
    else:
        l2 = None  # outside [0.8, 1.5]: the gate closes
    u1, u2 = set(_words(part1)), set(_words(part2))
    u = len(u2) / len(u1) if u1 else 0.0
    if 0.7 <= u <= 1.3:
        l3 = 0.5
    elif 0.5 <= u < 0.7:
        l3 = 0.5 * (u - 0.5) / 0.2
    elif 1.3 < u <= 1.7:
        l3 = 0.5 * (1.0 - (u - 1.3) / 0.4)
    else:
        l3 = None
    c = transition_categories(part1 + " " + part2)
    t = 0.0 if c == 0 else min(0.4 + min(0.05 * (c - 1), 0.6), 1.0)
    s1, s2 = u1 - STOPWORDS, u2 - STOPWORDS
    jac = len(s1 & s2) / len(s1 | s2) if s1 | s2 else 1.0
    l4 = 0.4 * t + 0.6 * min(jac, 0.23) / 0.23
    total = 0.0
    if l1 > 0:
        total += l1
        if l2 is not None and part1:
            total += l2
            if l3 is not None and u1:
                total += l3 + l4
    return {"level1": l1, "level2": l2 or 0.0, "level3": l3 or 0.0, "level4": l4, "reward": total,
            "words_1": n1, "words_2": n2, "length_ratio": r, "unique_words_ratio": u, "jaccard": jac,
            "transition_categories": c}


def arxiv_reward(part1: list[str], part2: list[str], min_words: int = 128, max_words: int = 256) -> list[float]:
    """The shared reward of (background, method) pairs: the gated four-level reward (module docstring)."""
    return [arxiv_levels(a, b, min_words, max_words)["reward"] for a, b in zip(part1, part2)]


arxiv_reward.reward_range = (0.0, 3.0)  # type: ignore[attr-defined]


# --- evaluation hooks ---------------------------------------------------------------------------------


def eval_logger(agent_completions_turns, test_cases=None, entry_points=None, prompts=None) -> list[dict]:
    """Per eval item (last turn): `arxiv_levels` of the two parts."""
    return [arxiv_levels(a, b) for a, b in zip(*[[t[-1] for t in agent] for agent in agent_completions_turns[:2]])]


def eval_aggregator(detailed: list[dict], num_turns: int = 1) -> dict[str, float]:
    """Means over eval items of each level, the gated reward, the ratios, the word counts, and how often both
    parts were in the word range and the length ratio in its optimal band [1.0, 1.3]."""
    n = max(1, len(detailed))
    keys = ("level1", "level2", "level3", "level4", "reward", "length_ratio", "unique_words_ratio", "jaccard",
            "transition_categories", "words_1", "words_2")
    out = {f"arxiv/{k}_mean": sum(d[k] for d in detailed) / n for k in keys}
    out["arxiv/in_word_range_rate"] = sum(d["level1"] > 0 for d in detailed) / n
    out["arxiv/optimal_length_ratio_rate"] = sum(1.0 <= d["length_ratio"] <= 1.3 for d in detailed) / n
    return out
