#!/usr/bin/env bash
# The dashboard in a real browser: headless Chromium over WebDriver
# against `taquba-workflow ui` on a store made by the main example (the
# test: taquba-workflow-cli/browser/tests/dashboard.rs). Installs Debian's
# chromium and chromium-driver when missing, builds the CLI and the
# example in the workspace, then runs the test package, which starts and
# stops chromedriver, the example and the dashboard itself, on loopback
# with a login token (TAQUBA_WORKFLOW_UI_TOKEN) that the browser types
# into the login form.
#
# The test is a package of its own (taquba-workflow-cli/browser, outside
# the workspace): its WebDriver client's dependencies would change the
# features of crates the workspace shares (syn, time) and rebuild most of
# it; on its own it builds only the client.
#
# Environment: DASHBOARD_SCREENSHOT (where the test writes the run page's
# PNG; default: in the target directory). The README's image is
# docs/dashboard-run.png: DASHBOARD_SCREENSHOT=$PWD/docs/dashboard-run.png
# bash .ci/browser.sh refreshes it.
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

# The whole workspace is selected, as `cargo test --workspace` selects it,
# so every dependency's features resolve the same and its build is reused.
echo "== building taquba-workflow and the main example"
cargo build --workspace --bin taquba-workflow --example word_report
TARGET_DIR=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
export TAQUBA_WORKFLOW_BIN="$TARGET_DIR/debug/taquba-workflow"
export WORD_REPORT_BIN="$TARGET_DIR/debug/examples/word_report"
CHROMEDRIVER=$(command -v chromedriver)
CHROMIUM=$(command -v chromium)
export CHROMEDRIVER CHROMIUM

echo "== the browser test"
cargo fmt --manifest-path taquba-workflow-cli/browser/Cargo.toml -- --check
CARGO_TARGET_DIR="$TARGET_DIR" cargo test --locked \
  --manifest-path taquba-workflow-cli/browser/Cargo.toml -- --nocapture
