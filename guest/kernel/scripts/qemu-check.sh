#!/usr/bin/env bash
# Boots the guest under QEMU (TCG by default; ACCEL=kvm for this host's KVM
# through QEMU) across entries, PTI modes and workloads, and checks the
# guest's own counts: with PTI exactly 2 CR3 writes per iteration plus 2
# (the begin marker's exit and the end marker's entry), none without PTI or
# after the per-process opt-out; kread faults not-present (0x4) with PTI and
# protection (0x5) without. Exits nonzero on the first mismatch.
#
# ARCH=i386 checks the 32-bit PAE flavour under qemu-system-i386 instead
# (SYSENTER and int entries; entry=syscall refused; pti_global_text changes
# what the user copy maps, per the guest's `@pti user_copy_kernel_pages=`).
#
# usage: [ARCH=x86_64|i386] scripts/qemu-check.sh [ELF]   (default: the release build)
set -u
cd "$(dirname "$0")/.."
ARCH=${ARCH:-x86_64}
case $ARCH in
x86_64) QEMU=qemu-system-x86_64 TRIPLE=x86_64-unknown-none DEFAULT_ENTRIES="int3 int4 int80 syscall" ;;
i386) QEMU=qemu-system-i386 TRIPLE=i586-unknown-linux-gnu DEFAULT_ENTRIES="int80 sysenter int3 int4" ;;
*) echo "ARCH must be x86_64 or i386" >&2; exit 2 ;;
esac
ELF=${1:-target/$TRIPLE/release/ptiscope-guest}
ACCEL=${ACCEL:-tcg}
N=${N:-200}
extra=()
[ "$ACCEL" = kvm ] && extra=(-bios /usr/share/qemu/qboot.rom)
fail=0

boot() { # cmdline -> stdout of the guest; sets rc
    out=$(timeout 120 $QEMU -M microvm -accel "$ACCEL" "${extra[@]}" ${CPU:+-cpu "$CPU"} -m 128M \
        -nodefaults -no-user-config -display none -serial stdio \
        -device isa-debug-exit,iobase=0xf4,iosize=4 -kernel "$ELF" -append "$1" 2>/dev/null)
    rc=$?
}
field() { sed -n "s/.*[@ ]$1=\([^ ]*\).*/\1/p" <<<"$out" | head -1; }
check() { # what expected actual
    if [ "$2" = "$3" ]; then echo "ok   $1 = $3"; else echo "FAIL $1: expected $2, got $3"; fail=1; fi
}

boot ""
check "banner" "ptiscope guest $ARCH" "$(head -1 <<<"$out" | cut -d' ' -f1-3)"
check "workload=none exit" 1 "$rc"
boot "bogus=1"
check "unknown key exit (BAD_CMDLINE)" 9 "$rc"
for f in pf gp ud de; do
    boot "fault=$f"
    check "fault=$f exit (EXCEPTION)" 5 "$rc"
done
check "fault=de vector" 0 "$(field vector)"

if [ "$ARCH" = i386 ]; then
    boot "workload=getpid entry=syscall"
    check "entry=syscall exit (UNSUPPORTED)" 13 "$rc"
    boot "workload=getpid pcid=on entry=int80"
    check "pcid=on exit (UNSUPPORTED)" 13 "$rc"
    # What the user copy maps: the entry area only, or with the kernel text.
    boot "pti=on pti_global_text=off"
    entry_pages=$(field user_copy_kernel_pages)
    boot "pti=on pti_global_text=on"
    text_pages=$(field user_copy_kernel_pages)
    check "pti_global_text=on maps more kernel pages in the user copy" yes \
        "$([ -n "$entry_pages" ] && [ "${text_pages:-0}" -gt "$entry_pages" ] && echo yes || echo "no ($entry_pages vs $text_pages)")"
    boot "workload=getpid iterations=$N pti=on pti_global_text=on entry=sysenter"
    check "sysenter getpid pti_global_text=on cr3_writes" $((2 * N + 2)) "$(field cr3_writes)"
fi

entries=${ENTRIES:-$DEFAULT_ENTRIES}
for entry in $entries; do
    for w in getpid getppid write-badfd; do
        for pti in on off; do
            boot "workload=$w iterations=$N pti=$pti entry=$entry"
            t="$entry $w pti=$pti"
            check "$t exit" 1 "$rc"
            want=$([ $pti = on ] && echo $((2 * N + 2)) || echo 0)
            check "$t cr3_writes" "$want" "$(field cr3_writes)"
            check "$t syscalls" $((N + 1)) "$(field syscalls)"
            check "$t mismatches" 0 "$(field mismatches)"
        done
    done
    boot "workload=nopti-getpid iterations=$N pti=on entry=$entry"
    check "$entry nopti-getpid exit" 1 "$rc"
    check "$entry nopti-getpid cr3_writes" 0 "$(field cr3_writes)"
    check "$entry nopti-getpid nopti" 1 "$(field nopti)"
    boot "fault=kread pti=on entry=$entry"
    check "$entry kread pti=on error" 0x4 "$(field error)"
    boot "fault=kread pti=off entry=$entry"
    check "$entry kread pti=off error" 0x5 "$(field error)"
done
exit $fail
