#!/bin/sh
# Run by the one-shot `minio-init` service of docker-compose.yml (docker compose up -d).
# Idempotent: creates the MLflow artifact bucket, a policy limited to that bucket and the
# access key the MLflow server uses, so the server never holds the MinIO root credentials.
set -eu

: "${MINIO_ROOT_USER:?}" "${MINIO_ROOT_PASSWORD:?}" "${MLFLOW_BUCKET:?}"
: "${MLFLOW_S3_ACCESS_KEY:?}" "${MLFLOW_S3_SECRET_KEY:?}"

mc alias set local http://minio:9000 "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD"
mc mb --ignore-existing "local/$MLFLOW_BUCKET"

policy=/tmp/mlflow-artifacts-policy.json
cat > "$policy" <<JSON
{
  "Version": "2012-10-17",
  "Statement": [
    {
      "Effect": "Allow",
      "Action": ["s3:GetBucketLocation", "s3:ListBucket", "s3:ListBucketMultipartUploads"],
      "Resource": ["arn:aws:s3:::$MLFLOW_BUCKET"]
    },
    {
      "Effect": "Allow",
      "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject",
                 "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"],
      "Resource": ["arn:aws:s3:::$MLFLOW_BUCKET/*"]
    }
  ]
}
JSON
mc admin policy create local mlflow-artifacts "$policy"
mc admin user add local "$MLFLOW_S3_ACCESS_KEY" "$MLFLOW_S3_SECRET_KEY"
# mc >= RELEASE.2024-10 treats an already attached policy as success (minio/mc#5058)
mc admin policy attach local mlflow-artifacts --user "$MLFLOW_S3_ACCESS_KEY"
echo "bucket s3://$MLFLOW_BUCKET ready for $MLFLOW_S3_ACCESS_KEY"
