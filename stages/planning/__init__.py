"""Run planning: what a run needs resolved from its config before anything runs.

`context` (RunContext: items, rewards, sampling, episode shape and the frozen RunPlan), `plan` (updates and
segments), `inputs` (which config fields each artifact kind depends on), `keys` (the chained input-addressed
keys computed from them), `budget` (sequences and disk, checked up front) and `session` (the live
resources of one run, apart from its plan).
"""
