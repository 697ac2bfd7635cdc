//! `ptiscope probe`: what this host's KVM can run, as a table or JSON.

use crate::cli::exit_code;
use crate::cli::ProbeArgs;

/// What `--backend qemu` has on this host, per emulator: its version,
/// whether it takes TCG plugins, and whether ptiscope's plugin is there
/// for it. `(text line, JSON)`.
fn qemu_backend() -> (String, serde_json::Value) {
    use crate::backend::qemu::{plugin_for, qemu_support};
    let mut text = String::new();
    let mut json = Vec::new();
    for binary in ["qemu-system-x86_64", "qemu-system-i386"] {
        let support = qemu_support(binary);
        let version = support
            .as_ref()
            .ok()
            .and_then(|s| s.version)
            .map(|(a, b, c)| format!("{a}.{b}.{c}"));
        let plugins = support.as_ref().is_ok_and(|s| s.plugins);
        let plugin = if support.is_ok() {
            plugin_for(binary)
        } else {
            Err(crate::backend::qemu::QemuError::Plugin(
                "not installed".into(),
            ))
        };
        let line = match (&support, &plugin) {
            (Err(_), _) => format!("{binary}: not installed (`apt-get install qemu-system-x86`)"),
            (Ok(_), Ok((path, api))) => format!(
                "{binary} {}: TCG plugins yes; ptiscope plugin (API {api}) {}",
                version.as_deref().unwrap_or("?"),
                path.display()
            ),
            (Ok(_), Err(e)) => format!(
                "{binary} {}: no ptiscope plugin: {e}",
                version.as_deref().unwrap_or("?")
            ),
        };
        text.push_str(&format!("qemu backend: {line}\n"));
        json.push(serde_json::json!({
            "binary": binary,
            "installed": support.is_ok(),
            "version": version,
            "tcg_plugins": plugins,
            "plugin": plugin.as_ref().ok().map(|(p, _)| p.display().to_string()),
            "plugin_api": plugin.as_ref().ok().map(|(_, a)| *a),
            "plugin_problem": plugin.as_ref().err().map(|e| e.to_string()),
        }));
    }
    (text, serde_json::Value::Array(json))
}

/// Runs the probes and prints them; returns the process exit code.
pub fn run(args: &ProbeArgs) -> i32 {
    let (qemu_text, qemu_json) = qemu_backend();
    match crate::probe::run(&crate::probe::ProbeOptions::default()) {
        Ok(report) => {
            // The environment block below carries the refill verdict: the
            // one just measured, not a second measurement; the host facts
            // cache keeps what was just measured.
            crate::cli::host_facts().remember_report(&report);
            if args.json {
                // Every JSON report records where it came from; the probe's
                // own findings are the report itself, the block adds the rest.
                let mut value = serde_json::to_value(&report).unwrap_or_default();
                if let Some(o) = value.as_object_mut() {
                    let env = crate::report::Environment::collect(
                        &crate::cli::host_facts(),
                        crate::cli::kvm_identity(),
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
                    o.insert("qemu_backend".into(), qemu_json);
                }
                match serde_json::to_string_pretty(&value) {
                    Ok(s) => println!("{s}"),
                    Err(e) => {
                        say!("ptiscope: error: serializing the probe report: {e}");
                        return exit_code::INTERNAL;
                    }
                }
            } else {
                print!("{report}");
                print!("{qemu_text}");
            }
            0
        }
        Err(e) => {
            say!("ptiscope: error: {e}");
            eprint!("{qemu_text}");
            exit_code::KVM_UNAVAILABLE
        }
    }
}
