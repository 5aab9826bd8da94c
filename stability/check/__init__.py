"""``stability check``: probes of a training loop's stability mechanics (docs/check.md)."""
