//! docs/cli-reference.md is generated from the clap definitions by
//! clap-markdown: every command and option, with its help text and default,
//! as `ptiscope --help` has them. This test fails when the file and the
//! definitions disagree; `PTISCOPE_BLESS=1 cargo test --test cli_reference`
//! writes the file anew.

use clap::CommandFactory;

const REFERENCE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/cli-reference.md");

fn generated() -> String {
    let options = clap_markdown::MarkdownOptions::new()
        .title("ptiscope command-line reference".into())
        .show_footer(false);
    let body = clap_markdown::help_markdown_custom::<ptiscope::cli::Cli>(&options);
    format!(
        "<!-- Generated from the clap definitions (vmm/src/cli) by tests/cli_reference.rs:\n     \
         PTISCOPE_BLESS=1 cargo test --test cli_reference. Do not edit by hand;\n     \
         docs/running.md explains the options at length. -->\n\n{body}"
    )
}

#[test]
fn cli_reference_matches_the_clap_definitions() {
    let want = generated();
    if std::env::var_os("PTISCOPE_BLESS").is_some() {
        std::fs::write(REFERENCE, &want).expect("writing docs/cli-reference.md");
    }
    let have = std::fs::read_to_string(REFERENCE).unwrap_or_default();
    if have != want {
        let line = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| have.lines().count().min(want.lines().count()));
        panic!(
            "docs/cli-reference.md is not what the clap definitions give (first difference at \
             line {}): run `PTISCOPE_BLESS=1 cargo test --test cli_reference` and commit it",
            line + 1
        );
    }
    // Every long option of every command users see (hidden ones are the
    // nested backend's inner plumbing) is in the reference.
    fn check(cmd: &clap::Command, reference: &str) {
        for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = arg.get_long() {
                assert!(
                    reference.contains(&format!("--{long}")),
                    "--{long} of `{}` is missing from the reference",
                    cmd.get_name()
                );
            }
        }
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            check(sub, reference);
        }
    }
    check(&ptiscope::cli::Cli::command(), &want);
}
