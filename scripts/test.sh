#!/usr/bin/env bash
# The README's test command: formatting, lints, then every test of the
# workspace (unit tests, and integration tests that boot real guests under KVM
# and QEMU), every binary even after one fails (--no-fail-fast). Ends with one
# "N passed, N failed, N skipped" line totalling all test binaries; tests that
# cannot run on this host print "SKIP <test>: <reason>" and count as skipped.
#
# The test binaries are built first (`cargo test --no-run`), then run
# PTISCOPE_TEST_JOBS at a time (default 2), the slowest first, those that
# boot Linux under QEMU one at a time beside the others: a binary that
# waits (timeouts, sleeps, a VM's start and stop) leaves a core to the
# next one. Each binary's output is printed whole when
# it ends, under cargo's own "Running" line. PTISCOPE_TEST_JOBS=1 runs them
# one after another, as `cargo test` does. Arguments after `--` go to every
# test binary (e.g. `scripts/test.sh -- --test-threads=1`).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
if ! command -v jq >/dev/null; then
    echo "scripts/test.sh needs jq to read cargo's list of test binaries: install it (apt-get install jq;" >&2
    echo ".ci/run does), or run the tests one binary at a time with: cargo test --workspace --no-fail-fast" >&2
    exit 2
fi
cargo fmt --all -- --check
(cd guest/kernel && cargo fmt --all -- --check)
(cd linux-init && cargo fmt --all -- --check)
cargo clippy --workspace --all-targets --locked -- -D warnings
[ "${1:-}" = "--" ] && shift
jobs=${PTISCOPE_TEST_JOBS:-2}
case "$jobs" in '' | *[!0-9]* | 0) echo "PTISCOPE_TEST_JOBS must be a positive number, not '$jobs'" >&2; exit 2 ;; esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log=$work/log
status=0
started=$(date +%s)

# Every test binary, with the directory cargo runs it in (its package's)
# and the name cargo shows for it: `tests/NAME.rs`, or `unittests
# src/lib.rs` / `src/main.rs` of a package. The JSON messages are cargo's
# stable interface; a build error is shown as cargo shows it.
cargo test --workspace --locked --no-run --message-format=json-render-diagnostics >"$work/build.json" || status=$?
if [ "$status" != 0 ]; then
    echo "the tests did not build" >&2
    exit "$status"
fi
jq -r --arg root "$root/" '
    select(.reason == "compiler-artifact" and .executable != null and .profile.test == true)
    | (.manifest_path | sub("/Cargo.toml$"; "")) as $dir
    | (if .target.kind[0] == "test" then (.target.src_path | ltrimstr($root) | sub("^vmm/"; ""))
       else "unittests " + (.target.src_path | ltrimstr($dir + "/")) end) as $shown
    | [$dir, .executable, $shown] | @tsv' "$work/build.json" >"$work/binaries"

# The order: the slowest first (per-binary times of the last full runs:
# docs/results.md, "Test suite length"), so that a long one does not start
# last and run alone. The binaries that boot Linux under QEMU TCG ("heavy":
# each keeps both cores busy with its own two tests, and their boots have
# timeouts) run one at a time while lighter ones remain, beside them.
heavy="linux linux_ab linux_symbols nested_linux nested"
light_first="smp_faults teardown ledger compare sweep reproduce sweep_limits"
pick() { # names... : their lines of $work/binaries, in that order
    local name
    for name in "$@"; do
        awk -F'\t' -v n="tests/$name.rs" '$3 == n' "$work/binaries"
    done
}
pick $heavy >"$work/heavy"
{
    pick $light_first
    awk -F'\t' -v named=" $heavy $light_first " '{ n = $3; sub(/^tests\//, "", n); sub(/\.rs$/, "", n); if ($3 !~ /^tests\// || index(named, " " n " ") == 0) print }' \
        "$work/binaries"
} >"$work/light"

# Runs binary $1 (a line of $work/binaries); its output in $work/out.$2, its
# exit code in $work/rc.$2.
run_one() {
    local dir exe shown rc=0
    IFS=$'\t' read -r dir exe shown <<<"$1"
    printf '     Running %s (%s)\n' "$shown" "${exe#"$root"/}" >"$work/out.$2"
    (cd "$dir" && "$exe" "${@:3}") </dev/null >>"$work/out.$2" 2>&1 || rc=$?
    echo "$rc" >"$work/rc.$2"
}

# Prints and logs every finished binary's output, once; records failures.
failed=()
shown_done=()
collect() {
    local i
    for ((i = 0; i < n; i++)); do
        [ -e "$work/rc.$i" ] && [ -z "${shown_done[$i]:-}" ] || continue
        shown_done[i]=1
        tee -a "$log" <"$work/out.$i"
        if [ "$(cat "$work/rc.$i")" != 0 ]; then
            failed+=("$(sed -n 's/^     Running //p' "$work/out.$i" | head -1)")
        fi
    done
}

mapfile -t heavy_lines <"$work/heavy"
mapfile -t light_lines <"$work/light"
n=0 h=0 l=0
heavy_started=()
heavy_running() {
    local i c=0
    for i in "${heavy_started[@]}"; do [ -e "$work/rc.$i" ] || c=$((c + 1)); done
    echo "$c"
}
while [ "$h" -lt "${#heavy_lines[@]}" ] || [ "$l" -lt "${#light_lines[@]}" ]; do
    if [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; then
        wait -n || true
        collect
        continue
    fi
    if [ "$h" -lt "${#heavy_lines[@]}" ] && { [ "$(heavy_running)" = 0 ] || [ "$l" -ge "${#light_lines[@]}" ]; }; then
        line=${heavy_lines[h]} h=$((h + 1))
        heavy_started+=("$n")
    else
        line=${light_lines[l]} l=$((l + 1))
    fi
    run_one "$line" "$n" "$@" &
    n=$((n + 1))
done
wait
collect

# The doc tests (cargo test runs them after the binaries).
cargo test --workspace --locked --doc 2>&1 | tee -a "$log" || failed+=("doc tests")
if [ "${#failed[@]}" != 0 ]; then
    status=101
    echo "error: ${#failed[@]} target(s) failed:"
    printf '    %s\n' "${failed[@]}"
fi

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
echo "tests run in $(($(date +%s) - started)) s ($jobs binaries at a time)"
# A test that skips prints "SKIP <test>: <reason>" and then passes as far
# as cargo counts: the skipped (distinct tests that printed SKIP) are taken
# out of the passed, so the totals say how many tests really ran.
skipped=$(grep '^SKIP ' "$log" | sed 's/^SKIP \([^:]*\):.*/\1/' | sort -u | wc -l)
awk -v s="$skipped" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "%d passed, %d failed, %d skipped\n", p - s, f, s }' "$log"
exit "$status"
