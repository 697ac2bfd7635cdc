//! The 32-bit (i386 PAE) flavour under our VMM: ELF32 images load, and on
//! a host whose KVM refuses 32-bit paging (this workplace's kvm_pvm) the
//! VMM says so plainly before the guest runs, with a nonzero exit and no hang.

mod common;

use common::*;

#[test]
fn an_elf32_pvh_image_boots_or_is_refused_with_the_host_limitation_named() {
    if !kvm_or_skip("ELF32 boot or refusal") {
        return;
    }
    // xor eax, eax; out 0xf4, eax; cli; hlt
    let code = [0x31, 0xc0, 0xe7, 0xf4, 0xfa, 0xf4];
    let elf = scratch("pae").join("tiny32.elf");
    write_pvh_elf32(&elf, 0x10_0000, &code);
    let o = ptiscope()
        .args(["run", "--timeout", "5", "--kernel"])
        .arg(&elf)
        .output()
        .unwrap();
    let err = stderr(&o);
    if host_pae_paging_works() {
        assert_eq!(o.status.code(), Some(0), "{err}");
    } else {
        assert_eq!(o.status.code(), Some(69), "{err}");
        assert!(err.contains("refuses 32-bit paging"), "{err}");
        assert!(err.contains("--backend qemu"), "{err}");
    }
}
