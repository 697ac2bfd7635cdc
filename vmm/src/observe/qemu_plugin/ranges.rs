//! What ptiscope tells the plugin: the guest's kernel address ranges
//! (`kernel=`) and where its markers are (`marks=`, `umark=`).

use super::report::Range;

/// The port of the Linux init's phase markers, as the plugin's `umark=`:
/// the `mov edx, PORT` that names its marker store (or `out`).
pub const LINUX_MARK_PORT: u16 = ptiscope_abi::port::PHASE;

/// The kernel address ranges to pass as `kernel=`, and the marker ranges
/// (`marks=`), for a guest: `elf32` for a 32-bit image. The kernel half is
/// the architecture's split (x86_64: the upper canonical half; i386: the
/// top gigabyte, 3G/1G, as Linux's default and the ptiscope guest's PAE
/// layout). `companion` (a guest that takes ptiscope's command line): it
/// also runs its boot code and AP trampoline below its user text (4 MiB),
/// and the firmware (SeaBIOS, qboot) runs below 1 MiB, all counted as
/// kernel instructions; markers are looked for from 1 MiB (the kernel's
/// load address) up, never in the firmware, whose PCI configuration
/// accesses are `out dx, eax` too: not below 1 MiB, and (i386) not in the
/// top 16 MiB of the 4 GiB space, where the PC maps the BIOS flash and
/// SeaBIOS runs its first code.
pub fn kernel_ranges(elf32: bool, companion: bool) -> (Vec<Range>, Vec<Range>) {
    let high = if elf32 {
        (0xc000_0000, 0xffff_ffff)
    } else {
        (0xffff_8000_0000_0000, u64::MAX)
    };
    let high_marks = if elf32 {
        (0xc000_0000, 0xfeff_ffff)
    } else {
        high
    };
    let below_user = guest_core::layout::USER_TEXT_BASE - 1;
    if companion {
        (
            vec![(0, below_user), high],
            vec![
                (guest_core::layout::KERNEL_PHYS_BASE, below_user),
                high_marks,
            ],
        )
    } else {
        (vec![high], vec![high_marks])
    }
}

/// `LO-HI[:LO-HI...]` in hex, as the plugin's arguments take them.
pub fn ranges_arg(ranges: &[Range]) -> String {
    ranges
        .iter()
        .map(|(lo, hi)| format!("{lo:#x}-{hi:#x}"))
        .collect::<Vec<_>>()
        .join(":")
}
