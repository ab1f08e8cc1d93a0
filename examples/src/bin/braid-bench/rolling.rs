//! Rolling-aggregation benchmark: Parquet in, Parquet out, 10 million rows,
//! grouped and ungrouped, braid's `rolling` job (2 local ranks by default)
//! next to the same aggregations through Polars (`bench/rolling_polars.py`)
//! on the same file in the same run. Both write snappy Parquet; times are
//! whole runs (read, sort, aggregate, write), best of `--reps`; memory is
//! each process's peak resident set. The two outputs are compared
//! (`bench/compare_rolling.py`): a difference fails the benchmark.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use braid_core::BoxError;
use braid_examples::outln;

/// Options of `braid-bench rolling`.
#[derive(Debug, clap::Args)]
pub struct RollingArgs {
    /// Rows of the generated input (at least 1).
    #[arg(long, default_value_t = 10_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    rows: u64,
    /// braid ranks (local, 1 to 1024).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=i64::from(braid_examples::MAX_HOST_RANKS)))]
    ranks: u32,
    /// Window (order units; the input's ts spans 10 units per row, so
    /// 1000 holds about 100 rows ungrouped and about 1 a group over the
    /// 100 keys; at least 1).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(i64).range(1..), allow_negative_numbers = true)]
    window: i64,
    /// Aggregations, comma-separated: sum, mean, min, max, count, std, var.
    #[arg(long, default_value = "sum,mean,min,max,count", value_parser = parse_aggs)]
    aggs: String,
    /// Repetitions (the best is kept).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    reps: u32,
    /// Also run the job on GPUs (`rolling --device gpu`, one GPU per rank;
    /// needs a `cuda` build).
    #[arg(long)]
    gpu: bool,
    /// Work directory (input and outputs).
    #[arg(long, default_value = "target/bench/rolling")]
    dir: PathBuf,
}

/// `--aggs` checked before any run (the runs take the text as it is).
fn parse_aggs(s: &str) -> Result<String, String> {
    for a in s.split(',') {
        a.parse::<braid_kernels::rolling::Agg>()
            .map_err(|e| e.to_string())?;
    }
    Ok(s.to_owned())
}

struct Run {
    secs: f64,
    peak_mib: f64,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn input(args: &RollingArgs) -> Result<PathBuf, BoxError> {
    std::fs::create_dir_all(&args.dir)?;
    let path = args.dir.join(format!("input-{}.parquet", args.rows));
    if !path.exists() {
        let st = Command::new("python3")
            .arg(repo().join("tests/oracle/gen_input.py"))
            .arg(&path)
            .args(["--rows", &args.rows.to_string(), "--keys", "100"])
            .args(["--span", &(args.rows * 10).to_string(), "--seed", "1"])
            .status()?;
        if !st.success() {
            return Err(
                "generating the input failed (needs python3 with pyarrow or polars)".into(),
            );
        }
    }
    Ok(path)
}

fn braid(
    args: &RollingArgs,
    input: &Path,
    by: Option<&str>,
    device: &str,
) -> Result<Run, BoxError> {
    let exe = std::env::current_exe()?.with_file_name("rolling");
    let out = args.dir.join("braid-out");
    let mut cmd = Command::new(exe);
    cmd.arg("--input")
        .arg(input)
        .arg("--output")
        .arg(&out)
        .args([
            "--ranks",
            &args.ranks.to_string(),
            "--window",
            &args.window.to_string(),
        ])
        .args(["--aggs", &args.aggs, "--device", device]);
    if let Some(b) = by {
        cmd.args(["--by", b]);
    }
    let t = Instant::now();
    let o = cmd.output()?;
    let secs = t.elapsed().as_secs_f64();
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        let err = err.trim().trim_start_matches("error: ");
        return Err(format!("the rolling job failed: {err}").into());
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let peak = text
        .split("peak RSS ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN);
    Ok(Run {
        secs,
        peak_mib: peak,
    })
}

fn polars(args: &RollingArgs, input: &Path, by: Option<&str>) -> Result<(Run, f64), BoxError> {
    let out = args.dir.join("polars-out.parquet");
    let mut cmd = Command::new("python3");
    cmd.arg(repo().join("bench/rolling_polars.py"))
        .arg("--input")
        .arg(input)
        .arg("--output")
        .arg(&out)
        .args(["--window", &args.window.to_string(), "--aggs", &args.aggs]);
    if let Some(b) = by {
        cmd.args(["--by", b]);
    }
    let t = Instant::now();
    let o = cmd.output()?;
    let secs = t.elapsed().as_secs_f64();
    if !o.status.success() {
        return Err(format!("polars failed: {}", String::from_utf8_lossy(&o.stderr)).into());
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let field = |name: &str| -> f64 {
        text.split(&format!("{name}="))
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(f64::NAN)
    };
    Ok((
        Run {
            secs,
            peak_mib: field("peak_rss_mb"),
        },
        field("compute_s"),
    ))
}

/// Best (fastest) of `reps` runs.
fn best<T>(
    reps: u32,
    secs: impl Fn(&T) -> f64,
    mut f: impl FnMut() -> Result<T, BoxError>,
) -> Result<T, BoxError> {
    let mut best: Option<T> = None;
    for _ in 0..reps.max(1) {
        let r = f()?;
        if best.as_ref().is_none_or(|b| secs(&r) < secs(b)) {
            best = Some(r);
        }
    }
    best.ok_or_else(|| "no repetitions".into())
}

/// Runs the benchmark and prints the table.
pub fn run(args: RollingArgs) -> Result<(), BoxError> {
    // What the runs need, checked before any of them.
    if args.gpu && !cfg!(feature = "cuda") {
        return Err("--gpu needs braid-bench built with --features braid-examples/cuda".into());
    }
    let has_polars = Command::new("python3")
        .args(["-c", "import polars"])
        .output()
        .map_err(|e| format!("python3 could not be run ({e}); the Polars baseline needs it"))?;
    if !has_polars.status.success() {
        return Err(
            "the Polars baseline needs python3 with polars (python3 -m pip install polars pyarrow)"
                .into(),
        );
    }
    let input = input(&args)?;
    outln!(
        "# braid-bench rolling: {} rows, window {}, aggs {}, braid {} local ranks vs Polars",
        args.rows,
        args.window,
        args.aggs,
        args.ranks
    );
    outln!();
    if args.gpu {
        outln!(
            "| job | braid cpu s | braid gpu s | Polars s | x (cpu s / gpu s) | x (Polars s / gpu s) | gpu peak host MiB |"
        );
        outln!("|---|---:|---:|---:|---:|---:|---:|");
    } else {
        outln!(
            "| job | braid s | Polars s | x (Polars s / braid s) | braid peak MiB | Polars peak MiB | Polars compute-only s |"
        );
        outln!("|---|---:|---:|---:|---:|---:|---:|");
    }
    let mut checks = Vec::new();
    for by in [None, Some("key")] {
        let name = if by.is_some() {
            "grouped by key (100 keys)"
        } else {
            "ungrouped"
        };
        let b = best(
            args.reps,
            |r: &Run| r.secs,
            || braid(&args, &input, by, "cpu"),
        )?;
        let (p, pc) = best(
            args.reps,
            |r: &(Run, f64)| r.0.secs,
            || polars(&args, &input, by),
        )?;
        // Both wrote the same rows and values (checked on the last run's
        // outputs; a difference fails the benchmark).
        checks.push(format!("{name}: {}", compare(&args)?));
        if args.gpu {
            let g = best(
                args.reps,
                |r: &Run| r.secs,
                || braid(&args, &input, by, "gpu"),
            )?;
            // The GPU's output (now in braid-out) against Polars' too.
            checks.push(format!("{name}, gpu: {}", compare(&args)?));
            outln!(
                "| {name} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} |",
                b.secs,
                g.secs,
                p.secs,
                b.secs / g.secs,
                p.secs / g.secs,
                g.peak_mib
            );
        } else {
            outln!(
                "| {name} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} | {:.2} |",
                b.secs,
                p.secs,
                p.secs / b.secs,
                b.peak_mib,
                p.peak_mib,
                pc
            );
        }
    }
    outln!();
    for c in checks {
        outln!("- {c}");
    }
    Ok(())
}

/// Compares braid's output with Polars' (`bench/compare_rolling.py`):
/// its line, or the difference as an error.
fn compare(args: &RollingArgs) -> Result<String, BoxError> {
    let o = Command::new("python3")
        .arg(repo().join("bench/compare_rolling.py"))
        .arg(args.dir.join("braid-out"))
        .arg(args.dir.join("polars-out.parquet"))
        .output()?;
    let text = String::from_utf8_lossy(&o.stdout).trim().to_string();
    if !o.status.success() {
        return Err(format!(
            "braid's and Polars' outputs differ: {}{}",
            text,
            String::from_utf8_lossy(&o.stderr).trim()
        )
        .into());
    }
    Ok(text)
}
