"""Fetch: a sweep read out of MLflow: its runs, whose they are, its grid, the runs' step tables."""
