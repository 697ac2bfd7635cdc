//! The `--fail-if` condition grammar (user input).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ptiscope::report::threshold::{Condition, FailIf};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(c) = Condition::parse(&text) {
        // What parses prints back to something that parses the same way.
        let again = Condition::parse(&c.to_string());
        assert!(again.is_ok(), "{text:?} parsed, its rendering {c} does not");
    }
    if let Ok(f) = FailIf::parse(&[&*text]) {
        // Symbol conditions print back to what parses the same way too.
        for s in &f.symbol {
            let again = FailIf::parse(&[s.text()]).map(|g| g.symbol);
            assert_eq!(again, Ok(vec![s.clone()]), "{text:?}");
        }
    }
});
