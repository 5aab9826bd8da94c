"""MLflow: a run's records through a journal that survives outages, the contract, the server."""
