#!/usr/bin/env bash
# Runs every fuzz target (fuzz/, cargo-fuzz + libFuzzer) for a bounded time,
# starting from its committed seed corpus. Not part of scripts/test.sh: it
# needs a nightly toolchain (AddressSanitizer, -Zsanitizer) and cargo-fuzz.
#
#   scripts/fuzz.sh                 every target, FUZZ_SECONDS (default 30) each
#   FUZZ_SECONDS=300 scripts/fuzz.sh loader pagetables
#
# Exits non-zero if a target crashes, leaks past its limits or times out;
# the input that did it is in fuzz/artifacts/<target>/ (turn it into a
# regression test in the normal suite, see docs/fuzzing.md).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-30}
targets=(loader guest_cmdline telemetry pagetables fail_if exit_dispatch qemu_plugin)
if [ $# -gt 0 ]; then
    targets=("$@")
fi

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "fuzz.sh: needs a nightly toolchain: rustup toolchain install nightly" >&2
    exit 2
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: needs cargo-fuzz: cargo install cargo-fuzz" >&2
    exit 2
fi

# The guest kernels are built by the project's pinned toolchain (vmm/build.rs,
# bare-metal targets); the fuzz build embeds those images instead of building
# them again under nightly with the sanitizer's flags.
cargo build --release --locked -p ptiscope
export PTISCOPE_GUEST_X86_64_ELF="$PWD/target/guest/x86_64-unknown-none/release/ptiscope-guest"
export PTISCOPE_GUEST_I386_ELF="$PWD/target/guest/i586-unknown-linux-gnu/release/ptiscope-guest"

# libFuzzer adds what it finds to the corpus directory it is given: work on
# a copy, so the committed seeds stay small.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

failed=()
for t in "${targets[@]}"; do
    mkdir -p "$work/$t"
    cp fuzz/corpus/"$t"/* "$work/$t"/
    echo "== fuzz target $t: ${seconds}s"
    if cargo +nightly fuzz run "$t" "$work/$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        2>"$work/$t.log"; then
        grep -E "^stat::number_of_executed_units|^stat::new_units_added" "$work/$t.log" | tr '\n' ' '
        echo
    else
        tail -40 "$work/$t.log"
        failed+=("$t")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz.sh: crashed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz.sh: ${#targets[@]} targets ran ${seconds}s each without a crash"
