#!/usr/bin/env bash
# The S3 test group against a real S3-compatible server on 127.0.0.1:
# installs s3s-fs (pinned; newer versions need a newer compiler) when
# missing, starts it on a fresh data directory with a pre-created bucket,
# waits until it answers, runs `tests/s3.rs` (submit, multi-step run,
# signal wait, group, restart from a second process, wrong credentials,
# a cluster of two worker processes with one killed by SIGKILL,
# the benchmark against a local directory, and the kill -9 torture on the
# bucket) and the CLI's bucket tests (taquba-workflow-cli/tests/cli/s3.rs:
# reading and steering, and what each writes to the bucket),
# and stops the server by its PID whatever happens.
#
# Environment: S3_PORT (default: a free port), KILL9_KILLS (default 50),
# FEATURES (cargo features of the test build, default `aws`).
set -euo pipefail
cd "$(dirname "$0")/.."

S3S_VERSION=0.14.1
if ! command -v s3s-fs >/dev/null 2>&1 || ! s3s-fs --version 2>/dev/null | grep -qx "s3s-fs $S3S_VERSION"; then
  echo "== installing s3s-fs $S3S_VERSION"
  started=$(date +%s)
  # Its own target directory: the install must not touch the project's.
  cargo install "s3s-fs@$S3S_VERSION" --features binary --locked --target-dir /tmp/s3s-fs-target
  # Its build is not needed once the binary is installed: free the disk.
  rm -rf /tmp/s3s-fs-target
  echo "== s3s-fs installed in $(( $(date +%s) - started ))s"
fi

DATA=$(mktemp -d /tmp/s3s-data.XXXXXX)
BUCKET=taquba-ci
mkdir -p "$DATA/root/$BUCKET"
PORT=${S3_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
ACCESS_KEY=taquba-ci-access
SECRET_KEY=taquba-ci-secret-key

s3s-fs --host 127.0.0.1 --port "$PORT" --access-key "$ACCESS_KEY" --secret-key "$SECRET_KEY" "$DATA/root" >"$DATA/server.log" 2>&1 &
S3_PID=$!
stop_server() {
  kill "$S3_PID" 2>/dev/null || true
  wait "$S3_PID" 2>/dev/null || true
  rm -rf "$DATA"
}
trap stop_server EXIT

for _ in $(seq 1 200); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    break
  fi
  if ! kill -0 "$S3_PID" 2>/dev/null; then
    echo "s3s-fs exited before answering:" >&2
    cat "$DATA/server.log" >&2
    exit 1
  fi
  sleep 0.1
done
(exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null || { echo "s3s-fs did not answer on port $PORT" >&2; exit 1; }
echo "== s3s-fs $S3S_VERSION (pid $S3_PID) on 127.0.0.1:$PORT, bucket $BUCKET"

export AWS_ENDPOINT="http://127.0.0.1:$PORT"
export AWS_BUCKET="$BUCKET"
export AWS_ACCESS_KEY_ID="$ACCESS_KEY"
export AWS_SECRET_ACCESS_KEY="$SECRET_KEY"
export AWS_REGION=us-east-1
export AWS_ALLOW_HTTP=true
# s3s-fs keeps each object as a file under its root: the CLI's test of
# what it writes to a bucket compares them before and after.
export S3S_DATA_ROOT="$DATA/root"

started=$(date +%s)
cargo test --features "${FEATURES:-aws}" --test s3 -- --nocapture --test-threads=1
# The taquba-workflow CLI against the same bucket (`--store s3://...`).
cargo test -p taquba-workflow-cli --features aws --test cli s3:: -- --nocapture
echo "== S3 test group took $(( $(date +%s) - started ))s"
