"""Operations on runs and data dirs, apart from training: `preflight` (every check that needs no model, before a
run starts) and `gc` (what recorded runs need, what can be deleted).
"""
