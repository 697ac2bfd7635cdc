//! The guest kernel's command-line parser (guest-core, `no_std`): the VMM
//! and the user write the line, the guest must survive anything.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let line = String::from_utf8_lossy(data);
    let _ = guest_core::cmdline::parse(&line);
    for word in line.split_ascii_whitespace() {
        if let Some((_, value)) = word.split_once('=') {
            let _ = guest_core::cmdline::parse_number(value);
        }
    }
});
