"""Examine: what the runs' steps show: stability verdicts, layer norms, LR curves, clip advice."""
