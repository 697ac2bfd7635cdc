#!/bin/bash
# Writes the result files the docs quote (docs/results/README.md): real
# runs, kept in the repository, so that each figure in the docs is quoted
# from one run and tests/doc_figures.rs can check it. After a change that
# moves a figure: run this, then `cargo test --test doc_figures` names
# every quote that no longer agrees.
cd "$(dirname "$0")/.."
set -e
P=${PTISCOPE:-target/debug/ptiscope}
out=docs/results
common=(--backend qemu --workload getppid --iterations 2000 --runs 2 --by-symbol --quiet)
$P compare "${common[@]}" --linux debian-amd64 --baseline pti=off --compare pti=on --json $out/linux-6.1-amd64-getppid.json > $out/linux-6.1-amd64-getppid.txt
$P compare "${common[@]}" --linux debian-686-pae --baseline pti=off,entry=sysenter --compare pti=on,entry=sysenter --json $out/linux-6.1-686-pae-getppid.json > $out/linux-6.1-686-pae-getppid.txt
$P compare "${common[@]}" --linux debian-6.12-amd64 --baseline pti=off --compare pti=on --json $out/linux-6.12-amd64-getppid.json > $out/linux-6.12-amd64-getppid.txt
$P compare "${common[@]}" --baseline linux=debian-amd64,pti=on --compare linux=debian-6.12-amd64,pti=on --json $out/linux-6.1-vs-6.12-amd64-getppid.json > $out/linux-6.1-vs-6.12-amd64-getppid.txt
$P compare "${common[@]}" --linux debian-686-pae --baseline pti=off,entry=int80 --compare pti=on,entry=int80 --json $out/linux-6.1-686-pae-int80-getppid.json > $out/linux-6.1-686-pae-int80-getppid.txt
# The CI gate's example (docs/ci-gate.md): pti=off against the kernel's own
# choice on Skylake-Client-v1, where Linux turns PTI on by itself.
GATE_JSON=$out/kernel-gate-skylake.json PTISCOPE=$P scripts/kernel-gate.sh "debian-amd64,append=pti=off" debian-amd64 5 > $out/kernel-gate-skylake.txt 2>&1 || [ $? = 1 ]
GATE_JSON=$out/kernel-gate-skylake-same.json PTISCOPE=$P scripts/kernel-gate.sh debian-amd64 debian-amd64 0 > $out/kernel-gate-skylake-same.txt 2>&1
GATE_BY_SYMBOL=0 GATE_JSON=$out/kernel-gate-skylake-686-pae.json PTISCOPE=$P scripts/kernel-gate.sh debian-686-pae debian-686-pae 0 > $out/kernel-gate-skylake-686-pae.txt 2>&1
