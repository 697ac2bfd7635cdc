#!/usr/bin/env bash
# The README's test command: formatting, lints, then every test of the
# workspace (unit tests, and integration tests that boot real guests under KVM
# and QEMU), every binary even after one fails (--no-fail-fast). Ends with one
# "N passed, N failed, N skipped" line totalling all test binaries; tests that
# cannot run on this host print "SKIP <test>: <reason>" and count as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fmt --all -- --check
(cd guest/kernel && cargo fmt --all -- --check)
(cd linux-init && cargo fmt --all -- --check)
cargo clippy --workspace --all-targets --locked -- -D warnings
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$log" || status=$?
# Every skip again, with its reason, where the totals can be read.
if grep -q '^SKIP ' "$log"; then
    echo "skipped checks (this host cannot run them):"
    grep '^SKIP ' "$log" | sed 's/^/  /'
fi
# Each test binary's wall time, slowest first, so that a slower suite shows
# where (the suite's length is a benchmark: docs/results.md).
echo "test binaries by wall time (s):"
awk '/^ *Running / { name = ($2 == "unittests") ? "unit tests " $NF : $2 } /^test result:/ { t = $NF; sub(/s$/, "", t); printf "  %8.1f  %s\n", t, name }' "$log" \
    | sort -rn | head -12
# A test that skips prints "SKIP <test>: <reason>" and then passes as far
# as cargo counts: the skipped (distinct tests that printed SKIP) are taken
# out of the passed, so the totals say how many tests really ran.
skipped=$(grep '^SKIP ' "$log" | sed 's/^SKIP \([^:]*\):.*/\1/' | sort -u | wc -l)
awk -v s="$skipped" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "%d passed, %d failed, %d skipped\n", p - s, f, s }' "$log"
exit "$status"
