"""Present: the Study, its sections, report.md and .html, figures, tables; reads no MLflow."""
