//! `ptiscope compare` end to end under KVM: the table, the JSON schema round
//! trip, CSV, `--fail-if` failing and passing as it should, the statistics
//! (significance markers, confidence intervals, Welch's p-value),
//! `--runs auto`, the environment block and `--against`.

mod common;

use common::*;
use ptiscope::report::CompareTable;

fn compare(extra: &[&str], name: &str) -> (Option<i32>, String, String, std::path::PathBuf) {
    compare_with(&[&["--runs", "2"][..], extra].concat(), name)
}

/// `compare --iterations 200 --quiet --json FILE` and `extra` (no `--runs`).
/// What every compare must hold (issue 26): a count whose runs all have
/// the same per-call rational (checked here on the JSON's integers) is
/// exact, with no t, p or CI; every answer line's one verdict agrees with
/// its p and its CI, in the JSON and in the printed line; the time says
/// what it is on this host's backend, and where that is not hardware the
/// counts lead.
fn check_exact_counts_and_one_verdict(v: &serde_json::Value, out: &str) {
    let ints = |x: &serde_json::Value| -> Vec<u128> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|n| u128::from(n.as_u64().unwrap()))
            .collect()
    };
    let mut counts_seen = 0;
    for m in v["metrics"].as_array().unwrap() {
        let sides = [&m["baseline"]["counts"], &m["compare"]["counts"]];
        if sides.iter().any(|c| c.is_null()) {
            continue;
        }
        counts_seen += 1;
        let exact = sides.iter().all(|c| {
            let (k, n) = (ints(&c["counts"]), ints(&c["calls"]));
            (0..k.len()).all(|i| k[i] * n[0] == k[0] * n[i])
        });
        let sig = &m["significance"];
        if exact {
            assert!(
                sig["verdict"].as_str().unwrap().starts_with("exact_"),
                "{}: {sig}",
                m["name"]
            );
            assert!(sig["welch"].is_null() && sig["mmtests"].is_null(), "{sig}");
        }
    }
    assert!(counts_seen > 3, "counts carried as integers: {counts_seen}");
    let answer = v["answer"].as_array().unwrap();
    for a in answer {
        let verdict = a["verdict"].as_str().unwrap();
        if a["exact"] == true {
            assert!(a["delta_ci95"].is_null() && a["welch_p"].is_null(), "{a}");
            continue;
        }
        let Some(p) = a["welch_p"].as_f64() else {
            continue;
        };
        let ci = a["delta_ci95"].as_array().unwrap();
        let (lo, hi) = (ci[0].as_f64().unwrap(), ci[1].as_f64().unwrap());
        let significant = verdict == "significant";
        assert_eq!(significant, p < 0.05, "{a}");
        assert_eq!(significant, lo > 0.0 || hi < 0.0, "{a}");
    }
    // The printed answer lines: one verdict word each, beside its p.
    let block: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.contains(" per getpid call (+ = more with"))
        .skip(1)
        .take_while(|l| l.starts_with("  ["))
        .collect();
    assert_eq!(block.len(), answer.len(), "{out}");
    for l in &block {
        let words = [
            "not significant",
            "significant",
            "exact, differ",
            "exact, equal",
        ];
        let n = words
            .iter()
            .filter(|w| l.ends_with(*w) || l.contains(&format!("{w}, p ")))
            .count();
        // "not significant" also contains "significant": one of them or
        // both for that one verdict.
        assert!(n == 1 || (n == 2 && l.contains("not significant")), "{l}");
        assert!(
            !l.contains("mmtests"),
            "mmtests' rule is not a second verdict: {l}"
        );
    }
    let module = v["environment"]["kvm"]["module"].as_str().unwrap_or("");
    let key = v["time_basis"]["key"].as_str().unwrap();
    let expected = match module {
        _ if v["environment"]["backend"] == "nested" => "nested_tcg",
        "kvm_pvm" => "kvm_pvm",
        "kvm_intel" | "kvm_amd" => "hardware",
        _ => "unknown",
    };
    assert_eq!(key, expected, "{}", v["time_basis"]);
    let label = v["time_basis"]["label"].as_str().unwrap();
    assert!(out.contains(&format!("time here: {label}")), "{out}");
    let times: Vec<usize> = answer
        .iter()
        .enumerate()
        .filter(|(_, a)| !a["time_basis"].is_null())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(times.len(), 1, "one time line");
    if key != "hardware" {
        assert_eq!(times[0], answer.len() - 1, "the counts lead: {answer:?}");
    }
}

fn compare_with(extra: &[&str], name: &str) -> (Option<i32>, String, String, std::path::PathBuf) {
    let dir = scratch(name);
    let json = dir.join("compare.json");
    let o = ptiscope()
        .args(["compare", "--iterations", "200", "--quiet"])
        .args(["--json", json.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    (o.status.code(), stdout(&o), stderr(&o), json)
}

#[test]
fn compare_prints_the_table_and_writes_json_and_csv() {
    if !kvm_or_skip("compare_table") {
        return;
    }
    let csv = scratch("compare-csv").join("c.csv");
    let svg = scratch("compare-svg").join("c.svg");
    let (code, out, err, json) = compare(
        &[
            "--csv",
            csv.to_str().unwrap(),
            "--svg",
            svg.to_str().unwrap(),
            "--fail-if",
            "cr3_writes_per_call.compare!=2,cr3_writes_per_call.baseline!=0",
            "--fail-if",
            "syscalls_per_call.max!=1",
            // 0 vs 2 CR3 writes per call, exact: always a significant difference.
            "--fail-if",
            "cr3_writes_per_call.significant==0",
        ],
        "compare-ok",
    );
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(err.contains("does not hold"), "{err}");
    assert!(
        err.contains("--fail-if cr3_writes_per_call.significant==0 does not hold (value 1)"),
        "{err}"
    );

    let text = std::fs::read_to_string(&json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["schema"], "ptiscope.compare/1");
    assert_eq!(v["baseline"]["label"], "pti=off", "{v}");
    assert_eq!(v["compare"]["label"], "pti=on", "{v}");
    // The mmtests statistics of every metric, on both sides.
    let ns_json = v["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "ns_per_call")
        .expect("ns_per_call in the JSON");
    for side in ["baseline", "compare"] {
        for stat in ["min", "amean", "stddev", "coeffvar", "max", "bamean50"] {
            assert!(ns_json[side][stat].is_number(), "{side} {stat}: {ns_json}");
        }
    }
    // The mmtests duration table: CPU and wall seconds per side, positive.
    for side in ["baseline", "compare"] {
        let d = &v["durations"][side];
        assert!(d["elapsed_s"].as_f64().unwrap() > 0.0, "{d}");
        assert!(d["system_s"].as_f64().unwrap() + d["user_s"].as_f64().unwrap() > 0.0);
    }
    let t = CompareTable::from_json(v.clone()).expect("schema round trip");
    assert_eq!(t.baseline.label, "pti=off");
    let cr3 = t.metric("cr3_writes_per_call").expect("cr3 metric");
    assert_eq!(cr3.baseline.samples, vec![0.0, 0.0]);
    assert_eq!(cr3.compare.samples, vec![2.0, 2.0]);
    let ns = t.metric("ns_per_call").unwrap();
    assert_eq!(ns.metric.source, ptiscope::report::Source::HostClock);
    assert_eq!(ns.baseline.samples.len(), 2);
    // Reading and writing again gives the same document.
    assert_eq!(
        serde_json::to_string(&t.to_json()).unwrap(),
        serde_json::to_string(&CompareTable::from_json(t.to_json()).unwrap().to_json()).unwrap()
    );
    let csv = std::fs::read_to_string(&csv).unwrap();
    assert!(csv.starts_with("metric,unit,source,lower_is_better,stat,"));
    assert!(csv.contains("\ncr3_writes_per_call,count/call,guest,true,amean,0,2,"));
    // The picture names the workload and draws the counter that differs.
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("per getpid call"), "{svg}");
    assert!(svg.contains("cr3_writes_per_call [guest]"), "{svg}");
    render_png(&svg, "compare-small");
}

#[test]
fn fail_if_fails_when_a_condition_holds() {
    if !kvm_or_skip("compare_fail_if") {
        return;
    }
    let (code, out, err, _) = compare(
        &[
            "--fail-if",
            "cr3_writes_per_call==2",
            "--baseline",
            "pti=off,entry=auto",
        ],
        "compare-fail",
    );
    assert_eq!(code, Some(1), "{out}\n{err}");
    assert!(
        err.contains("--fail-if cr3_writes_per_call.amean.compare==2 holds"),
        "{err}"
    );
    // A metric the runs do not have is a usage error, found after the first run.
    let (code, _, err, _) = compare(&["--fail-if", "no_such_metric>1"], "compare-unknown");
    assert_eq!(code, Some(64));
    assert!(err.contains("no metric \"no_such_metric\""), "{err}");
}

#[test]
fn bad_compare_usage_is_refused_before_any_run() {
    // No KVM needed: these fail before a VM is created.
    for (args, needle) in [
        (
            &["--fail-if", "cr3_writes_per_call=2"][..],
            "\"=\" is not a comparison operator",
        ),
        (&["--baseline", "pti=maybe"][..], "possible values"),
        (&["--compare", "colour=blue"][..], "unknown key"),
        (&["--compare", "pti"][..], "not key=value"),
        (&["--baseline", ""][..], "sets nothing"),
        (&["--baseline", ",,,"][..], "sets nothing"),
        (&["--compare", "pti=on,pti=off"][..], "given twice"),
        (&["--compare", "colour=blue"][..], "linux append cpu"),
        (
            &["--fail-if", "symbol:entry_SYSCALL_64>1,symbol:x>2"][..],
            "needs --by-symbol",
        ),
        (
            &["--fail-if", "cr3_writes_per_call>1,symbol:x>1e-400"][..],
            "below the smallest normal f64",
        ),
        (
            &["--fail-if", "cr3_writes_per_call>1,"][..],
            "empty condition",
        ),
        (&["--runs", "0"][..], "1..=1000, or `auto`"),
        (&["--runs", "sometimes"][..], "1..=1000, or `auto`"),
        (&["--target-ci", "1"][..], "go with --runs auto"),
        (
            &["--runs", "4", "--max-runs", "9"][..],
            "go with --runs auto",
        ),
        (&["--runs", "auto", "--target-ci", "0"][..], "in (0, 100]"),
        (&["--runs", "auto", "--max-runs", "2"][..], "--max-runs"),
        (
            &["--against", "/nonexistent/earlier.json"][..],
            "--against /nonexistent/earlier.json: cannot read it",
        ),
    ] {
        let o = ptiscope().arg("compare").args(args).output().unwrap();
        assert_eq!(o.status.code(), Some(64), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn a_fail_if_on_a_metric_the_runs_do_not_have_stops_after_the_first_run() {
    if !common::kvm_or_skip("fail-if typo") {
        return;
    }
    let o = common::ptiscope()
        .args(["compare", "--runs", "5", "--iterations", "50", "--quiet"])
        .args(["--fail-if", "cr3_writs_per_call!=2"])
        .output()
        .unwrap();
    let err = common::stderr(&o);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("no metric \"cr3_writs_per_call\""), "{err}");
    assert!(
        err.contains("cr3_writes_per_call"),
        "lists what exists: {err}"
    );
}

/// The default compare's size (5 runs per side) with short runs: the Amean
/// rows carry mmtests' marker exactly where the JSON's verdict says so, the
/// CI block has every metric, the JSON's statistics are the ones the
/// library computes from the JSON's own samples, and the environment is there.
#[test]
fn default_compare_marks_significance_and_prints_confidence_intervals() {
    if !kvm_or_skip("compare_significance") {
        return;
    }
    let dir = scratch("compare-significance");
    let json = dir.join("c.json");
    let o = ptiscope()
        .args(["compare", "--iterations", "1000", "--quiet", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let (out, err) = (stdout(&o), stderr(&o));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    let v = read_json(&json);
    check_exact_counts_and_one_verdict(&v, &out);
    let t = CompareTable::from_json(v.clone()).unwrap();
    for m in &t.metrics {
        let sig = m.significance.expect("significance in every metric");
        assert_eq!(m.baseline.n(), 5);
        // The JSON's numbers are the library's on the JSON's summaries
        // (a count's integers included).
        let again = ptiscope::report::stats::significance_of(&m.baseline, &m.compare);
        assert_eq!(sig.verdict, again.verdict, "{}", m.metric.name);
        // (through JSON text a float may come back one ulp off)
        let ci = ptiscope::report::stats::mean_ci95(&m.baseline.samples).unwrap();
        let got = m.baseline.ci95.unwrap();
        assert!((got.half_width - ci.half_width).abs() <= 1e-9 * ci.half_width.abs().max(1.0));
        if let (Some(w), Some(x)) = (sig.welch, again.welch) {
            assert!((w.p_value - x.p_value).abs() <= 1e-9 && (0.0..=1.0).contains(&w.p_value));
        }
        // Every side of every metric has its mean's 95 % CI (5 runs).
        for s in [&m.baseline, &m.compare] {
            let ci = s.ci95.expect("a CI with 5 runs");
            assert!(ci.half_width >= 0.0, "{}", m.metric.name);
        }
    }
    // CR3 writes per call are exact (0 and 2) and differ: always marked
    // (the text's rendering of the mark is tested in report::compare).
    let cr3 = t.metric("cr3_writes_per_call").unwrap();
    let sig = cr3.significance.unwrap();
    assert_eq!(
        sig.verdict,
        ptiscope::report::stats::Verdict::ExactDifferent
    );
    assert!(sig.verdict.marked());
    assert!(cr3.diff_pct.amean.is_none(), "0 -> 2 has no percentage");
    // Host-clock time is noisy: a real interval, not an exact value.
    let ns = t.metric("ns_per_call").unwrap();
    assert!(ns.compare.ci95.unwrap().half_width > 0.0);
    // The per-call answer block: one line per headline metric, each with
    // its source, one signed difference (compare - baseline) and its CI.
    let answer = v["answer"].as_array().expect("answer in the JSON");
    let names: Vec<&str> = answer.iter().filter_map(|a| a["metric"].as_str()).collect();
    assert!(
        names.contains(&"ns_per_call") && names.contains(&"cr3_writes_per_call"),
        "{names:?}"
    );
    for a in answer {
        let m = t.metric(a["metric"].as_str().unwrap()).unwrap();
        assert_eq!(a["source"], m.metric.source.key(), "{a}");
        let d = a["delta"].as_f64().unwrap();
        assert!(
            (d - (m.compare.amean - m.baseline.amean)).abs() <= 1e-9 * d.abs().max(1.0),
            "{a}"
        );
        assert_eq!(
            a["verdict"],
            serde_json::to_value(m.significance.unwrap().verdict).unwrap()
        );
    }
    let cr3_answer = answer
        .iter()
        .find(|a| a["metric"] == "cr3_writes_per_call")
        .unwrap();
    assert_eq!(cr3_answer["delta"], 2.0);
    assert!(cr3_answer["delta_ci95"].is_null(), "exact: {cr3_answer}");

    let env = &v["environment"];
    assert!(env["host"]["cpus"].as_u64().unwrap() >= 1, "{env}");
    assert!(env["host"]["kernel"]
        .as_str()
        .unwrap()
        .starts_with("Linux "));
    assert_eq!(env["backend"], kvm_backend_name());
    assert!(
        env["kvm"]["module"].as_str().unwrap().starts_with("kvm_"),
        "{env}"
    );
    assert_eq!(
        env["guest_image"]["sha256"],
        ptiscope::report::environment::sha256_hex(ptiscope::GUEST_X86_64)
    );
    assert_eq!(env["ptiscope"]["version"], env!("CARGO_PKG_VERSION"));
    assert!(env["options"]["baseline"]
        .as_array()
        .unwrap()
        .contains(&"pti=off".into()));
    assert!(env["options"]["compare"]
        .as_array()
        .unwrap()
        .contains(&"pti=on".into()));
    assert!(
        env["host"].as_object().unwrap().contains_key("cpu_model"),
        "{env}"
    );
    assert_eq!(v["runs"]["mode"], "fixed");
    assert_eq!(v["runs"]["per_side"], 5);
}

/// `--runs auto` stops by itself and says how many runs it took: a target
/// no host reaches stops at --max-runs; a loose one stops at or before it,
/// and whichever stop it names is consistent with the figures it gives.
#[test]
fn runs_auto_stops_and_says_how_many_runs() {
    if !kvm_or_skip("compare_runs_auto") {
        return;
    }
    let run = |target: &str, max: &str, name: &str| {
        let (code, out, err, json) = compare_with(
            &[
                "--runs",
                "auto",
                "--target-ci",
                target,
                "--max-runs",
                max,
                "--warmup",
                "1",
            ],
            name,
        );
        assert_eq!(code, Some(0), "{out}\n{err}");
        let v = read_json(&json);
        (out, v)
    };
    // 0.0001 % of the mean: host-clock times never agree that well.
    let (out, v) = run("0.0001", "3", "auto-max");
    check_exact_counts_and_one_verdict(&v, &out);
    assert_eq!(v["runs"]["stopped"], "max_runs");
    assert_eq!(v["runs"]["warmup"], 1);
    assert_eq!(v["runs"]["per_side"], 3);
    assert_eq!(
        v["metrics"][0]["baseline"]["samples"]
            .as_array()
            .unwrap()
            .len(),
        3
    );

    let (out, v) = run("50", "6", "auto-target");
    check_exact_counts_and_one_verdict(&v, &out);
    let r = &v["runs"];
    let n = r["per_side"].as_u64().unwrap();
    assert!((3..=6).contains(&n), "{r}");
    let cis: Vec<Option<f64>> = r["final_ci_pct"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_f64())
        .collect();
    match r["stopped"].as_str().unwrap() {
        "target_reached" => {
            assert!(cis.iter().all(|c| c.is_some_and(|c| c <= 50.0)), "{r}");
        }
        "max_runs" => {
            assert_eq!(n, 6, "{r}");
            assert!(cis.iter().any(|c| c.is_none_or(|c| c > 50.0)), "{r}");
        }
        other => panic!("stopped: {other}"),
    }
    assert_eq!(r["metric"], "ns_per_call");
    assert_eq!(r["warmup"], 1);
}

/// `--against`: each side against the same side of an earlier result; a
/// changed environment field is named on stderr and in the JSON.
#[test]
fn against_an_earlier_result_names_environment_differences() {
    if !kvm_or_skip("compare_against") {
        return;
    }
    let (code, out, err, earlier) = compare(&[], "against-earlier");
    assert_eq!(code, Some(0), "{out}\n{err}");
    let mut v = read_json(&earlier);
    v["environment"]["host"]["microcode"] = "0xdeadbeef".into();
    std::fs::write(&earlier, serde_json::to_string(&v).unwrap()).unwrap();
    let (code, out, err, now) = compare(&["--against", earlier.to_str().unwrap()], "against-now");
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(
        err.contains(
            "warning: --against: the environment differs: host.microcode: \"0xdeadbeef\" -> "
        ),
        "{err}"
    );
    let v = read_json(&now);
    assert_eq!(
        v["against"]["baseline"]["baseline"]["label"],
        "earlier pti=off"
    );
    assert_eq!(v["against"]["compare"]["compare"]["label"], "now pti=on");
    let diffs = v["against"]["environment_differences"].as_array().unwrap();
    // Same host, build and options: the edited field is the only difference.
    assert_eq!(diffs.len(), 1, "{diffs:?}");
    let side = CompareTable::from_json(v["against"]["compare"].clone()).unwrap();
    let cr3 = side.metric("cr3_writes_per_call").unwrap();
    assert_eq!(
        cr3.significance.unwrap().verdict,
        ptiscope::report::stats::Verdict::ExactEqual
    );
    // A document that is not a compare result is refused before any run.
    let run_json = scratch("against-wrong").join("run.json");
    std::fs::write(&run_json, r#"{"schema":"ptiscope.run/1"}"#).unwrap();
    let o = ptiscope()
        .args(["compare", "--against"])
        .arg(&run_json)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64));
    assert!(
        stderr(&o).contains("not a `ptiscope compare --json` document"),
        "{}",
        stderr(&o)
    );
}

/// A Linux compare under QEMU TCG: its picture names the guest kernel (the
/// Debian release, not only the host's kernel) and says its times are
/// TCG's; the answer labels the time and puts the counts first.
#[test]
fn a_linux_compare_names_its_guest_kernel_and_tcg_times() {
    let test = "a_linux_compare_names_its_guest_kernel_and_tcg_times";
    if !qemu_or_skip(test, "qemu-system-x86_64") {
        return;
    }
    let kernel = match ptiscope::preflight::linux::known_path("debian-amd64") {
        Some(Ok(p)) if p.is_file() => p,
        _ => {
            ptiscope::test_support::skip(
                test,
                "debian-amd64 is not fetched: run `ptiscope linux fetch` (apt-get download)",
            );
            return;
        }
    };
    let dir = scratch(test);
    let (json, svg) = (dir.join("c.json"), dir.join("c.svg"));
    let o = ptiscope()
        .args(["compare", "--backend", "qemu", "--no-plugin", "--linux"])
        .arg(&kernel)
        .args([
            "--workload",
            "getppid",
            "--iterations",
            "1000",
            "--runs",
            "2",
        ])
        .args(["--timeout", "120", "--quiet", "--json"])
        .arg(&json)
        .arg("--svg")
        .arg(&svg)
        .output()
        .unwrap();
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", stderr(&o));
    let v = read_json(&json);
    assert_eq!(v["time_basis"]["key"], "qemu_tcg", "{}", v["time_basis"]);
    let guest = v["environment"]["guest_kernel"].as_str().unwrap();
    assert!(guest.starts_with("Linux 6."), "{guest}");
    assert!(
        out.contains("time [TCG]")
            && out.contains("time here: QEMU TCG: every CR3 write flushes the soft TLB"),
        "{out}"
    );
    let answer = v["answer"].as_array().unwrap();
    assert!(
        answer.last().is_some_and(|a| !a["time_basis"].is_null()),
        "TCG time: the counts lead: {answer:?}"
    );
    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(
        picture.contains(&format!(
            "guest {guest}; times: QEMU TCG: every CR3 write flushes the soft TLB"
        )),
        "{picture}"
    );
    assert!(picture.contains(">host Linux "), "the host named too");
}

/// An output path that exists but whose directory takes no new files
/// (/proc) is refused naming what failed, before any run: not "No such
/// file or directory" of a file that exists.
#[test]
fn an_output_beside_which_no_file_can_be_made_says_so() {
    for args in [
        &["--json", "/proc/version"][..],
        &[
            "--backend",
            "qemu",
            "--linux",
            "debian-amd64",
            "--by-symbol",
            "--by-symbol-csv",
            "/proc/version",
        ],
    ] {
        let o = ptiscope().arg("compare").args(args).output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(73), "{args:?}: {err}");
        assert!(
            err.contains("/proc/version") && err.contains("takes no new files"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("No such file"), "{args:?}: {err}");
    }
}
