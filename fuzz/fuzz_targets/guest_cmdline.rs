//! The guest kernel's command-line parser (guest-core, `no_std`): the VMM
//! and the user write the line, the guest must survive anything. Its
//! number parser, written for few emulated instructions at boot, must also
//! say what `u64::from_str_radix` says after the `0x` prefix.
#![no_main]

use libfuzzer_sys::fuzz_target;

/// What `guest_core::cmdline::parse_number` replaced.
fn reference_number(s: &str) -> Option<u64> {
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None => (s, 10),
    };
    if digits.is_empty() {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    let _ = guest_core::cmdline::parse(&line);
    for word in line.split_ascii_whitespace() {
        if let Some((_, value)) = word.split_once('=') {
            assert_eq!(
                guest_core::cmdline::parse_number(value),
                reference_number(value),
                "{value:?}"
            );
        }
    }
    // A whole input as one value too (signs, prefixes, long digit runs).
    assert_eq!(
        guest_core::cmdline::parse_number(&line),
        reference_number(&line),
        "{line:?}"
    );
});
