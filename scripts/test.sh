#!/usr/bin/env bash
# The README's test command: formatting, lints, then every test of the
# workspace (unit tests, and integration tests that boot real guests under KVM
# and QEMU).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
(cd guest/kernel && cargo fmt --all -- --check)
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
