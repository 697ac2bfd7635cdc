//! `reproduce --backend`: a forced backend is the one every cell names,
//! with no fallback (a cell it refuses shows the refusal), and
//! `--backend nested` refuses the Linux cells before anything boots.
//! The nested run itself is in tests/nested.rs.

mod common;

use common::*;

/// `--backend kvm`: every row says `kvm`; an i386 PAE cell this host's
/// KVM refuses (kvm_pvm: no 32-bit paging outside long mode) reports that
/// refusal in its row and the exit status, instead of running under QEMU.
#[test]
fn reproduce_backend_kvm_reports_a_refused_cell_instead_of_falling_back() {
    let test = "reproduce --backend kvm";
    let Some(dir) = kvm_scratch_or_skip(test, "reproduce-kvm") else {
        return;
    };
    let json = dir.join("r.json");
    let o = ptiscope()
        .args([
            "reproduce",
            "roedel-2018",
            "--backend",
            "kvm",
            "--no-linux",
            "--runs",
            "1",
            "--json",
        ])
        .arg(&json)
        .output()
        .unwrap();
    let (out, err) = (stdout(&o), stderr(&o));
    let v = read_json(&json);
    assert_eq!(v["backend"], "kvm", "{v}");
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 8, "{v}");
    let mut refused = 0;
    for r in rows {
        // Never a silent QEMU fallback: the row's backend is the forced one.
        assert_eq!(r["backend"], "kvm", "{r}\n{out}\n{err}");
        match r["error"].as_str() {
            Some(e) => {
                assert_eq!(r["guest"], "ptiscope guest (i386 PAE)", "{r}");
                assert!(e.contains("refuses 32-bit paging"), "{r}");
                assert!(r["here"].is_null(), "{r}");
                refused += 1;
            }
            None => assert!(r["here"].as_f64().unwrap() > 0.0, "{r}"),
        }
    }
    if refused > 0 {
        assert_eq!(refused, 4, "{v}");
        // 69: this host's KVM cannot run the guest.
        assert_eq!(o.status.code(), Some(69), "{out}\n{err}");
        assert!(out.contains("n/a: the embedded guest is a 32-bit"), "{out}");
    } else {
        // A KVM that runs 32-bit paging (hardware, nested): all measured.
        assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    }
}

/// `--backend nested` with nothing to measure: exit 64 before any boot,
/// the message naming why.
#[test]
fn reproduce_backend_nested_with_nothing_to_measure_is_refused_before_any_boot() {
    let start = std::time::Instant::now();
    let o = ptiscope()
        .args([
            "reproduce",
            "tarreau-2018",
            "--backend",
            "nested",
            "--no-linux",
            "--no-companion",
        ])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("--no-companion"), "{err}");
    assert!(!err.contains("booting"), "{err}");
    assert!(start.elapsed().as_secs() < 10, "{:?}", start.elapsed());
}
