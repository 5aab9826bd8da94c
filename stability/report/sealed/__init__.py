"""The sealed test: the winner's checkpoints rebuilt and evaluated once, after selection."""
