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
# Both sides boot on QEMU's CPU model GATE_CPU (default Skylake-Client-v1):
# one with Meltdown and MDS, on which Linux turns on PTI and its other
# mitigations by itself, as on the Intel servers a production kernel runs
# on. Under QEMU's own default (`-cpu max`) Linux finds itself not affected
# and the gate would measure a path without them (docs/ci-gate.md, "Which
# path is measured"). GATE_CPU=max measures that one; a side that names its
# own `cpu=` keeps it.
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
cpu=${GATE_CPU:-Skylake-Client-v1}
case $cpu in
    ''|*[!A-Za-z0-9._-]*) echo "$0: GATE_CPU must be a QEMU CPU model name (qemu-system-x86_64 -cpu help), not '$cpu'" >&2; exit 64 ;;
esac
# A side's own cpu= wins.
side() {
    case ",$1," in
        *,cpu=*) echo "linux=$1" ;;
        *) echo "linux=$1,cpu=$cpu" ;;
    esac
}
if [ "$cpu" = max ]; then
    echo "kernel-gate: CPU model max (GATE_CPU): Linux finds itself not affected by Meltdown there, so" \
        "this measures the path without PTI and the other mitigations a production Intel kernel runs"
else
    echo "kernel-gate: CPU model $cpu (GATE_CPU): the path a production kernel runs, with the" \
        "mitigations Linux turns on there by itself (PTI on a Meltdown-affected model); each side's" \
        "are in the report's 'guest mitigations' lines; GATE_CPU=max for the path without them"
fi
exec "$ptiscope" compare --backend qemu --workload getppid --iterations 2000 --runs 2 \
    --baseline "$(side "$before")" --compare "$(side "$after")" $by_symbol \
    --fail-if "kernel_instructions_per_call.delta>$max" \
    --json "$out" "$@"
