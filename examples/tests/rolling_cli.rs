//! The `rolling` binary end to end: bad input gives a one-line error, a
//! non-zero exit and no output that looks complete; the tcp backend runs
//! the job in processes; and (the oracle test) its Parquet output on a
//! million generated rows matches DuckDB and Polars for every closed mode,
//! grouped and ungrouped; and (the fuzz test) random inputs and parameters
//! at the edges (ties, i64's ends, few rows, nulls, NaN, many ranks) match
//! them too.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail by panicking

use std::path::{Path, PathBuf};
use std::process::Command;

use braid_tests::{Scratch, output_within};

/// The longest one command of these tests may run (a job of a few
/// hundred thousand rows, or an oracle script, takes seconds; the fuzz
/// run several minutes on the 2-core VM): past it, the command is stopped
/// and its test fails with the command's output, not CI's time.
const LIMIT: std::time::Duration = std::time::Duration::from_secs(900);

fn rolling() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rolling"))
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs the binary; returns (exit ok, stdout, stderr).
fn run(args: &[&str]) -> (bool, String, String) {
    let out = output_within(rolling().args(args), LIMIT);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_clean_failure(args: &[&str], output: &Path, needle: &str) {
    let (ok, _, err) = run(args);
    assert!(!ok, "{args:?} should fail");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "{args:?}: expected a one-line error, got:\n{err}"
    );
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains(needle),
        "{args:?}: {err}"
    );
    assert!(
        !output.exists(),
        "{args:?}: left output behind at {}",
        output.display()
    );
    let mut staging = output.as_os_str().to_owned();
    staging.push(".braid-staging");
    assert!(
        !PathBuf::from(staging).exists(),
        "{args:?}: left a staging directory"
    );
}

#[test]
fn bad_input_is_a_clear_error_with_nothing_left_behind() {
    let scratch = Scratch::new("cli-bad");
    let d = scratch.path();
    // A valid input to start from: the job's own output on generated rows.
    let good = d.join("good.parquet");
    let (ok, _, err) = run(&[
        "--rows",
        "20000",
        "--ranks",
        "2",
        "--output",
        good.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let gs = good.to_str().unwrap();
    let out = d.join("out.parquet");
    let os = out.to_str().unwrap();
    assert_clean_failure(
        &["--input", gs, "--values", "nope", "--output", os],
        &out,
        "no column \"nope\"",
    );
    assert_clean_failure(
        &["--input", gs, "--order", "v", "--output", os],
        &out,
        "column \"v\" has type Float64",
    );
    assert_clean_failure(
        &["--input", gs, "--window", "-5", "--output", os],
        &out,
        "window must be >= 0",
    );
    // A zero window holds no row but with --closed both (then the rows of
    // equal ts: checked by the library's tests).
    assert_clean_failure(
        &["--input", gs, "--window", "0", "--output", os],
        &out,
        "with --closed right it holds no rows",
    );
    assert_clean_failure(
        &[
            "--input", gs, "--window", "0i", "--closed", "left", "--output", os,
        ],
        &out,
        "with --closed left it holds no rows",
    );
    assert_clean_failure(
        &["--input", gs, "--window", "5m", "--output", os],
        &out,
        "durations need a timestamp",
    );
    // A header that names a column twice: which one is meant is unclear.
    let twice = d.join("twice.csv");
    std::fs::write(&twice, "ts,ts,v\n1,2,3.5\n").unwrap();
    assert_clean_failure(
        &["--input", twice.to_str().unwrap(), "--output", os],
        &out,
        "2 input columns are named \"ts\"",
    );
    let missing = d.join("missing.parquet");
    assert_clean_failure(
        &["--input", missing.to_str().unwrap(), "--output", os],
        &out,
        "missing.parquet",
    );
    let bytes = std::fs::read(&good).unwrap();
    let truncated = d.join("truncated.parquet");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    assert_clean_failure(
        &["--input", truncated.to_str().unwrap(), "--output", os],
        &out,
        "truncated.parquet",
    );
    // Output under a regular file: not writable.
    let blocker = d.join("file");
    std::fs::write(&blocker, b"x").unwrap();
    let under = blocker.join("out.parquet");
    assert_clean_failure(
        &[
            "--input",
            gs,
            "--aggs",
            "var",
            "--output",
            under.to_str().unwrap(),
        ],
        &under,
        "not writable",
    );
    // The GPU path: a string value column is refused before any work
    // (string columns may ride along, not be aggregated); without the
    // `cuda` feature, a clear error up front.
    let csv_s = d.join("strings.csv");
    std::fs::write(&csv_s, "ts,v,name\n1,1.0,a\n2,2.0,b\n").unwrap();
    assert_clean_failure(
        &[
            "--input",
            csv_s.to_str().unwrap(),
            "--values",
            "name",
            "--device",
            "gpu",
            "--output",
            os,
        ],
        &out,
        "numeric type",
    );
    if !cfg!(feature = "cuda") {
        assert_clean_failure(
            &[
                "--input",
                csv_s.to_str().unwrap(),
                "--device",
                "gpu",
                "--output",
                os,
            ],
            &out,
            "needs a build with the `cuda` feature",
        );
    }
    // Each output column once.
    assert_clean_failure(
        &["--input", gs, "--aggs", "sum,sum", "--output", os],
        &out,
        "aggregation sum is given twice",
    );
    assert_clean_failure(
        &["--input", gs, "--values", "v,v", "--output", os],
        &out,
        "value column \"v\" is given twice",
    );
    // An input column with an output column's name.
    let clash = d.join("clash.csv");
    std::fs::write(&clash, "ts,v,v_max\n1,1.0,2\n").unwrap();
    assert_clean_failure(
        &[
            "--input",
            clash.to_str().unwrap(),
            "--aggs",
            "sum,max",
            "--output",
            os,
        ],
        &out,
        "input already has a column named \"v_max\", the name the output gives the max of value column \"v\"",
    );
    assert_clean_failure(
        &[
            "--input",
            csv_s.to_str().unwrap(),
            "--chunk-rows",
            "100000000000",
            "--output",
            os,
        ],
        &out,
        "chunk rows must be",
    );
    assert_clean_failure(
        &["--input", gs, "--ranks", "100000", "--output", os],
        &out,
        "one host runs",
    );
    // CSV files of one table are read by position: headers that differ
    // (here the same columns in another order) are an error, not swapped
    // data.
    let csv_dir = d.join("csvdir");
    std::fs::create_dir(&csv_dir).unwrap();
    std::fs::write(csv_dir.join("a.csv"), "ts,v\n1,1\n2,2\n").unwrap();
    std::fs::write(csv_dir.join("b.csv"), "v,ts\n3,5\n4,6\n").unwrap();
    assert_clean_failure(
        &["--input", csv_dir.to_str().unwrap(), "--output", os],
        &out,
        "differs from the first file's",
    );
    // The output must not overwrite the input (it would destroy the data
    // it is computed from) nor land inside an input directory; the input
    // is left as it was.
    let (ok, _, err) = run(&["--input", gs, "--output", gs]);
    assert!(!ok && err.contains("is the input"), "{err}");
    assert_eq!(
        std::fs::read(&good).unwrap(),
        bytes,
        "the input was touched"
    );
    let inside = csv_dir.join("out");
    assert_clean_failure(
        &[
            "--input",
            csv_dir.to_str().unwrap(),
            "--output",
            inside.to_str().unwrap(),
        ],
        &inside,
        "lies inside the input directory",
    );
    // Nor the other way round: a directory output replaces its part
    // files when the job commits, which would delete (or overwrite) an
    // input file among them and its siblings.
    let holder = d.join("holder");
    std::fs::create_dir(&holder).unwrap();
    let (part0, part1) = (holder.join("part-00000.csv"), holder.join("part-00001.csv"));
    std::fs::write(&part0, "ts,v\n1,1.0\n2,2.0\n").unwrap();
    std::fs::write(&part1, "ts,v\n3,3.0\n").unwrap();
    let (ok, _, err) = run(&[
        "--input",
        part1.to_str().unwrap(),
        "--output",
        holder.to_str().unwrap(),
    ]);
    assert!(!ok && err.contains("lies inside the output"), "{err}");
    let mut left: Vec<_> = std::fs::read_dir(&holder)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["part-00000.csv", "part-00001.csv"],
        "the holder changed"
    );
    assert_eq!(std::fs::read(&part1).unwrap(), b"ts,v\n3,3.0\n");
    // A one-file output that is an existing directory is refused before
    // anything is staged beside it.
    let plain = d.join("plain.csv");
    std::fs::write(&plain, "ts,v\n1,1.0\n2,2.0\n").unwrap();
    for name in ["taken.parquet", "taken.csv"] {
        let taken = d.join(name);
        std::fs::create_dir(&taken).unwrap();
        let (ok, _, err) = run(&[
            "--input",
            plain.to_str().unwrap(),
            "--output",
            taken.to_str().unwrap(),
        ]);
        assert!(!ok && err.contains("output file is a directory"), "{err}");
        let mut staging = taken.as_os_str().to_owned();
        staging.push(".braid-staging");
        assert!(!PathBuf::from(staging).exists(), "{name}: staging left");
        assert_eq!(std::fs::read_dir(&taken).unwrap().count(), 0);
    }
    // A directory output the job created is gone after a failure too.
    let dir_out = d.join("dir-out");
    let (ok, _, err) = run(&["--device", "tpu", "--output", os]);
    assert!(!ok && err.contains("unknown device \"tpu\""), "{err}");
    assert!(!out.exists());
    // A CSV with nulls in the order column fails during the job; its
    // staged output is removed.
    let csv = d.join("nulls.csv");
    std::fs::write(&csv, "ts,v\n1,1.0\n,2.0\n3,3.0\n").unwrap();
    assert_clean_failure(
        &[
            "--input",
            csv.to_str().unwrap(),
            "--ranks",
            "2",
            "--output",
            os,
        ],
        &out,
        "null",
    );
    // A value past the rows the CSV's types were inferred from that does
    // not fit its column: the error names the file's line and the column.
    let late = d.join("late.csv");
    let mut text = String::from("id,ts,v\n");
    for i in 0..10_005 {
        text.push_str(&format!("{i},{i},{i}\n"));
    }
    text.push_str("20000,20000,2.5\n");
    std::fs::write(&late, text).unwrap();
    assert_clean_failure(
        &["--input", late.to_str().unwrap(), "--output", os],
        &out,
        "line 10007: value '2.5' of column \"v\" is not Int64",
    );
    // The same with 100 quoted fields over two lines each before it: the
    // line is the file's (it was the record's number, 100 short).
    let quoted = d.join("quoted.csv");
    let mut text = String::from("id,ts,v,note\n");
    for i in 0..10_005 {
        let note = if i < 100 { "\"a\nb\"" } else { "c" };
        text.push_str(&format!("{i},{i},{i},{note}\n"));
    }
    text.push_str("20000,20000,2.5,c\n");
    std::fs::write(&quoted, text).unwrap();
    assert_clean_failure(
        &["--input", quoted.to_str().unwrap(), "--output", os],
        &out,
        "line 10107: value '2.5' of column \"v\" is not Int64",
    );
    // A directory that mixes formats, or holds data in a subdirectory,
    // is refused (its other files were skipped without a word).
    let mixed = d.join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    std::fs::write(mixed.join("a.csv"), "ts,v\n1,1\n").unwrap();
    std::fs::copy(&late, mixed.join("b.CSV")).unwrap();
    let sub = mixed.join("part=2");
    std::fs::create_dir(&sub).unwrap();
    std::fs::write(sub.join("c.csv"), "ts,v\n3,3\n").unwrap();
    assert_clean_failure(
        &["--input", mixed.to_str().unwrap(), "--output", os],
        &out,
        "lies in a subdirectory",
    );
    std::fs::remove_dir_all(&sub).unwrap();
    std::fs::write(mixed.join("d.parquet"), "not parquet").unwrap();
    assert_clean_failure(
        &["--input", mixed.to_str().unwrap(), "--output", os],
        &out,
        "holds both",
    );
    // One rank: nothing syncs its sink with the failing node, yet the
    // failure must still leave nothing behind (it used to commit an empty
    // output now and then).
    for _ in 0..5 {
        for target in [&out, &dir_out] {
            assert_clean_failure(
                &[
                    "--input",
                    csv.to_str().unwrap(),
                    "--ranks",
                    "1",
                    "--output",
                    target.to_str().unwrap(),
                ],
                target,
                "null",
            );
        }
    }
    // The missing parents the job made for its output go as well.
    for (top, target) in [
        ("new-a", d.join("new-a/deep/out.parquet")),
        ("new-b", d.join("new-b/deep/dir")),
    ] {
        assert_clean_failure(
            &[
                "--input",
                csv.to_str().unwrap(),
                "--ranks",
                "2",
                "--output",
                target.to_str().unwrap(),
            ],
            &target,
            "null",
        );
        assert!(!d.join(top).exists(), "{top} left behind");
    }
}

#[test]
fn csv_output_keeps_its_header_and_quoted_line_breaks() {
    let scratch = Scratch::new("cli-csv");
    let d = scratch.path();
    let input = d.join("in.csv");
    // One row: with 2 ranks, rank 0's part is empty. The key holds a
    // blank line inside quotes.
    std::fs::write(&input, "ts,key,v\n1,\"a\n\nb\",1.5\n").unwrap();
    // The last case: extensions in any letter case (DATA.CSV in, OUT.CSV out).
    let upper = d.join("DATA.CSV");
    std::fs::copy(&input, &upper).unwrap();
    let cases = [
        (&input, "1", d.join("out-1.csv")),
        (&input, "2", d.join("out-2.csv")),
        (&input, "3", d.join("out-3.csv")),
        (&upper, "2", d.join("OUT.CSV")),
    ];
    for (input, ranks, out) in cases {
        let (ok, _, err) = run(&[
            "--input",
            input.to_str().unwrap(),
            "--aggs",
            "count,sum",
            "--window",
            "10",
            "--ranks",
            ranks,
            "--output",
            out.to_str().unwrap(),
        ]);
        assert!(ok, "{}: {err}", input.display());
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "ts,key,v,v_count,v_sum\n1,\"a\n\nb\",1.5,1,1.5\n",
            "{} on {ranks} ranks, to {}",
            input.display(),
            out.display()
        );
    }
}

/// Column names holding a comma or a backslash (CSV headers such as
/// "price, USD") are named with `\,` and `\\` in `--values` and `--by`;
/// the result matches a brute-force rolling sum and count, on 1-3 ranks.
#[test]
fn column_names_with_commas_are_named_escaped() {
    let scratch = Scratch::new("cli-comma-names");
    let d = scratch.path();
    let input = d.join("in.csv");
    let groups = ["a", "b, c", "d"];
    // (group, ts, value): distinct ts within a group, values in halves
    // (sums exact), rows written out of order.
    let mut rows: Vec<(usize, i64, f64)> = (0..60i64)
        .map(|i| {
            (
                (i * 7 % 3) as usize,
                i * 5 % 61,
                ((i * 13) % 17) as f64 / 2.0,
            )
        })
        .collect();
    let mut text = String::from("ts,\"price, USD\",g\\x\n");
    for (g, ts, v) in &rows {
        text.push_str(&format!("{ts},{v:?},\"{}\"\n", groups[*g]));
    }
    std::fs::write(&input, text).unwrap();
    // Brute force: window 10, closed right (ts - 10, ts], within a group.
    rows.sort_by_key(|r| (r.0, r.1));
    let mut want = String::from("ts,\"price, USD\",g\\x,\"price, USD_sum\",\"price, USD_count\"\n");
    for (g, ts, v) in &rows {
        let inside = rows
            .iter()
            .filter(|(g2, t2, _)| g2 == g && *t2 > ts - 10 && t2 <= ts);
        let (sum, n) = inside.fold((0.0, 0), |(s, n), r| (s + r.2, n + 1));
        let name = groups[*g];
        let name = if name.contains(',') {
            format!("\"{name}\"")
        } else {
            name.to_string()
        };
        want.push_str(&format!("{ts},{v:?},{name},{sum:?},{n}\n"));
    }
    for ranks in ["1", "2", "3"] {
        let out = d.join(format!("out-{ranks}.csv"));
        let (ok, _, err) = run(&[
            "--input",
            input.to_str().unwrap(),
            "--values",
            "price\\, USD",
            "--by",
            "g\\\\x",
            "--aggs",
            "sum,count",
            "--window",
            "10",
            "--ranks",
            ranks,
            "--output",
            out.to_str().unwrap(),
        ]);
        assert!(ok, "{ranks} ranks: {err}");
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            want,
            "{ranks} ranks"
        );
    }
    // Unescaped, the comma splits the name, and the error says how to
    // write it.
    let (ok, _, err) = run(&["--input", input.to_str().unwrap(), "--values", "price, USD"]);
    assert!(
        !ok && err.contains("no column \"price\"") && err.contains("\\,"),
        "{err}"
    );
}

#[test]
fn header_only_csv_gives_an_empty_result() {
    let scratch = Scratch::new("cli-empty-csv");
    let d = scratch.path();
    let input = d.join("in.csv");
    // Nothing to infer types from: the columns read as integers.
    std::fs::write(&input, "id,ts,key,v\n").unwrap();
    for (ranks, by) in [("1", None), ("3", Some("key")), ("5", None)] {
        let out = d.join(format!("out-{ranks}.csv"));
        let mut args = vec![
            "--input",
            input.to_str().unwrap(),
            "--aggs",
            "count,sum,std",
            "--ranks",
            ranks,
            "--output",
            out.to_str().unwrap(),
        ];
        if let Some(by) = by {
            args.extend(["--by", by]);
        }
        let (ok, stdout, err) = run(&args);
        assert!(ok, "{ranks} ranks: {err}");
        assert!(stdout.contains("0 rows"), "{ranks} ranks: {stdout}");
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "id,ts,key,v,v_count,v_sum,v_std\n",
            "{ranks} ranks"
        );
    }
}

/// CSV columns read as DuckDB and Polars read them: integers past i64's
/// range keep their digits (ids that differ only past a float's 17 digits
/// stay two groups), a column whose values only look like dates (a zero
/// date, February 30th) is text and does not fail a job that carries it,
/// on 1 and 3 ranks.
#[test]
fn csv_wide_integers_and_date_like_text_keep_their_values() {
    let scratch = Scratch::new("cli-csv-wide");
    let d = scratch.path();
    let input = d.join("in.csv");
    std::fs::write(
        &input,
        "ts,v,id,note\n\
         1,1.5,12345678901234567891,2024-01-05\n\
         2,2.5,12345678901234567892,0000-00-00\n\
         3,4.0,12345678901234567891,2024-02-30\n",
    )
    .unwrap();
    for ranks in ["1", "3"] {
        let out = d.join(format!("out-{ranks}.csv"));
        let (ok, _, err) = run(&[
            "--input",
            input.to_str().unwrap(),
            "--by",
            "id",
            "--window",
            "5",
            "--aggs",
            "sum,count",
            "--ranks",
            ranks,
            "--output",
            out.to_str().unwrap(),
        ]);
        assert!(ok, "{ranks} ranks: {err}");
        let text = std::fs::read_to_string(&out).unwrap();
        let mut lines: Vec<&str> = text.lines().collect();
        lines[1..].sort_unstable();
        assert_eq!(
            lines,
            [
                "ts,v,id,note,v_sum,v_count",
                "1,1.5,12345678901234567891,2024-01-05,1.5,1",
                "2,2.5,12345678901234567892,0000-00-00,2.5,1",
                "3,4.0,12345678901234567891,2024-02-30,5.5,2",
            ],
            "{ranks} ranks"
        );
    }
}

/// A directory of CSV files reads as the one file they split: with at least
/// as many files as ranks each rank reads whole files, with fewer every
/// rank takes every n-th batch of each. (Exact aggregations only: sums
/// may differ in the last bit with the order of equal order values.)
#[test]
fn csv_directory_reads_as_one_file() {
    let scratch = Scratch::new("cli-csv-dir");
    let d = scratch.path();
    let dir = d.join("parts");
    std::fs::create_dir(&dir).unwrap();
    let mut all = String::from("id,ts,key,v\n");
    let mut parts = vec![String::from("id,ts,key,v\n"); 3];
    let mut x = 12345u64;
    for i in 0..9000u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let line = format!(
            "{i},{},{},{}\n",
            (x >> 20) % 50_000,
            (x >> 8) % 7,
            (x >> 40) % 1000
        );
        all.push_str(&line);
        parts[(i % 3) as usize].push_str(&line);
    }
    let gzip = |text: &str| {
        use std::io::Write;
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(text.as_bytes()).unwrap();
        z.finish().unwrap()
    };
    std::fs::write(d.join("all.csv"), &all).unwrap();
    std::fs::write(d.join("all.csv.gz"), gzip(&all)).unwrap();
    // One part gzip-compressed; beside the parts, files that are not data
    // (Spark's marker and checksums) and an empty CSV file, all skipped.
    for (j, p) in parts.iter().enumerate() {
        match j {
            1 => std::fs::write(dir.join(format!("p{j}.csv.gz")), gzip(p)).unwrap(),
            _ => std::fs::write(dir.join(format!("p{j}.csv")), p).unwrap(),
        }
    }
    std::fs::write(dir.join("_SUCCESS"), "").unwrap();
    std::fs::write(dir.join(".p0.csv.crc"), "crc").unwrap();
    std::fs::write(dir.join("e.csv"), "").unwrap();
    let sorted_output = |input: &Path, ranks: &str, name: &str| {
        let out = d.join(name);
        let (ok, _, err) = run(&[
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--ranks",
            ranks,
            "--by",
            "key",
            "--window",
            "300",
            "--chunk-rows",
            "500",
            "--aggs",
            "count,min,max",
        ]);
        assert!(ok, "{name}: {err}");
        let mut lines: Vec<String> = std::fs::read_to_string(&out)
            .unwrap()
            .lines()
            .map(String::from)
            .collect();
        lines.sort();
        lines
    };
    let want = sorted_output(&d.join("all.csv"), "1", "want.csv");
    assert_eq!(want.len(), 9001);
    for ranks in ["2", "3", "5"] {
        let got = sorted_output(&dir, ranks, &format!("got-{ranks}.csv"));
        assert!(got == want, "{ranks} ranks: the directory's output differs");
    }
    let got = sorted_output(&d.join("all.csv.gz"), "3", "got-gz.csv");
    assert!(got == want, "the .csv.gz file's output differs");
    // Semicolons, tabs (a .tsv file) and pipes between the fields, found
    // from the header as DuckDB's sniffer finds them (the header read as
    // one column: "input has no column \"ts\"").
    for (name, sep) in [("semi.csv", ";"), ("all.tsv", "\t"), ("pipe.csv", "|")] {
        std::fs::write(d.join(name), all.replace(',', sep)).unwrap();
        let got = sorted_output(&d.join(name), "2", &format!("got-{name}.csv"));
        assert!(got == want, "{name}: the output differs");
    }
    // A file of neither format is refused, not skipped (its rows would be
    // missing without a word), and so is an output named like a
    // compressed CSV (it became a directory of Parquet parts).
    std::fs::write(dir.join("p3.csv.zst"), "x").unwrap();
    let out = d.join("refused.csv");
    let args = [
        "--input",
        dir.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ];
    assert_clean_failure(&args, &out, "p3.csv.zst is neither a CSV file");
    let (plain, out) = (d.join("all.csv"), d.join("out.csv.gz"));
    let args = [
        "--input",
        plain.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ];
    assert_clean_failure(&args, &out, "not a .gz file");
}

/// CSV dates and timestamps keep every digit: a column of whole seconds
/// in the rows its type is inferred from keeps a later row's fraction (it
/// was truncated to the second), files of one directory that differ in
/// precision read as one timestamp column (it became text), minutes
/// without seconds are timestamps, day-first and year-first dates read as
/// DuckDB and Polars read them, and a date column with a later time of
/// day fails naming the line (it kept the day alone).
#[test]
fn csv_dates_and_timestamps_keep_every_digit() {
    let scratch = Scratch::new("cli-csv-time");
    let d = scratch.path();
    // 10,000 rows 5 s apart (value 1), then three with fractions.
    let mut csv = String::from("id,ts,v\n");
    for i in 0..10_000u64 {
        let t = i * 5;
        csv.push_str(&format!(
            "{i},2024-01-01 {:02}:{:02}:{:02},1\n",
            t / 3600,
            t / 60 % 60,
            t % 60
        ));
    }
    for (id, t, v) in [
        (10_000, "2024-01-01 14:00:00.6", 10),
        (10_001, "2024-01-01 14:00:01.5", 20),
        (10_002, "2024-01-01 14:00:01.9", 40),
    ] {
        csv.push_str(&format!("{id},{t},{v}\n"));
    }
    let input = d.join("late.csv");
    std::fs::write(&input, csv).unwrap();
    let job = |input: &Path, name: &str, window: &str| {
        let out = d.join(name);
        let (ok, _, err) = run(&[
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--ranks",
            "2",
            "--window",
            window,
            "--aggs",
            "sum,count",
        ]);
        assert!(ok, "{name}: {err}");
        // (ts, v_sum, v_count) of each row, in id order.
        let text = std::fs::read_to_string(&out).unwrap();
        let mut rows: Vec<(u64, String, String, String)> = text
            .lines()
            .skip(1)
            .map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (f[0].parse().unwrap(), f[1].into(), f[3].into(), f[4].into())
            })
            .collect();
        rows.sort();
        rows.into_iter()
            .map(|(_, ts, sum, count)| (ts, sum, count))
            .collect::<Vec<_>>()
    };
    let own = |r: &[(&str, &str, &str)]| -> Vec<(String, String, String)> {
        r.iter()
            .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
            .collect()
    };
    let rows = job(&input, "late-out.csv", "1s");
    assert_eq!(rows.len(), 10_003);
    // Windows (t - 1 s, t]: the late rows' own sums, then two each.
    assert_eq!(
        rows[9_999..],
        own(&[
            ("2024-01-01T13:53:15", "1.0", "1"),
            ("2024-01-01T14:00:00.600", "10.0", "1"),
            ("2024-01-01T14:00:01.500", "30.0", "2"),
            ("2024-01-01T14:00:01.900", "60.0", "2"),
        ])
    );

    // A directory whose files differ in precision; minutes alone.
    let dir = d.join("parts");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("a.csv"), "id,ts,v\n1,2024-06-01 09:47,1\n").unwrap();
    std::fs::write(
        dir.join("b.csv"),
        "id,ts,v\n2,2024-06-01 09:47:00.250,2\n3,2024-06-01T09:48:00.250123Z,4\n",
    )
    .unwrap();
    // (A value with `Z` puts the column in UTC, as DuckDB and Polars
    // read it: the CSV output writes the zone.)
    assert_eq!(
        job(&dir, "dir-out.csv", "1m"),
        own(&[
            ("2024-06-01T09:47:00Z", "1.0", "1"),
            ("2024-06-01T09:47:00.250Z", "3.0", "2"),
            ("2024-06-01T09:48:00.250123Z", "4.0", "1"),
        ])
    );

    // Day-first and year-first dates, as DuckDB and Polars read them
    // (`03/11/2024` is the 3rd of November), with offsets read as UTC.
    let dmy = d.join("day-first.csv");
    std::fs::write(
        &dmy,
        "id,ts,v\n1,03/11/2024 10:00:00,1\n2,3.11.2024 10:30,2\n\
         3,2024/11/03 11:15:00+01:00,4\n4,04-11-2024 09:59:59,8\n5,2024.11.4 10:00:00Z,16\n",
    )
    .unwrap();
    assert_eq!(
        job(&dmy, "day-first-out.csv", "1h"),
        own(&[
            ("2024-11-03T10:00:00Z", "1.0", "1"),
            ("2024-11-03T10:30:00Z", "7.0", "3"),
            ("2024-11-03T10:15:00Z", "5.0", "2"),
            ("2024-11-04T09:59:59Z", "8.0", "1"),
            ("2024-11-04T10:00:00Z", "24.0", "2"),
        ])
    );

    // A date column whose line 10,002 has a time of day.
    let mut csv = String::from("ts,v\n");
    for i in 0..10_000u64 {
        csv.push_str(&format!("2024-01-{:02},{i}\n", 1 + i % 28));
    }
    csv.push_str("2024-02-01 23:00:00,1\n");
    let input = d.join("dates.csv");
    std::fs::write(&input, csv).unwrap();
    let out = d.join("dates-out.csv");
    assert_clean_failure(
        &[
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--window",
            "2",
        ],
        &out,
        "line 10002: value '2024-02-01 23:00:00' of column \"ts\" is not a date",
    );
}

fn have_oracle() -> bool {
    Command::new("python3")
        .args(["-c", "import duckdb, polars, pyarrow"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Whether the oracle can run. Without it a test fails unless the user
/// chose to skip the oracle tests (`BRAID_SKIP_ORACLE=1`): a missing
/// python package must not turn them silently green.
fn oracle_or_skip(what: &str) -> bool {
    if have_oracle() {
        return true;
    }
    assert!(
        std::env::var_os("BRAID_SKIP_ORACLE").is_some(),
        "the {what} needs python3 with duckdb, polars and pyarrow (pip install duckdb polars pyarrow), \
         or BRAID_SKIP_ORACLE=1 to skip it"
    );
    false
}

fn check(input: &Path, output: &Path, extra: &[&str], engines: &str) {
    let oracle = repo().join("tests/oracle/check_rolling.py");
    let mut args: Vec<String> = vec![
        oracle.to_str().unwrap().into(),
        "--input".into(),
        input.to_str().unwrap().into(),
        "--output".into(),
        output.to_str().unwrap().into(),
        "--engines".into(),
        engines.into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let out = output_within(Command::new("python3").args(&args), LIMIT);
    assert!(
        out.status.success(),
        "oracle disagrees ({extra:?}):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn oracle_duckdb_and_polars_agree_with_the_job() {
    if !oracle_or_skip("oracle test") {
        return;
    }
    let scratch = Scratch::new("cli-oracle");
    let d = scratch.path();
    let input = d.join("in.parquet");
    let generator = repo().join("tests/oracle/gen_input.py");
    let st = Command::new("python3")
        .args([generator.to_str().unwrap(), input.to_str().unwrap()])
        .args([
            "--rows", "1000000", "--keys", "100", "--span", "10000000", "--seed", "7",
        ])
        .status()
        .unwrap();
    assert!(st.success());
    let aggs = "sum,mean,min,max,count,std,var";
    for closed in ["right", "both", "left", "none"] {
        for grouped in [false, true] {
            let out = d.join(format!("out-{closed}-{grouped}"));
            let mut args = vec![
                "--input",
                input.to_str().unwrap(),
                "--output",
                out.to_str().unwrap(),
                "--values",
                "v,w",
                "--window",
                "1000",
                "--closed",
                closed,
                "--aggs",
                aggs,
                "--ranks",
                "3",
            ];
            if grouped {
                args.extend(["--by", "key"]);
            }
            // One configuration per mode runs over tcp processes.
            if closed == "left" {
                args.extend(["--backend", "tcp"]);
            }
            // One runs under a memory limit far below its input: it must
            // spill and still match the oracles.
            let limited = closed == "right" && grouped;
            if limited {
                args.extend(["--memory-limit", "8MiB"]);
            }
            let (ok, stdout, err) = run(&args);
            assert!(ok, "{args:?}: {err}");
            if limited {
                let spilled: u64 = stdout
                    .lines()
                    .filter_map(|l| l.trim().strip_prefix("spilled bytes: "))
                    .filter_map(|v| v.trim().parse::<u64>().ok())
                    .sum();
                assert!(
                    spilled > 0,
                    "nothing spilled under --memory-limit 8MiB:\n{stdout}"
                );
            }
            let mut extra = vec![
                "--order", "ts", "--values", "v,w", "--window", "1000", "--closed", closed,
                "--aggs", aggs,
            ];
            if grouped {
                extra.extend(["--by", "key"]);
            }
            check(&input, &out, &extra, "duckdb,polars");
            // Checked: its ~70 MB need not wait for the other seven.
            let _ = std::fs::remove_dir_all(&out);
        }
    }
}

/// Calendar windows against DuckDB (each row's own `ts - INTERVAL`) and
/// Polars (where its window start never moves back, which the checker
/// tests and otherwise skips): timestamps crowded onto the last days of
/// months at every hour, and the same rows as dates, grouped and not.
#[test]
fn calendar_windows_agree_with_the_oracle() {
    if !oracle_or_skip("calendar oracle test") {
        return;
    }
    let scratch = Scratch::new("cli-calendar");
    let d = scratch.path();
    let gen_input = r#"
import calendar, datetime as dt, random, sys
import polars as pl
r = random.Random(3)
rows = []
for i in range(20000):
    y = r.choice([2023, 2024])
    m = r.randrange(1, 13)
    last = calendar.monthrange(y, m)[1]
    day = r.randrange(last - 4, last + 1) if r.random() < 0.6 else r.randrange(1, last + 1)
    t = dt.datetime(y, m, day, r.randrange(24), r.randrange(60), r.randrange(60), r.randrange(1000) * 1000)
    rows.append((i, t, r.randrange(7) if r.random() < 0.9 else None,
                 None if r.random() < 0.1 else r.uniform(-1e3, 1e3)))
df = pl.DataFrame(rows, schema=["id", "ts", "key", "v"], orient="row")
df.with_columns(pl.col("ts").cast(pl.Datetime("ms"))).write_parquet(sys.argv[1])
df.with_columns(pl.col("ts").dt.date()).write_parquet(sys.argv[2])
"#;
    let (ts_in, date_in) = (d.join("ts.parquet"), d.join("date.parquet"));
    let st = Command::new("python3")
        .args(["-c", gen_input])
        .args([&ts_in, &date_in])
        .status()
        .unwrap();
    assert!(st.success());
    let cases = [
        (&ts_in, "1mo", "right", false, "local"),
        (&ts_in, "1mo15d", "both", true, "tcp"),
        (&ts_in, "1q", "none", false, "local"),
        (&ts_in, "1mo12h", "left", true, "local"),
        (&date_in, "1mo", "right", true, "local"),
        (&date_in, "1y", "both", false, "tcp"),
    ];
    period_cases_agree(d, &cases);
}

/// Days, weeks and months on a zone's local clock (`1d` back over a
/// daylight-saving change is 23 or 25 hours) against Polars' rolling and
/// DuckDB over each row's edge from Polars' `offset_by`: timestamps at
/// whole and half hours around the changes of New York and Berlin, so
/// steps land in gaps and on repeated hours; grouped and not, local and
/// tcp, every closed mode.
#[test]
fn local_clock_windows_agree_with_the_oracle() {
    if !oracle_or_skip("local-clock oracle test") {
        return;
    }
    let scratch = Scratch::new("cli-local-clock");
    let d = scratch.path();
    let gen_input = r#"
import datetime as dt, random, sys
import polars as pl
r = random.Random(5)
changes = [dt.datetime(2024, 3, 10, 7), dt.datetime(2024, 11, 3, 6), dt.datetime(2024, 3, 31, 1),
           dt.datetime(2024, 10, 27, 1), dt.datetime(2024, 4, 10, 6)]
rows = []
for i in range(20000):
    c = r.choice(changes)
    t = c + dt.timedelta(minutes=30 * r.randrange(-200, 200), microseconds=r.choice([0, 0, 1, 999]) * 1000)
    rows.append((i, t, r.randrange(7) if r.random() < 0.9 else None,
                 None if r.random() < 0.1 else r.uniform(-1e3, 1e3)))
df = pl.DataFrame(rows, schema=["id", "ts", "key", "v"], orient="row")
ts = pl.col("ts").cast(pl.Datetime("ms")).dt.replace_time_zone("UTC")
df.with_columns(ts.dt.convert_time_zone("America/New_York")).write_parquet(sys.argv[1])
df.with_columns(ts.dt.convert_time_zone("Europe/Berlin")).write_parquet(sys.argv[2])
"#;
    let (ny, berlin) = (d.join("ny.parquet"), d.join("berlin.parquet"));
    let st = Command::new("python3")
        .args(["-c", gen_input])
        .args([&ny, &berlin])
        .status()
        .unwrap();
    assert!(st.success());
    let cases = [
        (&ny, "1d", "right", false, "local"),
        (&ny, "1w1d", "both", true, "tcp"),
        (&ny, "1mo", "left", true, "local"),
        (&ny, "1d12h", "none", false, "local"),
        (&berlin, "2d", "right", true, "local"),
        (&berlin, "1mo1d", "both", false, "tcp"),
    ];
    period_cases_agree(d, &cases);
}

/// Runs `rolling --window PERIOD` on 4 ranks for each (input, period,
/// closed, grouped, backend) and checks the output with DuckDB and Polars
/// (`--period`).
fn period_cases_agree(d: &Path, cases: &[(&PathBuf, &str, &str, bool, &str)]) {
    let aggs = "sum,mean,min,max,count,std,var";
    for &(input, period, closed, grouped, backend) in cases {
        let out = d.join(format!("out-{period}-{closed}"));
        let mut args = vec![
            "--input",
            input.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--window",
            period,
            "--closed",
            closed,
            "--aggs",
            aggs,
            "--ranks",
            "4",
            "--backend",
            backend,
            "--chunk-rows",
            "1000",
        ];
        let mut extra = vec![
            "--order", "ts", "--values", "v", "--period", period, "--closed", closed, "--aggs",
            aggs,
        ];
        if grouped {
            args.extend(["--by", "key"]);
            extra.extend(["--by", "key"]);
        }
        let (ok, _, err) = run(&args);
        assert!(ok, "{args:?}: {err}");
        check(input, &out, &extra, "duckdb,polars");
    }
}

/// `tests/oracle/fuzz.py`: random inputs and parameters (order values near
/// i64's ends, all ties, 0-2 rows, more ranks than rows, string and null
/// keys, NaN and infinities, integer value columns, duration windows, tiny
/// chunks, spilling) against DuckDB and Polars. A fixed seed keeps CI
/// repeatable; `BRAID_FUZZ_SEED` and `BRAID_FUZZ_CASES` explore further.
#[test]
fn random_cases_agree_with_the_oracle() {
    if !oracle_or_skip("fuzz test") {
        return;
    }
    let scratch = Scratch::new("cli-fuzz");
    let seed = std::env::var("BRAID_FUZZ_SEED").unwrap_or_else(|_| "11".into());
    let cases = std::env::var("BRAID_FUZZ_CASES").unwrap_or_else(|_| "40".into());
    let out = output_within(
        Command::new("python3")
            .arg(repo().join("tests/oracle/fuzz.py"))
            .args(["--rolling", env!("CARGO_BIN_EXE_rolling")])
            .args(["--cases", &cases, "--seed", &seed])
            .arg("--out")
            .arg(scratch.path()),
        2 * LIMIT,
    );
    assert!(
        out.status.success(),
        "fuzz seed {seed}: some cases disagree with the oracle:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A plain integer window on a timestamp column counts the column's units
/// (the default 1000 on `timestamp[us]` is a millisecond): the job says so
/// once on stderr, in-process or in tcp processes, and says nothing for a
/// duration or an integer order column.
#[test]
fn a_plain_integer_window_on_timestamps_is_named_once() {
    let note = "counts its units: 1000 us";
    for backend in ["local", "tcp"] {
        let common = ["--rows", "3000", "--ranks", "3", "--backend", backend];
        let (ok, _, err) = run(&[&common[..], &["--timestamp"]].concat());
        assert!(ok, "{err}");
        assert_eq!(err.matches(note).count(), 1, "{backend}: {err}");
        for quiet in [
            &["--timestamp", "--window", "1s"][..],
            &["--timestamp", "--window", "0", "--closed", "both"],
            &["--window", "1000"],
        ] {
            let (ok, _, err) = run(&[&common[..], quiet].concat());
            assert!(
                ok && !err.contains("counts its units"),
                "{backend} {quiet:?}: {err}"
            );
        }
    }
}

#[test]
fn tcp_backend_runs_the_job_in_processes() {
    let scratch = Scratch::new("cli-tcp");
    let d = scratch.path();
    let local = d.join("local.parquet");
    let tcp = d.join("tcp.parquet");
    let base = [
        "--rows",
        "50000",
        "--by",
        "key",
        "--aggs",
        "sum,count,max",
        "--window",
        "5000",
    ];
    let (ok, _, err) = run(&[
        &base[..],
        &["--ranks", "3", "--output", local.to_str().unwrap()],
    ]
    .concat());
    assert!(ok, "{err}");
    let (ok, out, err) = run(&[
        &base[..],
        &[
            "--ranks",
            "3",
            "--backend",
            "tcp",
            "--output",
            tcp.to_str().unwrap(),
        ],
    ]
    .concat());
    assert!(ok, "{err}");
    assert!(out.contains("[rank 2]"), "rank output is prefixed: {out}");
    // The job's line (rank 0's process, the ranks' counts summed), once.
    let jobs: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("rolling: 50000 rows in"))
        .collect();
    assert_eq!(jobs.len(), 1, "{out}");
    assert!(
        jobs[0].contains("50000 rows out, 3 ranks (tcp)"),
        "{}",
        jobs[0]
    );
    assert!(tcp.exists() && local.exists());
}

/// Ranks in different working directories given one relative output
/// path would write one output's parts to two directories (each looking
/// whole) and read different inputs as one: the ranks compare absolute
/// paths, so the job fails on every rank naming both, and nothing is
/// written. (Ranks started by braid-launch through `sh -c 'cd dR; ...'`,
/// as mpirun's `-wdir` starts them.)
#[test]
fn ranks_in_other_directories_compare_absolute_paths() {
    let scratch = Scratch::new("cli-wdir");
    let d = scratch.path();
    for r in 0..2 {
        std::fs::create_dir_all(d.join(format!("d{r}"))).unwrap();
    }
    let script = format!(
        "cd {}/d$BRAID_RANK && exec {} --rows 1000 --output out/",
        d.display(),
        env!("CARGO_BIN_EXE_rolling")
    );
    let out = output_within(
        Command::new(env!("CARGO_BIN_EXE_braid-launch")).args([
            "-n",
            "2",
            "--timeout",
            "60",
            "--",
            "sh",
            "-c",
            &script,
        ]),
        LIMIT,
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("given different jobs")
            && text.contains(&format!("{}/d0/out", d.display()))
            && text.contains(&format!("{}/d1/out", d.display())),
        "{text}"
    );
    for r in 0..2 {
        let o = d.join(format!("d{r}/out"));
        assert!(!o.join("part-00000.parquet").exists() && !o.join("part-00001.parquet").exists());
    }
}

/// A job stopped by SIGTERM, SIGINT or SIGHUP exits 130 and leaves no output, no
/// staging and no spill files: in-process ranks, and ranks in processes
/// of their own (tcp), which the launcher asks to stop (SIGTERM) before
/// it kills them; killed at once they left their spill files behind.
#[test]
fn a_stopped_job_leaves_nothing_behind() {
    let scratch = Scratch::new("cli-stop");
    let d = scratch.path();
    let tmp = d.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let spills = || {
        std::fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("braid-spill"))
            .count()
    };
    let grouped_tcp = ["--backend", "tcp", "--by", "key", "--memory-limit", "1MiB"];
    let grouped = ["--by", "key", "--memory-limit", "1MiB"];
    for (target, signal, extra) in [
        (d.join("out"), "-TERM", &[][..]),
        (d.join("out.parquet"), "-INT", &[][..]),
        (d.join("tcp"), "-TERM", &grouped_tcp[..]),
        // A closed terminal's SIGHUP: in-process ranks died of it, leaving
        // staging and spill files.
        (d.join("hup.parquet"), "-HUP", &grouped[..]),
    ] {
        // Far more rows than a second generates: the signal comes mid-job.
        // A spilling job reads all its rows before the shuffle spills (the
        // sort samples a rank's whole input), so it gets fewer: time to its
        // first spill grows with them (400M took 46-61 s on 2 idle cores and
        // more than 60 s beside the other tests), while its shuffle, where
        // the signal comes, still lasts seconds.
        let rows = if extra.is_empty() {
            "400000000"
        } else {
            "100000000"
        };
        let mut child = rolling()
            .args([
                "--rows",
                rows,
                "--ranks",
                "2",
                "--output",
                target.to_str().unwrap(),
            ])
            .args(extra)
            .env("TMPDIR", &tmp)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        if extra.is_empty() {
            std::thread::sleep(std::time::Duration::from_millis(1500));
        } else {
            // The ranks spill before the signal comes. Bounded (a hang
            // fails here), and a job that ended first says how.
            let until = std::time::Instant::now() + std::time::Duration::from_secs(300);
            while spills() == 0 && std::time::Instant::now() < until {
                if let Some(st) = child.try_wait().unwrap() {
                    let mut err = String::new();
                    use std::io::Read;
                    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
                    panic!("{signal} {extra:?}: the job ended ({st}) before it spilled: {err}");
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            if spills() == 0 {
                let _ = child.kill();
                panic!("{signal} {extra:?}: nothing spilled within 300 s");
            }
        }
        let st = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        // Bounded: a job that ignored the signal is killed and fails here.
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > std::time::Duration::from_secs(60) {
                let _ = child.kill();
                panic!("{signal}: the job did not stop within 60 s");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let mut err = String::new();
        use std::io::Read;
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert_eq!(status.code(), Some(130), "{signal} {extra:?}: {err}");
        assert!(
            err.contains("stopped by SIG") || err.contains("interrupted"),
            "{signal}: {err}"
        );
        assert!(!target.exists(), "{signal}: left {}", target.display());
        let mut staging = target.as_os_str().to_owned();
        staging.push(".braid-staging");
        assert!(!PathBuf::from(staging).exists(), "{signal}: left staging");
        assert_eq!(spills(), 0, "{signal} {extra:?}: spill files left: {err}");
    }
}

/// A job started ignoring SIGHUP (`nohup rolling ...`, or under a
/// launcher that was) runs on through a hangup, in-process ranks and tcp
/// ranks alike, and writes its whole output: before, its handler was
/// installed anyway and the hangup stopped the job `nohup` was to keep.
#[cfg(target_os = "linux")]
#[test]
fn a_job_started_under_nohup_outlives_a_hangup() {
    use std::os::unix::process::CommandExt as _;
    let scratch = Scratch::new("cli-nohup");
    let d = scratch.path();
    for (name, extra) in [
        ("local.parquet", &[][..]),
        ("tcp.parquet", &["--backend", "tcp"][..]),
    ] {
        let target = d.join(name);
        let mut cmd = rolling();
        // Long enough (seconds) that the hangup comes mid-job.
        cmd.args([
            "--rows",
            "20000000",
            "--ranks",
            "2",
            "--output",
            target.to_str().unwrap(),
        ])
        .args(extra)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        // SAFETY: signal(2) only, between fork and exec, as nohup does.
        unsafe {
            cmd.pre_exec(|| {
                libc::signal(libc::SIGHUP, libc::SIG_IGN);
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(700));
        assert!(
            child.try_wait().unwrap().is_none(),
            "{name}: the job ended before the hangup; give it more rows"
        );
        // The hangup reaches the job's process group, as a closed
        // terminal's does (the tcp ranks lead groups of their own and get
        // it from no one: the launcher is the one that must not pass it on).
        // SAFETY: a signal to the child this test started.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGHUP) }, 0);
        let start = std::time::Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if start.elapsed() > LIMIT {
                let _ = child.kill();
                panic!("{name}: the job did not end");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        let (mut out, mut err) = (String::new(), String::new());
        use std::io::Read;
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(status.success(), "{name}: {status}: {err}");
        assert!(
            out.contains("rolling: 20000000 rows in, 20000000 rows out"),
            "{name}: {out}"
        );
        assert!(target.exists(), "{name}: no output");
    }
}
