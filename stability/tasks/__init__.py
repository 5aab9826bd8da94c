"""The built-in tasks: small models and data with a sealed test split (``core.task.Task``)."""
