"""One training run: the step (AMP order, skips, accumulation), measurements, sinks, checkpoints."""
