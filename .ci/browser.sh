#!/usr/bin/env bash
# The dashboard in a real browser (taquba-workflow-cli/tests/browser.rs):
# installs Debian's chromium and chromium-driver when missing, builds the
# main example (word_report, whose store the test browses), and runs the
# test with the CLI's `browser-test` feature. The test starts and stops
# chromedriver, the example and the dashboard itself, on loopback.
#
# Environment: DASHBOARD_SCREENSHOT (where the test writes the run page's
# PNG; default: in the target directory; the README's image is
# docs/dashboard-run.png, refreshed with DASHBOARD_SCREENSHOT=docs/dashboard-run.png).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "== installing chromium and chromium-driver"
  started=$(date +%s)
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
  echo "== installed in $(( $(date +%s) - started ))s"
fi
chromium --version 2>/dev/null || true
chromedriver --version

echo "== building the main example"
cargo build --example word_report
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
export WORD_REPORT_BIN="$TARGET_DIR/debug/examples/word_report"
CHROMEDRIVER=$(command -v chromedriver)
CHROMIUM=$(command -v chromium)
export CHROMEDRIVER CHROMIUM

echo "== the browser test"
cargo test -p taquba-workflow-cli --features browser-test --test browser -- --nocapture
