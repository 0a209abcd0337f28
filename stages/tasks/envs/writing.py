"""Writing environment (TL;DR): one agent writes a short summary, the other a longer one, of the same post.

The shared reward is the dual-length reward of the reference's TL;DR example: the short summary should be
about `short_target` characters, and the long one `ratio_min`–`ratio_max` times as long as the short one.

    ratio_score = 1 inside [ratio_min, ratio_max], else 1 - relative distance to it ((min-r)/min below,
                  (r-max)/max above), clamped at -1
    short_score = 1 - |len(short) - short_target| / short_scale   (short_scale default short_target / 2),
                  clamped to [-1, 1]
    reward      = clamp((ratio_score + short_score) / 2, -1, 1);  -1 when either summary is empty

Data: `taskset.name: tldr-mini`, a small set of forum-style posts written for this project (CC0): 12
train and 4 eval posts, each asking to be summarised; with network, `hf:trl-lib/tldr` (Reddit TL;DR,
column `prompt`) works with the same reward and formatters. `length_metrics` is a `metrics_callback`
logging the mean characters of each role's answers; `eval_logger` / `eval_aggregator` are the evaluation
hooks (per role: mean characters; the long/short ratio, how often it is inside [2, 3], how often the
short one is within 20 % of its target).
"""

POSTS = [
    "I moved into a flat with two roommates in March. One of them never washes dishes and leaves them in the sink "
    "for days. We talked twice and he promised to change, but after a week it is always the same. The other "
    "roommate and I are thinking of a rota with a small fine. Is that too harsh, or is there a better way to keep "
    "the peace without making everyone miserable?",
    "My grandmother gave me her old film camera and I shot my first roll last weekend. Half of the photos came out "
    "dark, a few are blurry, but three of them look better than anything my phone has ever taken. I want to keep "
    "going but developing costs add up. Should I learn to develop at home, or just shoot less and pay the lab?",
    "I have been running for six months and signed up for a half marathon in October. My long runs are at 14 km "
    "and my knees start to ache after 10. A friend says to buy new shoes, another says to slow down and add "
    "strength work. I do not want to get injured before race day. What would you try first?",
    "Our small team at work switched from daily meetings to written updates. Meetings were long, but now nobody "
    "reads the updates and problems surface days later. My manager asked me for ideas. I am thinking of a short "
    "meeting twice a week plus the written notes. Has anyone made a mix like this work?",
    "I started baking bread during a long winter and now my family expects a loaf every Sunday. My sourdough "
    "starter is strong, but the crumb is always dense and the crust too pale. I bake at 220 degrees for 40 "
    "minutes in a loaf tin. I would love an open crumb like the bakery's. Where am I going wrong?",
    "Last year I lent a friend a fair amount of money for a deposit on a car. He paid back half within two months "
    "and then stopped mentioning it. We are still close and I do not want to lose the friendship, but I also need "
    "the money for my own move next spring. How do I bring it up without it turning into a fight?",
    "I am learning to play the piano at 35 with an app and a used keyboard. After three months I can play simple "
    "songs with both hands, but reading sheet music is still slow and I mostly memorise. A teacher costs more than "
    "I hoped. Is it worth paying for lessons now, or should I wait until I get better on my own?",
    "We adopted a rescue dog two weeks ago. He is gentle with people but barks at every other dog on walks, and "
    "pulls so hard my shoulder hurts. The shelter said he was found on the street. We want to keep him and make "
    "walks calm for everyone. Should we hire a trainer or try a different harness and more patience first?",
    "I got an offer for a job with a 15 percent raise, but it means a 50 minute commute each way instead of my "
    "current 10 minutes. My present job is comfortable and my boss is kind, though growth is slow. I keep going "
    "back and forth. How did you decide when money and time pulled in different directions?",
    "My balcony gets sun only in the afternoon and I want to grow vegetables there this summer. I tried tomatoes "
    "last year and got lots of leaves but only a handful of fruit. I have six large pots and a small budget. Which "
    "plants would do better with half a day of sun, and what did I do wrong with the tomatoes?",
    "I volunteered to organise a reunion for my school class, twenty years on. About 60 people are in the group "
    "chat, 25 said maybe and only 8 confirmed. The venue needs a final number in three weeks and a deposit. I do "
    "not want to pay for an empty room. How do I get people to commit, or should I pick something smaller?",
    "I have been keeping a paper journal every night for a year. It helped me sleep and notice my moods, but lately "
    "it feels like a chore and I write the same three lines. I do not want to quit a habit that helped. Has anyone "
    "changed how they journal to make it feel useful again?",
    "My neighbour's tree drops branches onto my car during storms. Last month one cracked the windscreen. I asked "
    "him politely to trim it and he said it is not his problem because the branches are over my side. I would like "
    "to solve this without lawyers. What are my options, and who usually pays for the trimming?",
    "I bought a second-hand bicycle for commuting and after a month the gears skip when I pedal hard uphill. The "
    "shop wants a fair amount to replace the chain and cassette. Videos make it look easy to do it myself with a "
    "few tools. Is this a sensible first repair to learn, or will I make it worse?",
    "After years in the city I am considering moving back to the small town where I grew up. Rent would be half, "
    "my parents are getting older, and I can work remotely. But most of my friends are here and I worry about "
    "feeling isolated. For those who moved back home, what surprised you, good or bad?",
    "I want to start cooking for myself instead of ordering food every night. I can make pasta and eggs, and that "
    "is about it. I have a small kitchen, one good pan and about an hour each evening. What is a realistic plan "
    "for the first month so I do not give up after a week?",
]

ASK = "\n\nSummarise this post."


def tldr_mini_splits() -> dict[str, list[dict]]:
    """{'train': 12 posts, 'eval': 4 posts}, each item's prompt the post plus the request to summarise it."""
    rows = [{"post": p, "prompt": p + ASK} for p in POSTS]
    return {"train": rows[:12], "eval": rows[12:]}


def dual_length_reward(short: list[str], long: list[str], ratio_min: float = 2.0, ratio_max: float = 3.0,
                       short_target: int = 220, short_scale: float | None = None) -> list[float]:
    """The shared reward of (short summary, long summary) pairs (see the module docstring)."""
    scale = short_scale or short_target / 2
    out = []
    for s, lg in zip(short, long):
        ls, ll = len(s.strip()), len(lg.strip())
        if ls == 0 or ll == 0:
            out.append(-1.0)
            continue
        r = ll / ls
        if ratio_min <= r <= ratio_max:
            ratio_score = 1.0
        elif r < ratio_min:
            ratio_score = 1.0 - (ratio_min - r) / ratio_min
        else:
            ratio_score = 1.0 - (r - ratio_max) / ratio_max
        ratio_score = max(-1.0, ratio_score)
        short_score = max(-1.0, min(1.0, 1.0 - abs(ls - short_target) / scale))
        out.append(max(-1.0, min(1.0, 0.5 * (ratio_score + short_score))))
    return out


dual_length_reward.reward_range = (-1.0, 1.0)  # type: ignore[attr-defined]


def length_metrics(samples: list[dict]) -> dict[str, float]:
    """metrics_callback: the mean characters of each agent's answers (`agent_i/char_length_mean`)."""
    by: dict[int, list[int]] = {}
    for s in samples:
        by.setdefault(s["agent"], []).append(len(s["completion_text"]))
    return {f"agent_{a}/char_length_mean": sum(v) / len(v) for a, v in sorted(by.items())}


# --- evaluation hooks ---------------------------------------------------------------------------------


def eval_logger(agent_completions_turns, test_cases=None, entry_points=None, prompts=None,
                ratio_min: float = 2.0, ratio_max: float = 3.0, short_target: int = 220) -> list[dict]:
    """Per eval item (last turn): each role's length, the long/short ratio and whether each meets its target."""
    out = []
    for short, long in zip(*[[turns[-1] for turns in agent] for agent in agent_completions_turns[:2]]):
        ls, ll = len(short.strip()), len(long.strip())
        ratio = ll / ls if ls else 0.0
        out.append({"short_chars": ls, "long_chars": ll, "ratio": ratio,
                    "ratio_in_range": ls > 0 and ratio_min <= ratio <= ratio_max,
                    "short_on_target": abs(ls - short_target) <= 0.2 * short_target})
    return out


def eval_aggregator(detailed: list[dict], num_turns: int = 1) -> dict[str, float]:
    """Means over eval items: short/long characters, the ratio, and the two target rates."""
    n = max(1, len(detailed))
    return {"short/char_length_mean": sum(d["short_chars"] for d in detailed) / n,
            "long/char_length_mean": sum(d["long_chars"] for d in detailed) / n,
            "long_short_ratio_mean": sum(d["ratio"] for d in detailed) / n,
            "ratio_in_range_rate": sum(d["ratio_in_range"] for d in detailed) / n,
            "short_on_target_rate": sum(d["short_on_target"] for d in detailed) / n}
