//! `ptiscope probe`: what this host's KVM can run, as a table or JSON.

use crate::cli::exit_code;
use crate::cli::ProbeArgs;

/// Runs the probes and prints them; returns the process exit code.
pub fn run(args: &ProbeArgs) -> i32 {
    match crate::probe::run(&crate::probe::ProbeOptions::default()) {
        Ok(report) => {
            // The environment block below carries the refill verdict: the
            // one just measured, not a second measurement.
            crate::preflight::host::remember_cr3_write_refill(&report.cr3_write_refill);
            if args.json {
                // Every JSON report records where it came from; the probe's
                // own findings are the report itself, the block adds the rest.
                let mut value = serde_json::to_value(&report).unwrap_or_default();
                if let Some(o) = value.as_object_mut() {
                    let env = crate::report::Environment::collect(
                        "kvm",
                        crate::report::environment::GuestImage::new(
                            "none (the probe's own tiny guests)",
                            None,
                        ),
                        Default::default(),
                    );
                    o.insert(
                        "environment".into(),
                        serde_json::to_value(env).unwrap_or_default(),
                    );
                }
                match serde_json::to_string_pretty(&value) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        eprintln!("ptiscope: error: serializing the probe report: {e}");
                        return exit_code::INTERNAL;
                    }
                }
            } else {
                print!("{report}");
            }
            0
        }
        Err(e) => {
            eprintln!("ptiscope: error: {e}");
            exit_code::KVM_UNAVAILABLE
        }
    }
}
