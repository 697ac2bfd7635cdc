//! `pti_global_text=on` on the x86_64 guest (Linux maps kernel text global
//! in the user copy on CPUs without PCID): the host's own walk of the
//! guest's page tables shows the user copy widened by the kernel text, and
//! by nothing else: read-only, executable, kernel-only, global pages, as
//! many as the guest says it mapped; the CR3 writes per call do not change.

mod common;

use common::*;

fn walk(extra: &str) -> (serde_json::Value, String) {
    let json = scratch("globaltext").join(format!("{}.json", extra.len()));
    let o = ptiscope()
        .args(["pagetables", "--pti", "on", "--cmdline", extra, "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let out = stdout(&o) + &stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let v = read_json(&json);
    (v, out)
}

#[test]
fn global_text_widens_the_user_copy_by_the_kernel_text_only() {
    if !kvm_or_skip("pti_global_text on x86_64") {
        return;
    }
    let (plain, _) = walk("");
    assert!(
        plain["isolation"]["outside_entry_area"]
            .as_array()
            .unwrap()
            .is_empty(),
        "without the option the user copy holds the entry area only: {plain}"
    );
    let (v, out) = walk("pti_global_text=on");
    let outside = v["isolation"]["outside_entry_area"].as_array().unwrap();
    assert!(!outside.is_empty(), "{out}");
    let mut bytes = 0;
    for m in outside {
        let a = &m["access"];
        assert_eq!(
            (&a["writable"], &a["user"], &a["no_execute"], &a["global"]),
            (
                &serde_json::json!(false),
                &serde_json::json!(false),
                &serde_json::json!(false),
                &serde_json::json!(true)
            ),
            "kernel text: read-only, kernel-only, executable, global: {m}"
        );
        bytes += m["size"].as_u64().unwrap();
    }
    // The guest's own account (its console), and the CR3 writes per call,
    // which are those of pti=on.
    let o = run_getpid("on", 200)
        .args(["--cmdline", "pti_global_text=on"])
        .output()
        .unwrap();
    let out = stdout(&o) + &stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let r = result_line(&out);
    assert_eq!(num(&r, "cr3_writes"), 402, "{r:?}");
    // As many pages as the guest says the user copy holds beyond the entry area.
    let pti = machine_line(&out, "@pti");
    let entry: u64 = v["entry_area"]["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r[1]["end"].as_u64().unwrap() - r[1]["start"].as_u64().unwrap())
        .sum();
    assert_eq!(pti["global_text"], "on", "{pti:?}");
    assert_eq!(
        num(&pti, "user_copy_kernel_pages") * 4096,
        entry + bytes,
        "{pti:?}"
    );
}
