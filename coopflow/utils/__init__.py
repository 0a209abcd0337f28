"""Utilities with the reference's import paths (`coopflow.utils.reward_processor`, `…reward_utils`)."""
