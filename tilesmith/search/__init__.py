"""Optimizers: the built-in tuner (no model) and the agent. Each proposes candidate wrapper sources."""
