//! The ACPI tables a Linux guest finds its CPUs in (`--cpus N`): RSDP,
//! XSDT, FADT, MADT and a DSDT, built with rust-vmm's `acpi_tables` (which
//! computes every length and checksum) and written to the BIOS area of the
//! legacy hole, [`ACPI_START`]..[`ACPI_END`], which the E820 map marks
//! reserved ([`e820_entry`]). Debian's kernels have no
//! `CONFIG_X86_MPPARSE`, so an MP table would not do; without a MADT Linux
//! boots one CPU whatever the VMM creates.
//!
//! What the tables say, as Firecracker's do for the same irqchip
//! (KVM_CREATE_IRQCHIP and KVM_CREATE_PIT2):
//! - the FADT is hardware-reduced (ACPI 6.5, no PM blocks, no SCI, no
//!   SMI command port: the VMM emulates none), so Linux leaves out the
//!   8259 PIC (`acpi_reduced_hw_init`: the legacy PIC is the null one) and
//!   the PIT clockevent, and runs on the LAPIC timer and kvm-clock (the
//!   LAPIC timer is calibrated against the TSC, whose rate kvm-clock
//!   gives). Its IA-PC boot flags say no VGA, no MSI, no CMOS RTC, no
//!   8042: the VMM has none of them, and Linux then does not probe their
//!   ports (each probe a VM exit to an unclaimed port);
//! - the MADT lists one enabled local APIC per vCPU, APIC id = vCPU index
//!   (KVM's LAPIC ids are the vCPU ids, and the VMM's CPUID says the same:
//!   [`crate::machine::cpu_config`]), and KVM's IOAPIC, id 0 (its ID
//!   register after reset) at 0xfec00000 with GSIs from 0. No interrupt
//!   source override: KVM's default GSI routing sends ISA IRQ n to IOAPIC
//!   pin n, edge-triggered active-high, which is what Linux assumes
//!   without one (Firecracker writes none either);
//! - the DSDT describes COM1 (PNP0501, ports 0x3f8-0x3ff, GSI 4): under a
//!   hardware-reduced FADT Linux pre-maps no ISA IRQs, so the 8250 driver
//!   gets its interrupt from this device's `_CRS` (PNP ACPI); without it
//!   ttyS0 has no IRQ.
//!
//! The RSDP is at [`RSDP_ADDR`], on a 16-byte boundary inside the
//! 0xe0000-0xfffff range Linux scans, and `boot_params.acpi_rsdp_addr`
//! points at it too (boot protocol 2.14+; older kernels scan). Nothing
//! here is hand-written bytes except the table layout (addresses, 64-byte
//! alignment); the MADT's flags stay 0 (no PCAT_COMPAT: there is no 8259
//! Linux would use under a hardware-reduced FADT), which the crate writes.
//!
//! The companion guest gets no tables: it starts its CPUs by INIT/SIPI
//! from its command line's `cpus=` and reads no firmware tables.

use acpi_tables::aml::{Device, EISAName, Interrupt, Name, ResourceTemplate, IO};
use acpi_tables::fadt::{FADTBuilder, Flags};
use acpi_tables::madt::{
    EnabledStatus, IoApic, LocalInterruptController, ProcessorLocalApic, MADT,
};
use acpi_tables::rsdp::Rsdp;
use acpi_tables::sdt::Sdt;
use acpi_tables::xsdt::XSDT;
use acpi_tables::Aml;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::machine::memory::{E820Entry, E820_RESERVED, HIGH_RAM_START, LOW_RAM_END};

/// Start of the tables' area: the BIOS area Linux scans for the RSDP.
pub const ACPI_START: u64 = 0xe_0000;
/// End of the tables' area (exclusive): where high RAM starts.
pub const ACPI_END: u64 = HIGH_RAM_START;
/// The RSDP: first in the area, so on the 16-byte boundary the scan wants.
pub const RSDP_ADDR: u64 = ACPI_START;
/// KVM's in-kernel IOAPIC (KVM_CREATE_IRQCHIP).
pub const IOAPIC_ADDR: u32 = 0xfec0_0000;
/// The local APICs' default base.
pub const LAPIC_ADDR: u32 = 0xfee0_0000;
/// Most CPUs the MADT can list: xAPIC entries carry an 8-bit APIC id, and
/// 0xff is the broadcast id (more would need x2APIC entries).
pub const MAX_CPUS: u32 = 255;
/// The UART's ISA interrupt line (GSI), as [`crate::machine::builder`] wires it.
pub const COM1_GSI: u32 = 4;
/// COM1's ports.
const COM1_PORT: u16 = 0x3f8;

/// FADT IA-PC boot architecture flags (ACPI 6.5, table 5.11).
const IAPC_VGA_NOT_PRESENT: u16 = 1 << 2;
const IAPC_MSI_NOT_PRESENT: u16 = 1 << 3;
const IAPC_CMOS_RTC_NOT_PRESENT: u16 = 1 << 5;

const OEM_ID: [u8; 6] = *b"PTISCP";
const OEM_REVISION: u32 = 1;
/// Each table starts on this boundary (ACPI asks 8; 64 keeps them apart).
const ALIGN: u64 = 64;

const _: () = assert!(LOW_RAM_END <= ACPI_START && ACPI_END <= HIGH_RAM_START);

/// Errors writing the tables.
#[derive(Debug, thiserror::Error)]
pub enum AcpiError {
    /// More CPUs than a MADT of xAPIC entries lists.
    #[error("--cpus {0}: the VMM's ACPI MADT lists at most {MAX_CPUS} CPUs (8-bit APIC ids)")]
    TooManyCpus(u32),
    /// The tables do not fit in the BIOS area.
    #[error("the ACPI tables need {0:#x} bytes from {ACPI_START:#x}, past {ACPI_END:#x}")]
    TooBig(u64),
    /// Guest memory refused a write.
    #[error("writing the ACPI tables to guest memory: {0}")]
    Write(#[source] vm_memory::GuestMemoryError),
}

/// Where the tables went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcpiTables {
    /// The RSDP (`boot_params.acpi_rsdp_addr`).
    pub rsdp: u64,
    /// The XSDT, which lists the FADT and the MADT.
    pub xsdt: u64,
    /// The FADT, which points at the DSDT.
    pub fadt: u64,
    /// The MADT.
    pub madt: u64,
    /// The DSDT.
    pub dsdt: u64,
    /// First byte past the last table.
    pub end: u64,
}

/// The E820 entry that keeps Linux off the tables: the whole BIOS area,
/// reserved, as PC firmware marks it.
pub fn e820_entry() -> E820Entry {
    E820Entry {
        addr: ACPI_START,
        size: ACPI_END - ACPI_START,
        kind: E820_RESERVED,
    }
}

fn bytes_of(aml: &dyn Aml) -> Vec<u8> {
    let mut v = Vec::new();
    aml.to_aml_bytes(&mut v);
    v
}

fn align(a: u64) -> u64 {
    a.next_multiple_of(ALIGN)
}

/// The DSDT: COM1 as a PNP0501 device with its ports and GSI.
fn dsdt() -> Vec<u8> {
    let io = IO::new(COM1_PORT, COM1_PORT, 1, 8);
    // Consumer, edge-triggered, active-high, exclusive: an ISA IRQ.
    let irq = Interrupt::new(true, true, false, false, COM1_GSI);
    let crs = ResourceTemplate::new(vec![&io, &irq]);
    let hid = EISAName::new("PNP0501");
    let uid: u8 = 0;
    let (hid, uid, crs) = (
        Name::new("_HID".into(), &hid),
        Name::new("_UID".into(), &uid),
        Name::new("_CRS".into(), &crs),
    );
    let com1 = Device::new("_SB_.COM1".into(), vec![&hid, &uid, &crs]);
    let mut sdt = Sdt::new(*b"DSDT", 36, 2, OEM_ID, *b"PTISCDST", OEM_REVISION);
    sdt.append_slice(&bytes_of(&com1));
    sdt.as_slice().to_vec()
}

fn fadt(dsdt: u64) -> Vec<u8> {
    let mut b = FADTBuilder::new(OEM_ID, *b"PTISCFAC", OEM_REVISION)
        .flag(Flags::HwReducedAcpi)
        // No fixed power or sleep button: there is none.
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton)
        .dsdt_64(dsdt);
    // Bit 1 (8042) stays clear: the VMM has no keyboard controller.
    b.iapc_boot_arch =
        (IAPC_VGA_NOT_PRESENT | IAPC_MSI_NOT_PRESENT | IAPC_CMOS_RTC_NOT_PRESENT).into();
    bytes_of(&b.finalize())
}

fn madt(cpus: u32) -> Vec<u8> {
    let mut m = MADT::new(
        OEM_ID,
        *b"PTISCAPC",
        OEM_REVISION,
        LocalInterruptController::Address(LAPIC_ADDR),
    );
    for id in 0..cpus as u8 {
        m.add_structure(ProcessorLocalApic::new(id, id, EnabledStatus::Enabled));
    }
    m.add_structure(IoApic::new(0, IOAPIC_ADDR, 0));
    bytes_of(&m)
}

/// Builds the tables for `cpus` vCPUs and writes them at [`ACPI_START`].
pub fn write_tables(mem: &GuestMemoryMmap, cpus: u32) -> Result<AcpiTables, AcpiError> {
    if cpus == 0 || cpus > MAX_CPUS {
        return Err(AcpiError::TooManyCpus(cpus));
    }
    let rsdp_len = Rsdp::len() as u64;
    let dsdt_addr = align(RSDP_ADDR + rsdp_len);
    let dsdt = dsdt();
    let fadt_addr = align(dsdt_addr + dsdt.len() as u64);
    let fadt = fadt(dsdt_addr);
    let madt_addr = align(fadt_addr + fadt.len() as u64);
    let madt = madt(cpus);
    let xsdt_addr = align(madt_addr + madt.len() as u64);
    let mut x = XSDT::new(OEM_ID, *b"PTISCXSD", OEM_REVISION);
    x.add_entry(fadt_addr);
    x.add_entry(madt_addr);
    let xsdt = bytes_of(&x);
    let end = xsdt_addr + xsdt.len() as u64;
    if end > ACPI_END {
        return Err(AcpiError::TooBig(end - ACPI_START));
    }
    let rsdp = bytes_of(&Rsdp::new(OEM_ID, xsdt_addr));
    for (addr, bytes) in [
        (RSDP_ADDR, &rsdp),
        (dsdt_addr, &dsdt),
        (fadt_addr, &fadt),
        (madt_addr, &madt),
        (xsdt_addr, &xsdt),
    ] {
        mem.write_slice(bytes, GuestAddress(addr))
            .map_err(AcpiError::Write)?;
    }
    Ok(AcpiTables {
        rsdp: RSDP_ADDR,
        xsdt: xsdt_addr,
        fadt: fadt_addr,
        madt: madt_addr,
        dsdt: dsdt_addr,
        end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::memory::MemoryLayout;

    fn read(mem: &GuestMemoryMmap, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }

    fn u32_at(b: &[u8], off: usize) -> u32 {
        u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
    }

    fn u64_at(b: &[u8], off: usize) -> u64 {
        u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
    }

    fn sums_to_zero(b: &[u8]) -> bool {
        b.iter().fold(0u8, |a, x| a.wrapping_add(*x)) == 0
    }

    /// A table at `addr` as Linux reads it: its signature, its length from
    /// the header, the bytes summing to 0 mod 256.
    fn table(mem: &GuestMemoryMmap, addr: u64, sig: &[u8; 4]) -> Vec<u8> {
        let head = read(mem, addr, 36);
        assert_eq!(&head[..4], sig, "signature at {addr:#x}");
        let t = read(mem, addr, u32_at(&head, 4) as usize);
        assert!(
            sums_to_zero(&t),
            "{} checksum",
            String::from_utf8_lossy(sig)
        );
        assert!(addr.is_multiple_of(8) && addr >= ACPI_START && addr + t.len() as u64 <= ACPI_END);
        t
    }

    /// Follows RSDP -> XSDT -> FADT -> DSDT and XSDT -> MADT from guest
    /// memory, the way Linux does, for 1, 2 and the most CPUs.
    #[test]
    fn tables_link_and_list_one_lapic_per_cpu() {
        for cpus in [1, 2, crate::spec::MAX_CPUS, MAX_CPUS] {
            let layout = MemoryLayout::new(32).unwrap();
            let mem = layout.create_guest_memory().unwrap();
            let t = write_tables(&mem, cpus).unwrap();
            assert_eq!(t.rsdp, RSDP_ADDR);
            assert!(t.end <= ACPI_END);

            // RSDP: in the scan area on 16 bytes; the ACPI 1.0 checksum
            // over 20 bytes and the extended one over 36.
            assert!(RSDP_ADDR.is_multiple_of(16) && (0xe_0000..0x10_0000).contains(&RSDP_ADDR));
            let rsdp = read(&mem, RSDP_ADDR, 36);
            assert_eq!(&rsdp[..8], b"RSD PTR ");
            assert_eq!(rsdp[15], 2, "revision 2: the XSDT address is valid");
            assert!(sums_to_zero(&rsdp[..20]) && sums_to_zero(&rsdp));
            assert_eq!(u32_at(&rsdp, 20), 36);
            let xsdt_addr = u64_at(&rsdp, 24);
            assert_eq!(xsdt_addr, t.xsdt);

            let xsdt = table(&mem, xsdt_addr, b"XSDT");
            let entries: Vec<u64> = xsdt[36..].chunks(8).map(|c| u64_at(c, 0)).collect();
            assert_eq!(entries, vec![t.fadt, t.madt]);

            let fadt = table(&mem, entries[0], b"FACP");
            assert_eq!(fadt.len(), 276, "ACPI 6.5 FADT");
            let flags = u32_at(&fadt, 112);
            assert_ne!(flags & (1 << 20), 0, "HW_REDUCED_ACPI");
            let iapc = u16::from_le_bytes([fadt[109], fadt[110]]);
            assert_eq!(iapc & 0b10, 0, "no 8042");
            assert_ne!(iapc & (1 << 5), 0, "no CMOS RTC");
            assert_eq!(u32_at(&fadt, 40), 0, "DSDT by its 64-bit address only");
            let dsdt = table(&mem, u64_at(&fadt, 140), b"DSDT");
            assert_eq!(u64_at(&fadt, 140), t.dsdt);
            // COM1's name, its EISA id PNP0501 (0x0105d041) and GSI 4.
            let body = &dsdt[36..];
            assert!(body.windows(4).any(|w| w == b"COM1"));
            assert!(body.windows(4).any(|w| w == 0x0105_d041u32.to_le_bytes()));
            assert!(body
                .windows(9)
                .any(|w| w[0] == 0x89 && u32_at(w, 5) == COM1_GSI));

            let madt = table(&mem, entries[1], b"APIC");
            assert_eq!(u32_at(&madt, 36), LAPIC_ADDR);
            let mut lapics = Vec::new();
            let mut ioapics = Vec::new();
            let mut off = 44;
            while off < madt.len() {
                let (kind, len) = (madt[off], madt[off + 1] as usize);
                match kind {
                    0 => {
                        assert_eq!(len, 8);
                        assert_eq!(u32_at(&madt, off + 4), 1, "enabled");
                        lapics.push((madt[off + 2], madt[off + 3]));
                    }
                    1 => {
                        assert_eq!(len, 12);
                        ioapics.push((
                            madt[off + 2],
                            u32_at(&madt, off + 4),
                            u32_at(&madt, off + 8),
                        ));
                    }
                    k => panic!("unexpected MADT entry type {k}"),
                }
                off += len;
            }
            assert_eq!(off, madt.len());
            let want: Vec<(u8, u8)> = (0..cpus).map(|i| (i as u8, i as u8)).collect();
            assert_eq!(lapics, want, "one LAPIC per vCPU, APIC id = vCPU index");
            assert_eq!(ioapics, vec![(0, IOAPIC_ADDR, 0)]);
        }
    }

    #[test]
    fn more_cpus_than_xapic_ids_are_refused() {
        let layout = MemoryLayout::new(16).unwrap();
        let mem = layout.create_guest_memory().unwrap();
        let e = write_tables(&mem, MAX_CPUS + 1).unwrap_err().to_string();
        assert!(e.contains("--cpus 256") && e.contains("at most 255"), "{e}");
        assert!(write_tables(&mem, 0).is_err());
    }

    /// The reserved E820 range covers every table and lies in the legacy
    /// hole, outside the RAM the kernel and initrd go to.
    #[test]
    fn the_e820_entry_covers_the_tables_outside_ram() {
        let layout = MemoryLayout::new(16).unwrap();
        let mem = layout.create_guest_memory().unwrap();
        let t = write_tables(&mem, 8).unwrap();
        let e = e820_entry();
        assert_eq!(e.kind, E820_RESERVED);
        assert!(e.addr <= t.rsdp && t.end <= e.end());
        for ram in layout.e820().iter().filter(|r| r.kind == 1) {
            assert!(e.end() <= ram.addr || ram.end() <= e.addr, "{ram:?}");
        }
        assert!(!layout.kernel_range_ok(e.addr, e.size));
    }
}
