#!/usr/bin/env bash
# The Linux-guest steps of CI, one script for both places CI runs:
# - GitHub's hardware-KVM runners (.github/workflows/ci.yml): `--vmm kvm`;
# - this project's tests (tests/nested_linux.rs, run by .ci/run), whose
#   machines have no hardware KVM: `--vmm nested`, ptiscope's VMM on a real
#   kvm_amd inside QEMU TCG, stands in for it, so the workflow's logic runs
#   on every landing (the test reads the JSON files this script keeps).
#
#   scripts/ci-linux.sh [--vmm kvm|nested] [--kernel K] [--out DIR] [--shadow-paging]
#
# The kernel K: a path to a bzImage (its `config` or `config-RELEASE` beside
# it is read when present), or a name `ptiscope linux fetch` knows. Without
# --kernel: ptiscope's fetched debian-amd64 if there is one, else the
# host's own /boot/vmlinuz-$(uname -r) with its config (copied with sudo
# where only root may read it, as on Ubuntu): a runner that cannot run
# apt-get download still has a Linux to measure.
#
# Steps, each a `ptiscope compare` of pti=off against pti=on, one run a side
# (the guarded counts are exact; more runs would only cost CI time; explicit on
# both sides: under TCG's `-cpu max` and on CPUs without Meltdown Linux
# leaves PTI off by itself, docs/ci-gate.md) with guards:
#  1. QEMU TCG: the plugin's MOV-to-CR3 count in an undisturbed getppid
#     (insn_mov_cr3_calls_per_call: the same in every run), 0 without PTI
#     and 2 with it (entry and exit switch); the kernel log's PTI state
#     is checked on both sides by ptiscope itself (exit 6 otherwise).
#  2. ptiscope's VMM on KVM: KVM's exits and the host clock; where KVM sees
#     every guest CR3 write (shadow paging: `--shadow-paging` reloads
#     kvm_intel/kvm_amd with ept=0/npt=0 first, or nested on QEMU 7.2),
#     KVM's CR3 count gets the same guards; elsewhere the step says it has
#     none and keeps the PTI-state check.
# Results land in DIR (default: ci-linux/) as JSON. Exit status: 0 all
# held; otherwise the first failing step's ptiscope status (1: a guard
# held; docs/running.md), or 64 for bad usage.
set -euo pipefail
# Relative --out and --kernel paths are the caller's: no cd.
root=$(cd "$(dirname "$0")/.." && pwd)

vmm=kvm kernel= out=ci-linux shadow=0
usage() { echo "usage: $0 [--vmm kvm|nested] [--kernel K] [--out DIR] [--shadow-paging]" >&2; exit 64; }
while [ $# -gt 0 ]; do
    case $1 in
        --vmm) [ $# -ge 2 ] || usage; vmm=$2; shift 2 ;;
        --kernel) [ $# -ge 2 ] && [ -n "$2" ] || usage; kernel=$2; shift 2 ;;
        --out) [ $# -ge 2 ] && [ -n "$2" ] || usage; out=$2; shift 2 ;;
        --shadow-paging) shadow=1; shift ;;
        *) usage ;;
    esac
done
case $vmm in kvm|nested) ;; *) echo "$0: --vmm must be kvm or nested, not '$vmm'" >&2; exit 64 ;; esac
mkdir -p "$out"

# The ptiscope to run: $PTISCOPE, else this checkout's debug build (the
# one the tests build anyway: no second, release, build in CI's time).
if [ -n "${PTISCOPE:-}" ]; then
    ptiscope=$PTISCOPE
else
    cargo build -q --locked -p ptiscope --manifest-path "$root/Cargo.toml"
    ptiscope=${CARGO_TARGET_DIR:-$root/target}/debug/ptiscope
fi

cache=${XDG_CACHE_HOME:-$HOME/.cache}/ptiscope/linux
if [ -z "$kernel" ]; then
    if [ -e "$cache/debian-amd64/vmlinuz" ]; then
        kernel=debian-amd64
    elif [ -e "/boot/vmlinuz-$(uname -r)" ]; then
        own="$out/host-kernel"
        mkdir -p "$own"
        release=$(uname -r)
        # Ubuntu keeps its kernel image root-only (0600).
        if [ -r "/boot/vmlinuz-$release" ]; then
            cp "/boot/vmlinuz-$release" "$own/vmlinuz-$release"
        else
            sudo cat "/boot/vmlinuz-$release" > "$own/vmlinuz-$release"
        fi
        if [ -r "/boot/config-$release" ]; then cp "/boot/config-$release" "$own/"; fi
        kernel="$own/vmlinuz-$release"
    else
        echo "ci-linux: no kernel to measure: none fetched (ptiscope linux fetch) and no /boot/vmlinuz-$(uname -r)" >&2
        echo "SKIP ci-linux: no Linux kernel on this machine"
        exit 0
    fi
fi
echo "ci-linux: kernel $kernel; VMM step on --backend $vmm"

common=(--linux "$kernel" --workload getppid --iterations 2000 --runs 1 --quiet
        --baseline pti=off --compare pti=on)

echo "== ci-linux 1/2: QEMU TCG, CR3 writes counted by ptiscope's plugin"
"$ptiscope" compare --backend qemu "${common[@]}" --json "$out/linux-tcg.json" \
    --fail-if 'insn_mov_cr3_calls_per_call.compare!=2' \
    --fail-if 'insn_mov_cr3_calls_per_call.baseline!=0'

echo "== ci-linux 2/2: ptiscope's VMM on KVM (--backend $vmm)"
if [ "$vmm" = kvm ] && [ "$shadow" = 1 ]; then
    # Shadow paging: KVM then sees (and counts, as tlb_flush) every guest
    # CR3 write; with EPT/NPT it sees none.
    if grep -q vmx /proc/cpuinfo; then mod=kvm_intel param=ept=0; else mod=kvm_amd param=npt=0; fi
    if sudo modprobe -r "$mod" && sudo modprobe "$mod" "$param"; then
        sudo udevadm trigger --name-match=kvm 2>/dev/null || true
    else
        sudo modprobe "$mod" || true
        echo "ci-linux: could not reload $mod with $param: KVM keeps EPT/NPT"
    fi
fi
"$ptiscope" compare --backend "$vmm" "${common[@]}" --append nopcid --json "$out/linux-vmm.json"
# The CR3 guards, where this KVM counts the guest's CR3 writes: the run's
# environment says (`kvm.sees_cr3_writes`: shadow paging; under nested,
# the inner kvm_amd's). `nopcid` above: with PCID a CR3 write that keeps
# the TLB is no flush, and KVM counts flushes.
python3 - "$out/linux-vmm.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
kvm = doc["environment"].get("kvm") or {}
if not kvm.get("sees_cr3_writes"):
    print(f"ci-linux: KVM uses {kvm.get('paging') or 'unknown'} paging: it sees no guest CR3 write, "
          "so no CR3 guard (each side's PTI state was checked against its kernel log)")
    sys.exit(0)
m = next((m for m in doc["metrics"] if m["name"] == "cr3_writes_per_call" and m["source"] == "kvm"), None)
if m is None:
    sys.exit("ci-linux: KVM sees CR3 writes here but the compare has no [kvm] cr3_writes_per_call")
off, on = m["baseline"]["amean"], m["compare"]["amean"]
print(f"ci-linux: [kvm] CR3 writes per getppid: pti=off {off:.4f}, pti=on {on:.4f} "
      f"({kvm.get('paging')} paging)")
if not (off <= 0.01 and 1.99 <= on <= 2.01):
    sys.exit("ci-linux: guard held: KVM's CR3 count is not 0 -> 2 per call")
PY
echo "ci-linux: all steps held"
