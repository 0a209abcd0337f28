"""Helpers every phase uses: seed derivation and loading user code (rewards, formatters, hooks)."""
