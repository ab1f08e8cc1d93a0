//! The rolling job under `mpirun` (feature `mpi`) for N in {1, 2, 3, 4, 5,
//! 8}, grouped and ungrouped, checked against Polars by the oracle script.
//! Needs OpenMPI and python3 with polars and pyarrow.

#![cfg(feature = "mpi")]
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail by panicking

use std::path::PathBuf;
use std::process::Command;

/// The longest one mpirun of these tests may take: past it, the job is
/// stopped and its test fails with the job's output (not CI's time).
const JOB_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn rolling_under_mpirun_matches_the_oracle() {
    let scratch = braid_tests::Scratch::new("mpi-rolling");
    let d = scratch.path();
    let input = d.join("in.parquet");
    braid_tests::gen_input(&input, 100_000, 20, 1_000_000, 11);
    for n in [1u32, 2, 3, 4, 5, 8] {
        for grouped in [false, true] {
            let out = d.join(format!("out-{n}-{grouped}"));
            let mut cmd = Command::new("mpirun");
            cmd.args(["--oversubscribe", "-np", &n.to_string()])
                // Root is allowed through the variables Open MPI 4 and 5
                // read (other launchers ignore them; a flag they refuse).
                .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
                .arg(env!("CARGO_BIN_EXE_rolling"))
                .args(["--backend", "mpi", "--input"])
                .arg(&input)
                .arg("--output")
                .arg(&out)
                .args([
                    "--values",
                    "v,w",
                    "--window",
                    "5000",
                    "--closed",
                    "both",
                    "--aggs",
                    "sum,mean,min,max,count,std,var",
                ]);
            if grouped {
                cmd.args(["--by", "key"]);
            }
            let o = braid_tests::output_within(&mut cmd, JOB_LIMIT);
            assert!(
                o.status.success(),
                "{n} ranks: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            let mut check = Command::new("python3");
            check
                .arg(repo().join("tests/oracle/check_rolling.py"))
                .arg("--input")
                .arg(&input)
                .arg("--output")
                .arg(&out)
                .args([
                    "--order", "ts", "--values", "v,w", "--window", "5000", "--closed", "both",
                ])
                .args([
                    "--aggs",
                    "sum,mean,min,max,count,std,var",
                    "--engines",
                    "polars",
                ]);
            if grouped {
                check.args(["--by", "key"]);
            }
            let c = braid_tests::output_within(&mut check, JOB_LIMIT);
            assert!(
                c.status.success(),
                "{n} ranks, grouped={grouped}: {}\n{}",
                String::from_utf8_lossy(&c.stdout),
                String::from_utf8_lossy(&c.stderr)
            );
        }
    }
}

/// Under mpirun the job joins the MPI job with `BRAID_BACKEND=mpi` as
/// with `--backend mpi`; without either, every process would run a whole
/// job of its own on the same output: refused. `--ranks` may only repeat
/// mpirun's count.
#[test]
fn mpirun_needs_the_mpi_backend_and_its_rank_count() {
    let run = |env_mpi: bool, extra: &[&str]| {
        let mut cmd = Command::new("mpirun");
        cmd.args(["--oversubscribe", "-np", "3"])
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .env_remove("BRAID_BACKEND")
            .arg(env!("CARGO_BIN_EXE_rolling"))
            .args(["--rows", "3000"])
            .args(extra);
        if env_mpi {
            cmd.env("BRAID_BACKEND", "mpi");
        }
        let out = braid_tests::output_within(&mut cmd, JOB_LIMIT);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, stdout, stderr) = run(true, &[]);
    assert!(ok, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("3000 rows in, 3000 rows out, 3 ranks (mpi)"),
        "{stdout}"
    );
    let (ok, _, stderr) = run(false, &[]);
    assert!(!ok && stderr.contains("pass --backend mpi"), "{stderr}");
    let (ok, _, stderr) = run(false, &["--backend", "mpi", "--ranks", "2"]);
    assert!(!ok && stderr.contains("mpirun -np 2"), "{stderr}");
    let (ok, stdout, stderr) = run(false, &["--backend", "mpi", "--ranks", "3"]);
    assert!(ok, "{stdout}\n{stderr}");
}

/// A job that fails under mpirun (a value one rank's CSV file cannot
/// parse) leaves neither its output nor its staged parts: MPI_Abort ends
/// every process before `main` could clean up, so the cleanup runs before
/// it (`braid_core::world::on_process_abort`). Before, the output
/// directory and `.braid-staging` with rank 0's part were left.
#[test]
fn a_failed_mpi_job_leaves_nothing_behind() {
    let scratch = braid_tests::Scratch::new("mpi-fail");
    let d = scratch.path();
    let input = d.join("in");
    std::fs::create_dir(&input).unwrap();
    for f in 0..3 {
        let mut text = String::from("ts,key,v\n");
        for i in 0..20_000 {
            text.push_str(&format!("{},{},{}\n", i * 3 + f, i % 7, i));
        }
        if f == 2 {
            text.push_str("99999,1,notanumber\n");
        }
        std::fs::write(input.join(format!("p{f}.csv")), text).unwrap();
    }
    for out in [d.join("out"), d.join("out.parquet")] {
        let mut cmd = Command::new("mpirun");
        cmd.args(["--oversubscribe", "-np", "3"])
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
            .arg(env!("CARGO_BIN_EXE_rolling"))
            .args([
                "--backend",
                "mpi",
                "--by",
                "key",
                "--window",
                "300",
                "--input",
            ])
            .arg(&input)
            .arg("--output")
            .arg(&out);
        let o = braid_tests::output_within(&mut cmd, JOB_LIMIT);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{stderr}");
        assert!(stderr.contains("notanumber"), "{stderr}");
        let left: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "in")
            .collect();
        assert!(left.is_empty(), "{}: left behind {left:?}", out.display());
    }
}
