//! The CPU models an installed QEMU offers (`-cpu help`, in both of QEMU's
//! formats), and the refusal of a model it lacks before it starts.

use std::sync::Mutex;

use super::binary::qemu_output;
use super::error::QemuError;

/// The CPU models `binary -cpu help` lists (`x86 NAME  description`
/// lines), once per binary and process.
pub fn cpu_models(binary: &str) -> Result<Vec<String>, QemuError> {
    use std::collections::HashMap;
    static CACHE: Mutex<Option<HashMap<String, Vec<String>>>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = cache.as_ref().and_then(|c| c.get(binary)) {
        return Ok(m.clone());
    }
    let out = qemu_output(binary, &["-cpu", "help"])?;
    let models = parse_cpu_models(&String::from_utf8_lossy(&out.stdout));
    cache
        .get_or_insert_with(HashMap::new)
        .insert(binary.to_string(), models.clone());
    Ok(models)
}

/// The model names of `-cpu help`'s output: the second word of each line
/// that starts with the architecture (`x86 Skylake-Client-v1 ...`); the
/// feature flags listed after them are indented and left out.
pub fn parse_cpu_models(help: &str) -> Vec<String> {
    // QEMU up to 8.x writes `x86 NAME  description` lines; 9.0 and later an
    // `Available CPUs:` header, then `  NAME  description` lines up to a
    // blank line (then `Recognized CPUID flags:`, indented too, not models).
    let mut in_list = false;
    let mut models = Vec::new();
    for line in help.lines() {
        let name = if let Some(rest) = line.strip_prefix("x86 ") {
            rest.split_whitespace().next()
        } else if line.trim_end() == "Available CPUs:" {
            in_list = true;
            None
        } else if in_list && line.starts_with("  ") {
            line.split_whitespace().next()
        } else {
            in_list = false;
            None
        };
        models.extend(name.map(str::to_string));
    }
    models
}

/// Why `model` cannot be `binary`'s `-cpu` under TCG, `None` if it can:
/// read from QEMU's own list, so that a model name QEMU would refuse
/// (`unable to find CPU model`) is refused before anything boots, with the
/// names it takes. A QEMU that cannot be asked (not installed) is left to
/// the run's own error.
pub fn cpu_model_refusal(binary: &str, model: &str) -> Option<String> {
    let models = cpu_models(binary).ok().filter(|m| !m.is_empty())?;
    if model == "host" {
        return Some(format!(
            "QEMU's host CPU model needs KVM (or HVF), and --backend qemu runs TCG; \
             give an emulated model (e.g. max, Skylake-Client-v1; `{binary} -cpu help` lists them)"
        ));
    }
    if models.iter().any(|m| m == model) {
        return None;
    }
    // The models that share the name's first three letters (a typo's
    // neighbours), else the unversioned ones.
    let stem: String = model
        .chars()
        .take(3)
        .collect::<String>()
        .to_ascii_lowercase();
    let mut close: Vec<&str> = models
        .iter()
        .map(String::as_str)
        .filter(|m| *m != "host" && m.to_ascii_lowercase().starts_with(&stem))
        .take(12)
        .collect();
    if close.is_empty() {
        close = models
            .iter()
            .map(String::as_str)
            .filter(|m| *m != "host" && !m.contains("-v"))
            .take(12)
            .collect();
    }
    Some(format!(
        "{binary} has no CPU model {:?} (its models include {}, ...; \
         `{binary} -cpu help` lists all {}); give one of them",
        ptiscope_devices::escape_str(model),
        close.join(", "),
        models.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `-cpu help`'s model lines are read, its feature list is not.
    #[test]
    fn cpu_models_from_qemu_help() {
        let help =
            "Available CPUs:\nx86 486                   (alias configured by machine type)\n\
                    x86 Skylake-Client-v1     Intel Core Processor (Skylake)\n\
                    x86 host                  processor with all supported host features\n\
                    x86 max                   Enables all features supported by the accelerator\n\
                    \nRecognized CPUID flags:\n  3dnow 3dnowext\n  xsave xtpr\n";
        assert_eq!(
            parse_cpu_models(help),
            ["486", "Skylake-Client-v1", "host", "max"]
        );
    }

    /// QEMU 9.0 and later: no `x86 ` prefix, the list indented under its
    /// header, and the CPUID flags after a blank line are no models.
    #[test]
    fn cpu_models_from_qemu_10_help() {
        let help = "Available CPUs:\n  486                   (alias configured by machine type)\n  \
                    486-v1                \n  Skylake-Client-v1     Intel Core Processor (Skylake)\n  \
                    max                   Enables all features supported by the accelerator\n\
                    \nRecognized CPUID flags:\n  3dnow 3dnowext 3dnowprefetch\n  xsave xtpr\n";
        assert_eq!(
            parse_cpu_models(help),
            ["486", "486-v1", "Skylake-Client-v1", "max"]
        );
    }

    /// A model this QEMU lacks, `help` and `host` are refused before QEMU
    /// starts, naming what it has; its own models pass.
    #[test]
    fn cpu_models_qemu_lacks_are_refused_before_it_starts() {
        let binary = "qemu-system-x86_64";
        if cpu_models(binary).map_or(true, |m| m.is_empty()) {
            println!("SKIP cpu_models_qemu_lacks_are_refused_before_it_starts: no {binary}");
            return;
        }
        for ok in ["max", "Skylake-Client-v1", "qemu64"] {
            assert_eq!(cpu_model_refusal(binary, ok), None, "{ok}");
        }
        for (bad, says) in [
            ("bogus", "no CPU model \"bogus\""),
            ("help", "no CPU model \"help\""),
            ("max=1", "no CPU model \"max=1\""),
            ("skylake-client-v1", "Skylake-Client-v1"),
            ("host", "needs KVM"),
        ] {
            let why = cpu_model_refusal(binary, bad).unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(
                why.contains(says) && why.contains("-cpu help"),
                "{bad}: {why}"
            );
        }
    }
}
