"""The study: a grid or adaptive rounds of runs on a pool, submitit or SLURM; resumable."""
