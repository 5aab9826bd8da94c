"""The backends that train a task (ours, Lightning, the HF Trainer, yours) and their telemetry.

``step_recorder.StepRecorder`` is the trainer-neutral part (``core.measure``, the same step sinks
as our loop: ``steps.csv``, ``layer_norms.csv``, the diagnostics, an MLflow ``TrackedRun``'s
buffer). ``lightning.StabilityCallback`` and ``hf.StabilityCallback`` (their shared part:
``trainer_callback``) feed it from each
trainer's hooks (docs/integrations.md gives the hook orders). ``backends`` holds the
backends a task is trained, rebuilt and checked by (``backends.of``): ``ours`` (our loop) and
the trainers' (``study.Trainer`` around ``lightning_runner``, ``hf_runner``: the mappings of a
point's settings, the rebuild and evaluation the report uses; ``lightning_check``, ``hf_check``:
their check adapters). Importing this package imports
neither Lightning nor transformers: each lives in its own module, an optional extra.
"""
