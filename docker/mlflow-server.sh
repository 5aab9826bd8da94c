#!/bin/sh
# The one command line of the team MLflow server. docker-compose.yml runs it in the `mlflow`
# container and tests/helpers/stack.py runs it natively against PostgreSQL and an S3 server,
# so the stack the suite tests is the stack users start (they cannot drift).
#
# Every setting arrives in the environment (docker-compose.yml builds it from .env): secrets
# stay out of the command line and so out of `ps`.
#   MLFLOW_BACKEND_STORE_URI   postgresql+psycopg2://user:password@host:port/db (runs, metrics)
#   MLFLOW_AUTH_DATABASE_URI   the same server, database of MLflow's user store (basic-auth)
#   MLFLOW_BUCKET              artifacts go to s3://$MLFLOW_BUCKET/ (proxied by this server)
#   MLFLOW_S3_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY   the S3 server and key
#   MLFLOW_AUTH_ADMIN_PASSWORD      first admin's password (MLflow reads it; >= 12 characters)
#   MLFLOW_FLASK_SERVER_SECRET_KEY  signs the UI's session cookies and CSRF tokens
#   MLFLOW_ALLOWED_HOSTS       Host headers accepted (DNS-rebinding guard)
#   MLFLOW_HOST, MLFLOW_PORT   where to listen (default 127.0.0.1:5000; docker-compose.yml sets
#                              MLFLOW_HOST=0.0.0.0 inside the container, published on loopback)
set -eu

: "${MLFLOW_BACKEND_STORE_URI:?}" "${MLFLOW_AUTH_DATABASE_URI:?}" "${MLFLOW_BUCKET:?}"
: "${MLFLOW_S3_ENDPOINT_URL:?}" "${AWS_ACCESS_KEY_ID:?}" "${AWS_SECRET_ACCESS_KEY:?}"
: "${MLFLOW_AUTH_ADMIN_PASSWORD:?}" "${MLFLOW_FLASK_SERVER_SECRET_KEY:?}"
: "${MLFLOW_ALLOWED_HOSTS:?}"

# A secret still holding .env.example's placeholder is refused: a server started with a
# password everyone can read in the repository is open to anyone who reaches it.
for name in MLFLOW_AUTH_ADMIN_PASSWORD MLFLOW_FLASK_SERVER_SECRET_KEY AWS_SECRET_ACCESS_KEY \
            MLFLOW_BACKEND_STORE_URI MLFLOW_AUTH_DATABASE_URI; do
  eval "value=\${$name}"
  case "$value" in
    *change-me*)
      echo "error: $name holds the .env.example placeholder (change-me...): allowed values are your own secret (docs/team-server.md)" >&2
      exit 2 ;;
  esac
done

# MLflow 3 sends usage telemetry unless told not to; a team server reports nothing outside.
export MLFLOW_DISABLE_TELEMETRY=true

# basic-auth reads its settings from an ini file only; it holds the user-store URI (a
# password), so it is written here, readable by this user alone (mktemp creates it 0600).
auth_ini=$(mktemp "${TMPDIR:-/tmp}/mlflow-auth.XXXXXX")
cat > "$auth_ini" <<INI
[mlflow]
# READ: every signed-in member reads every experiment (studies are compared across the
# team); writing needs EDIT on the experiment, which its creator holds (MANAGE) and grants.
default_permission = READ
database_uri = $MLFLOW_AUTH_DATABASE_URI
admin_username = admin
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
# A password check is a scrypt hash (~0.1 s of CPU) on every request: without this cache a
# sweep's per-step logging keeps the server's one worker busy hashing. A cached entry is only
# a success, keyed by an HMAC of the password with a per-process key; password changes and
# deletions through the API drop it at once (one worker, so no other worker holds a stale one);
# a change made directly in the database takes effect within the TTL.
auth_cache_ttl_seconds = 60
INI
export MLFLOW_AUTH_CONFIG_PATH="$auth_ini"
# The server-side job runner (GenAI jobs) starts ~10 busy consumer processes this project
# never uses.
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false
# MLflow's SQL store takes a second pooled connection inside most requests and the server runs
# up to 40 at once: with SQLAlchemy's default pool (5 + 10 overflow), 16 or more concurrent
# writers (sweep jobs) all wait for a second connection until the pool times out (30 s); 32
# writers logged nothing (docs/performance.md, "Ten times the study"). 5 + 40 > 40 cannot
# deadlock, and with the user store's pool (the same settings) stays under PostgreSQL's 100.
export MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW="${MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW:-40}"

# --workers 1: MLflow 3.x with its default 4 uvicorn workers adds ~40 ms to every keep-alive
# request (measured on our machines), which a sweep logging every optimizer step pays
# thousands of times. One worker keeps up with a team's sweeps.
# --serve-artifacts: clients upload through this server (mlflow-artifacts:/ URIs), so
# training nodes need no S3 credentials and no route to the S3 server.
exec mlflow server \
  --app-name basic-auth \
  --host "${MLFLOW_HOST:-127.0.0.1}" \
  --port "${MLFLOW_PORT:-5000}" \
  --workers 1 \
  --serve-artifacts \
  --artifacts-destination "s3://$MLFLOW_BUCKET/" \
  --allowed-hosts "$MLFLOW_ALLOWED_HOSTS"
