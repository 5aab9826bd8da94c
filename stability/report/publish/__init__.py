"""Publish: the report run in MLflow, the Model Registry, the run and experiment descriptions."""
