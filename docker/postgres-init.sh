#!/bin/sh
# Creates the database of MLflow's user store (basic-auth) beside the tracking database, owned
# by the same role. docker-compose.yml mounts it into the postgres image's
# /docker-entrypoint-initdb.d (run once, on an empty volume); tests/helpers/stack.py runs it
# against its native PostgreSQL (PGHOST / PGPORT set). Idempotent.
set -eu

: "${POSTGRES_USER:?}" "${POSTGRES_DB:?}" "${MLFLOW_AUTH_DB:?}"

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<SQL
SELECT 'CREATE DATABASE "$MLFLOW_AUTH_DB" OWNER "$POSTGRES_USER"'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$MLFLOW_AUTH_DB')\gexec
SQL
echo "database $MLFLOW_AUTH_DB ready for $POSTGRES_USER"
