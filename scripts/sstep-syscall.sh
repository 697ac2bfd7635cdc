#!/usr/bin/env bash
# Counts the kernel instructions of one getppid system call of a Linux guest
# by single-stepping it through QEMU's gdbstub: an observer that is not
# ptiscope's TCG plugin, to check the plugin's kernel_instructions_per_call
# against (docs/telemetry-abi.md, "How the per-call count was checked").
#
#   scripts/sstep-syscall.sh KERNEL ENTRY PTI [CALLS]
#     KERNEL  debian-amd64 | debian-686-pae (as `--linux` takes it)
#     ENTRY   syscall (amd64) | sysenter | int80 (686-pae)
#     PTI     on | off
#     CALLS   consecutive getppid calls to step (default 3)
#
# Prints one line per call, `sstep kernel_instructions=N entry=... pti=...`,
# then `sstep majority kernel_instructions=N calls=M/CALLS` when more than
# half the calls gave the same count, and, for every call that went
# another way, `sstep-diverged ...` with the step at which its path left
# a call with the most common count and the addresses around it. Exits 0 when every call
# gave the same count; 1 when they differ, 2 on bad usage, 3 when the
# guest could not be caught in its loop.
#
# How: `ptiscope run --backend qemu --no-plugin --linux KERNEL --workload
# getppid` with a loop too long to end, QEMU's gdbstub on a local port
# (`--qemu-arg -gdb`). gdb attaches (which stops the guest) as soon as the
# port is open, and again every half second while the boot goes on: it
# goes on only from a stop in user mode that reaches a getppid within 200
# steps, and, stepped over that call uncounted, another within 200 more
# (the loop's: the init's one warm-up call before the loop is thousands of
# steps from the loop's first), else it detaches and lets the guest run. Then it
# single-steps: first to the init's next system-call instruction with
# getppid's number in (e)ax, then through the call, one instruction per
# step, until the vCPU is back at a user address. Every step at a kernel
# address is a kernel instruction of the call, the SYSRET/SYSEXIT/IRET
# included, as the plugin counts them. QEMU's single-step masks interrupts
# and timers (`Qqemu.sstep=0x7`, set explicitly): nothing but the call
# runs. A REP string instruction executes one iteration per step at the
# same address; steps that stay on it count once, as the plugin counts it.
#
# Needs gdb (with Python) and a built ptiscope (`cargo build --release`);
# the kernel must be fetched (`ptiscope linux fetch`).
set -euo pipefail

usage() {
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
[ $# -ge 3 ] && [ $# -le 4 ] || usage
kernel=$1 entry=$2 pti=$3 calls=${4:-3}
case "$kernel" in
debian-amd64) arch=amd64 nr=110 ;;
debian-686-pae) arch=i386 nr=64 ;;
*) echo "sstep-syscall: unknown kernel $kernel (debian-amd64 or debian-686-pae)" >&2; exit 2 ;;
esac
case "$arch/$entry" in
amd64/syscall | i386/sysenter | i386/int80) ;;
*) echo "sstep-syscall: entry $entry does not go with $kernel (amd64: syscall; 686-pae: sysenter, int80)" >&2; exit 2 ;;
esac
case "$pti" in on | off) ;; *) usage ;; esac
case "$calls" in '' | *[!0-9]*) usage ;; esac
command -v gdb >/dev/null || { echo "sstep-syscall: gdb is not installed" >&2; exit 2; }

root=$(cd "$(dirname "$0")/.." && pwd)
ptiscope=${PTISCOPE:-$root/target/release/ptiscope}
[ -x "$ptiscope" ] || { echo "sstep-syscall: $ptiscope not built (cargo build --release)" >&2; exit 2; }

work=$(mktemp -d)
run_pid=
cleanup() {
    if [ -n "$run_pid" ]; then kill -TERM "$run_pid" 2>/dev/null || true; wait "$run_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

# A free local port: bind port 0 and read what the kernel gave.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$ptiscope" run --backend qemu --no-plugin --linux "$kernel" --pti "$pti" --entry "$entry" \
    --workload getppid --iterations 4000000000 --timeout 600 \
    --qemu-arg=-gdb --qemu-arg="tcp:127.0.0.1:$port" >"$work/out" 2>&1 &
run_pid=$!
cat >"$work/sstep.py" <<'EOF'
import gdb, os, sys, time

ARCH = os.environ["SSTEP_ARCH"]
NR = int(os.environ["SSTEP_NR"])
CALLS = int(os.environ["SSTEP_CALLS"])
PORT = int(os.environ["SSTEP_PORT"])
KERNEL_FROM = 0xffff800000000000 if ARCH == "amd64" else 0xc0000000
# The system-call instructions the init may use.
ENTRIES = {b"\x0f\x05": "syscall", b"\x0f\x34": "sysenter", b"\xcd\x80": "int80"}
REP_STRING = set(range(0xa4, 0xa8)) | set(range(0xaa, 0xb0)) | set(range(0x6c, 0x70))
LEGACY = {0xf0, 0xf2, 0xf3, 0x2e, 0x36, 0x3e, 0x26, 0x64, 0x65, 0x66, 0x67}

inf = gdb.selected_inferior()

def pc():
    return int(gdb.parse_and_eval("$pc")) & ((1 << 64) - 1)

def ax():
    return int(gdb.parse_and_eval("$rax" if ARCH == "amd64" else "$eax")) & 0xffffffff

def code(at, n=15):
    try:
        return bytes(inf.read_memory(at, n))
    except gdb.MemoryError:
        return b""

def is_rep_string(b):
    rep, i = False, 0
    while i < len(b) and (b[i] in LEGACY or (ARCH == "amd64" and 0x40 <= b[i] <= 0x4f)):
        rep |= b[i] in (0xf2, 0xf3)
        i += 1
    return rep and i < len(b) and b[i] in REP_STRING

def step():
    gdb.execute("stepi", to_string=True)

def attach(deadline):
    while True:
        try:
            gdb.execute("target remote 127.0.0.1:%d" % PORT, to_string=True)
            break
        except gdb.error:
            if time.time() > deadline:
                print("sstep: cannot attach to QEMU's gdbstub on port %d" % PORT)
                sys.exit(3)
            time.sleep(0.5)
    # QEMU's default, set explicitly: single steps with interrupts and
    # timers masked.
    gdb.execute("maintenance packet Qqemu.sstep=0x7", to_string=True)
    reply = gdb.execute("maintenance packet qqemu.sstep", to_string=True)
    if "0x7" not in reply:
        print("sstep: QEMU did not confirm sstep flags 0x7: " + reply.strip())
        sys.exit(3)

def to_getppid(limit):
    """Steps to the next user-mode system-call instruction with getppid's
    number in (e)ax; False if there is none within `limit` steps."""
    for _ in range(limit):
        p = pc()
        if p < KERNEL_FROM:
            b = code(p, 2)
            if b in ENTRIES and ax() == NR:
                return True
        if code(p, 1) == b"\xf4":
            return False
        step()
    return False

def over_call():
    """Steps through the system call at pc, uncounted, back to user mode;
    False if it does not return within 100000 steps."""
    step()
    for _ in range(100000):
        if pc() < KERNEL_FROM:
            return True
        step()
    return False

deadline = time.time() + 300
attach(deadline)
# Caught in kernel mode (the boot, a kernel thread, the call itself) or
# not in the loop: let the guest run a little and look again. In the loop
# means two getppid calls each within 200 steps of the last: one alone may
# be the init's warm-up call before the loop, after which the loop's first
# is thousands of steps away (its clock read and phase marker).
while not (pc() < KERNEL_FROM and to_getppid(200) and over_call() and to_getppid(200)):
    if time.time() > deadline:
        print("sstep: the guest's getppid loop was not caught within 300 s")
        sys.exit(3)
    gdb.execute("detach", to_string=True)
    time.sleep(0.5)
    attach(deadline)

counts, traces = [], []
while len(counts) < CALLS:
    if not to_getppid(3000):
        print("sstep: no next getppid within 3000 steps")
        sys.exit(3)
    entry = ENTRIES[code(pc(), 2)]
    step()
    n, last, trace, again = 0, None, [], []
    while pc() >= KERNEL_FROM:
        p = pc()
        rep = p == last and is_rep_string(code(p))
        if not rep:
            n += 1
        if p == last and not rep:
            # A step that stopped where the last one did without a REP
            # there: say so (it is counted, as an instruction executed).
            again.append(p)
        trace.append(p)
        last = p
        step()
        if n > 100000:
            print("sstep: the call did not return within 100000 instructions")
            sys.exit(3)
    counts.append(n)
    traces.append(trace)
    print("sstep kernel_instructions=%d entry=%s returned_to=%#x%s" % (n, entry, pc(),
          "".join(" stopped_twice_at=%#x" % a for a in again)))
best = max(set(counts), key=counts.count)
if counts.count(best) * 2 > len(counts):
    print("sstep majority kernel_instructions=%d calls=%d/%d" % (best, counts.count(best), len(counts)))
if len(set(counts)) == 1:
    sys.exit(0)
# Say where each call that went another way left the path of a call with
# the most common count: the step at which they part, addresses around it.
ref = counts.index(best)
for i, t in enumerate(traces):
    if counts[i] == best:
        continue
    a = traces[ref]
    k = next((j for j in range(min(len(a), len(t))) if a[j] != t[j]), min(len(a), len(t)))
    show = lambda t: " ".join("%#x" % x for x in t[max(0, k - 3):k + 4])
    print("sstep-diverged call %d (%d) left call %d (%d) at step %d: call %d %s | call %d %s"
          % (i + 1, counts[i], ref + 1, best, k, ref + 1, show(a), i + 1, show(t)))
sys.exit(1)
EOF

set +e
SSTEP_ARCH=$arch SSTEP_NR=$nr SSTEP_CALLS=$calls SSTEP_PORT=$port gdb -nx -batch -q \
    -ex "set pagination off" -ex "set confirm off" \
    -x "$work/sstep.py" >"$work/gdb" 2>&1
rc=$?
set -e
{ grep '^sstep' "$work/gdb" || true; } | sed "s/\$/ kernel=$kernel pti=$pti/"
if [ $rc -ne 0 ] && ! grep -q '^sstep kernel_instructions' "$work/gdb"; then
    cat "$work/gdb" >&2
fi
exit $rc
