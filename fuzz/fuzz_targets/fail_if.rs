//! The `--fail-if` condition grammar (user input).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ptiscope::report::threshold::Condition;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(c) = Condition::parse(&text) {
        // What parses prints back to something that parses the same way.
        let again = Condition::parse(&c.to_string());
        assert!(again.is_ok(), "{text:?} parsed, its rendering {c} does not");
    }
    let _ = Condition::parse_list(&text);
});
