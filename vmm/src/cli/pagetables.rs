//! `ptiscope pagetables`: boot the guest with a one-call workload, walk both
//! copies of its address space from the host at the phase-begin exit, and
//! give the isolation verdict.

use crate::cli::exit_code::{self, ExitCode as _};
use crate::cli::PagetablesArgs;
use crate::output::open_document;
use crate::run_vm;

/// `ptiscope pagetables`: boot the guest with a one-call getpid workload,
/// walk both copies of its address space at the phase-begin exit, report.
/// Runs the command; returns the process exit code.
pub fn run(args: &PagetablesArgs) -> i32 {
    use crate::machine::loader::{self, KernelSource};
    use crate::observe::pagetables::{EntryArea, Inspector, Paging};
    let kernel = match &args.kernel {
        Some(p) => KernelSource::Path(p.clone()),
        None => KernelSource::Embedded(args.arch.embedded_image()),
    };
    let image = match loader::read_image(&kernel) {
        Ok(i) => i,
        Err(e) => {
            say!("ptiscope: error: {e}");
            return exit_code::NO_IMAGE;
        }
    };
    let entry_area = match EntryArea::from_elf(&image) {
        Ok(a) => a,
        Err(e) => {
            say!("ptiscope: error: {}: {e}", kernel.describe());
            return exit_code::BAD_IMAGE;
        }
    };
    let paging = if loader::is_elf32(&image) {
        Paging::Pae
    } else {
        Paging::FourLevel
    };
    let mut config = crate::spec::RunConfig::new(kernel);
    config.mem_mib = args.mem;
    config.serial_out = crate::output::SerialOut::Discard;
    // SIGINT/SIGTERM/SIGHUP are blocked in main: without this they would
    // wait for the run's timeout.
    config.handle_signals = true;
    config.guest.pti = args.pti;
    config.guest.workload = Some(ptiscope_abi::options::Workload::Getpid);
    config.guest.iterations = Some(1);
    config.guest.extra = args.cmdline.clone();
    let json = match args
        .json
        .as_deref()
        .map(|p| open_document("--json", p, crate::spec::request::DEFAULT_TIMEOUT))
        .transpose()
    {
        Ok(j) => j,
        Err(e) => {
            say!("ptiscope: error: {e}");
            return e.exit_code();
        }
    };
    let mut inspector = Inspector::new(paging, entry_area)
        .with_deferred_text(EntryArea::deferred_switch_text(&image));
    let outcome = match run_vm(&config, &crate::cli::host_facts(), &mut inspector) {
        Ok(o) => o,
        Err(e) => {
            say!("ptiscope: error: {e}");
            return e.exit_code();
        }
    };
    let inspection = match inspector.result {
        Some(Ok(i)) => i,
        Some(Err(e)) => {
            say!("ptiscope: error: the page-table walk failed: {e}");
            return exit_code::VM_ERROR;
        }
        None => {
            say!(
                "ptiscope: error: the guest marked no phase, so there was no moment to walk its tables ({})",
                outcome.stop_description()
            );
            // The guest's own failure (a fault, a bad command line) is its
            // status; a guest that exited 0 without a phase is the walk's.
            return match outcome.exit_code() {
                0 => exit_code::VM_ERROR,
                status => status,
            };
        }
    };
    print!("{}", inspection.render());
    if let Some(f) = &json {
        let mut value = serde_json::to_value(&inspection).unwrap_or_default();
        if let Some(o) = value.as_object_mut() {
            let options = crate::cli::compare::config_words(&outcome);
            let env = crate::report::Environment::collect(
                &crate::cli::host_facts(),
                crate::cli::kvm_identity(),
                crate::cli::compare::guest_image_of(&config.kernel, Some(&image)),
                [("pagetables".to_owned(), options)].into(),
            );
            o.insert(
                "environment".into(),
                serde_json::to_value(env).unwrap_or_default(),
            );
        }
        let text = serde_json::to_string_pretty(&value).unwrap_or_else(|_| "null".into());
        if let Err(e) = f.write_document(&text) {
            say!("ptiscope: error: {e}");
            return exit_code::CANT_CREATE;
        }
    }
    outcome.exit_code()
}
