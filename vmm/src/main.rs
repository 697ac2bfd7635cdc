//! The `ptiscope` binary: parses the command line and hands it to the
//! command's module in `ptiscope::cli`; the number that comes back is the
//! exit status.

use std::process::ExitCode;

use clap::Parser;
use ptiscope::cli::exit_code;
use ptiscope::cli::{Cli, Command};

fn main() -> ExitCode {
    // PID 1 of `--backend nested`'s inner Linux: ptiscope is its init.
    if std::process::id() == 1 && std::env::var_os(ptiscope::nested::INIT_ENV).is_some() {
        ptiscope::nested::init::main();
    }
    quiet_on_a_closed_stdout();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_target(false)
        .init();
    // Before any thread exists, so that every thread inherits the mask and
    // SIGINT/SIGTERM arrive through the VMM's signalfd (a clean stop).
    ptiscope::signals::block_termination_signals();
    // The host facts are read meanwhile (ptiscope::cli::warm_host_facts);
    // a command that needs none never waits for them.
    let _ = std::thread::Builder::new()
        .name("host-facts".into())
        .spawn(ptiscope::cli::warm_host_facts);

    // `--timeout`'s defaults for Linux runs settle with the other options.
    let cli = match ptiscope::cli::timeout::parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            // Help and version are not errors; usage errors get EX_USAGE, not
            // clap's 2, which is a guest status here.
            return code(if e.use_stderr() { exit_code::USAGE } else { 0 });
        }
    };
    ptiscope::sandbox::set_enabled(!cli.no_seccomp);
    let status = command(cli);
    // A termination signal that came after the command's last look at
    // signals (just after its last run ended, while its report was
    // written) is not swallowed: the command's output is complete, and the
    // process ends as that signal asked, with 128 + it.
    // (A command that ended on the signal, e.g. while reading an image,
    // which leaves it pending, has said so already.)
    if let Some(signal) = ptiscope::signals::wait_termination(Default::default()) {
        if status != code(128 + signal) {
            eprintln!(
                "ptiscope: {} after the command finished (its output is complete)",
                ptiscope::signals::describe(signal)
            );
        }
        return code(128 + signal);
    }
    status
}

fn command(cli: Cli) -> ExitCode {
    // `--backend nested`'s runs go through the backend trait: its sessions
    // are booted by the `nested` module, above the backends.
    ptiscope::backend::nested::provide_sessions(ptiscope::backend::nested::Sessions {
        paging: ptiscope::nested::cli::kvm_paging,
        start: ptiscope::nested::session::start,
    });
    // `--backend nested`: the whole command runs inside QEMU TCG's KVM.
    if let Some(status) = ptiscope::nested::cli::intercept(&cli) {
        return code(status);
    }
    match cli.command {
        Some(Command::Run(args)) => code(ptiscope::cli::run::run(&args)),
        Some(Command::Compare(args)) => code(ptiscope::cli::compare_command(&args)),
        Some(Command::Sweep(args)) => code(ptiscope::cli::sweep::run(&args)),
        Some(Command::Probe(args)) => code(ptiscope::cli::probe::run(&args)),
        Some(Command::Pagetables(args)) => code(ptiscope::cli::pagetables::run(&args)),
        Some(Command::Linux(cmd)) => code(ptiscope::cli::linux::run(&cmd)),
        Some(Command::Reproduce(args)) => code(ptiscope::cli::reproduce::run(&args)),
        Some(Command::Ledger(args)) => code(ptiscope::cli::ledger::run(&args)),
        Some(Command::NestedBatch(args)) => code(ptiscope::nested::cli::batch(&args)),
        Some(Command::NestedExec(args)) => code(ptiscope::nested::cli::exec(&args)),
        Some(Command::NestedServe(args)) => code(ptiscope::nested::serve::serve(&args)),
        // No command: the README's main job, the default comparison.
        None => match Cli::try_parse_from(["ptiscope", "compare"]) {
            Ok(Cli {
                command: Some(Command::Compare(args)),
                ..
            }) => code(ptiscope::cli::compare_command(&args)),
            _ => code(exit_code::INTERNAL),
        },
    }
}

/// A closed stdout or stderr (`ptiscope compare | head`) ends the process
/// as SIGPIPE ends other Unix tools: quietly, with exit status 141 (128 +
/// SIGPIPE), not with Rust's panic and backtrace from `print!`. SIGPIPE
/// itself stays ignored (Rust's default), so that a `--serial-out` or
/// `--metrics-out` FIFO whose reader goes away is an output error the run
/// reports (exit 73), not the end of the run.
fn quiet_on_a_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info.payload_as_str().unwrap_or("");
        let closed = (msg.starts_with("failed printing to stdout")
            || msg.starts_with("failed printing to stderr"))
            && msg.contains(&format!("(os error {})", libc::EPIPE));
        if closed {
            std::process::exit(exit_code::CLOSED_STDOUT);
        }
        default(info);
    }));
}

fn code(c: i32) -> ExitCode {
    ExitCode::from(u8::try_from(c).unwrap_or(u8::MAX))
}
