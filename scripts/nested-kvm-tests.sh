#!/usr/bin/env bash
# Runs the KVM integration tests on a normal KVM: inside `--backend nested`
# (Debian's kernel with kvm_amd npt=1 under QEMU TCG), all in one boot.
# Developer-facing, not part of scripts/test.sh (a boot with the default set
# takes minutes of TCG time). See docs/kvm-hosts.md.
#
#   scripts/nested-kvm-tests.sh [--debug] [TEST-BINARY...] [-- TEST-HARNESS-ARGS...]
#
# TEST-BINARY: names of tests/*.rs (default: every one that needs KVM and
# nothing the inner machine lacks). After `--`: the test harness's own
# arguments, for every binary (a filter, --test-threads=1, --nocapture).
# Builds with `cargo test --release --no-run` (--debug: the dev profile, as
# scripts/test.sh builds), finds the binaries in cargo's JSON messages, and
# runs them with `ptiscope nested-exec`: each test binary at its own path, and
# the ptiscope binary at the path it was compiled to run
# (env!("CARGO_BIN_EXE_ptiscope")). Exit 0 when every binary passed.
set -euo pipefail
cd "$(dirname "$0")/.."

# Not here: fetch and import_layers need no KVM; linux and linux_ab need the
# Linux kernels' cache (the inner HOME is empty); qemu and qemu_plugin need
# QEMU, and nested needs a nested session of its own.
default=(boot compare console_line errors experiment globaltext hostile_guest
    hostile_inputs interrupted library messaging pae pti pti_switch reports
    sandbox smp smp_faults smp_i386 stuck_io sweep sweep_limits teardown
    telemetry workingset)

profile=(--release)
names=()
harness=()
while [ $# -gt 0 ]; do
    case "$1" in
        --debug) profile=() ;;
        --) shift; harness=("$@"); break ;;
        -*) echo "nested-kvm-tests.sh: unknown option $1 (see the comment at the top)" >&2; exit 64 ;;
        *) names+=("$1") ;;
    esac
    shift
done
[ ${#names[@]} -gt 0 ] || names=("${default[@]}")
for n in "${names[@]}"; do
    [ -f "tests/$n.rs" ] || { echo "nested-kvm-tests.sh: no test binary $n (tests/$n.rs)" >&2; exit 64; }
done

started=$(date +%s)
msgs=$(mktemp)
trap 'rm -f "$msgs"' EXIT
cargo test "${profile[@]}" -p ptiscope --locked --no-run --message-format=json \
    "${names[@]/#/--test=}" >"$msgs"
ptiscope=$(jq -r 'select(.reason == "compiler-artifact" and .target.kind == ["bin"]
    and .target.name == "ptiscope") | .executable' "$msgs" | tail -n 1)
bins=()
for n in "${names[@]}"; do
    b=$(jq -r --arg n "$n" 'select(.reason == "compiler-artifact" and .target.kind == ["test"]
        and .target.name == $n) | .executable' "$msgs" | tail -n 1)
    [ -n "$b" ] && [ "$b" != null ] || { echo "nested-kvm-tests.sh: cargo built no binary for $n" >&2; exit 70; }
    bins+=("$b")
done
[ -x "$ptiscope" ] || { echo "nested-kvm-tests.sh: cargo named no ptiscope binary" >&2; exit 70; }
built=$(date +%s)
echo "nested-kvm-tests.sh: built in $((built - started)) s; running ${#bins[@]} test binaries in one nested boot" >&2

args=()
for a in "${harness[@]}"; do args+=("--arg=$a"); done
log=$(mktemp)
trap 'rm -f "$msgs" "$log"' EXIT
status=0
"$ptiscope" nested-exec --place "$ptiscope" --cwd "$PWD/vmm" --env RUST_BACKTRACE=1 \
    "${args[@]}" "${bins[@]}" | tee "$log" || status=$?
# Totals as scripts/test.sh counts them: a test that printed "SKIP <test>:"
# is counted as skipped, not passed.
skipped=$(grep '^SKIP ' "$log" | sed 's/^SKIP \([^:]*\):.*/\1/' | sort -u | wc -l)
awk -v s="$skipped" '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "nested-kvm-tests.sh: %d passed, %d failed, %d skipped (inside the nested KVM)\n", p - s, f, s }' "$log" >&2
echo "nested-kvm-tests.sh: the nested session took $(( $(date +%s) - built )) s (build $((built - started)) s)" >&2
exit "$status"
