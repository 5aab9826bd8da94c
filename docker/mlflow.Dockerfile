# Built by `docker compose up -d` (or `docker compose build mlflow`) from docker-compose.yml.
# The official MLflow image ships neither a PostgreSQL driver nor boto3; this adds both, pinned,
# at build time so that a restart never depends on PyPI being reachable, and Flask-WTF, what
# `mlflow[auth]` adds for `--app-name basic-auth` (docker/mlflow-server.sh).
# Same minor release as the client (pyproject: mlflow>=3.1,<4; installed 3.17.x).
FROM ghcr.io/mlflow/mlflow:v3.17.0

RUN pip install --no-cache-dir psycopg2-binary==2.9.13 boto3==1.44.8 Flask-WTF==1.3.0
