#!/usr/bin/env bash
# A CI gate on a kernel patch's system-call path (docs/ci-gate.md): boots
# BEFORE and AFTER (bzImages, or debian-amd64 / debian-686-pae) under QEMU
# TCG with ptiscope's init, counts the kernel instructions of one getppid
# with ptiscope's TCG plugin (exact: the same in every run), and fails when
# AFTER's path is more than MAX_GROWTH instructions longer. The log shows
# where the instructions went: per call by kernel symbol (--by-symbol, from
# the running kernel's /proc/kallsyms); GATE_BY_SYMBOL=0 leaves it out
# (about 3 s less per run).
#
#   scripts/kernel-gate.sh BEFORE AFTER [MAX_GROWTH] [-- more compare options]
#
# Exit status: 0 the gate holds; 1 the path grew by more than MAX_GROWTH;
# anything else is ptiscope's own (docs/running.md), e.g. 69 without QEMU.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: $0 BEFORE AFTER [MAX_GROWTH] [-- more compare options]" >&2
    exit 64
fi
before=$1 after=$2
shift 2
max=0
if [ $# -gt 0 ] && [ "$1" != "--" ]; then max=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" = "--" ]; then shift; fi
case $max in
    ''|*[!0-9]*) echo "$0: MAX_GROWTH must be a whole number of instructions, not '$max'" >&2; exit 64 ;;
esac
ptiscope=${PTISCOPE:-ptiscope}
out=${GATE_JSON:-kernel-gate.json}
by_symbol=--by-symbol
if [ "${GATE_BY_SYMBOL:-1}" = 0 ]; then by_symbol=; fi
exec "$ptiscope" compare --backend qemu --workload getppid --iterations 2000 --runs 2 \
    --baseline "linux=$before" --compare "linux=$after" $by_symbol \
    --fail-if "kernel_instructions_per_call.delta>$max" \
    --json "$out" "$@"
