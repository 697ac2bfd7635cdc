//! Reports: per-run summaries, compare tables (mmtests compare-kernels layout), JSON and CSV.
