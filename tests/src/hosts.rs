//! Hosts made of network namespaces, for tests of jobs whose ranks sit on
//! several hosts: each host is a namespace with an address of its own on a
//! bridge (`tests/hosts/netns.sh`), so every message between two hosts
//! crosses a network interface, as between machines, not loopback. A
//! process started "on" a host runs in its namespace; the file system and
//! everything else are shared, as a cluster's shared file system would be.
//!
//! Making them needs root (CAP_NET_ADMIN) and iproute2: where this machine
//! cannot, [`Hosts::up`] says why and the test skips, saying so.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// Why [`Hosts::up`] made no hosts.
#[derive(Debug)]
pub enum Unmade {
    /// This machine cannot make network namespaces (not root, no
    /// CAP_NET_ADMIN, no `ip`): a test skips, saying so.
    Unavailable(String),
    /// It can, but making these failed: a test fails.
    Failed(String),
}

/// A set of hosts, removed when dropped.
pub struct Hosts {
    prefix: String,
    net: String,
    count: u32,
    /// Held while the hosts exist: namespaces, links and addresses are the
    /// machine's, so another test process with the same prefix (a second
    /// `cargo test`) waits instead of tearing them down.
    _lock: std::fs::File,
}

/// Locks `/run/braid-hosts-PREFIX.lock` (the machine's, whatever TMPDIR
/// says), waiting while another process holds it, for at most
/// `LOCK_WAIT`.
fn lock(prefix: &str) -> Result<std::fs::File, Unmade> {
    use braid_core::file_lock::{Locked, try_lock};
    let path = Path::new("/run").join(format!("braid-hosts-{prefix}.lock"));
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| Unmade::Unavailable(format!("cannot open {}: {e}", path.display())))?;
    let start = std::time::Instant::now();
    let mut said = false;
    loop {
        match try_lock(&f) {
            Ok(()) => return Ok(f),
            Err(Locked::Elsewhere) if start.elapsed() < LOCK_WAIT => {
                if !said {
                    eprintln!("waiting for another process's hosts {prefix}*");
                    said = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(Locked::Elsewhere) => {
                return Err(Unmade::Failed(format!(
                    "another process has held {} for {LOCK_WAIT:?}",
                    path.display()
                )));
            }
            Err(Locked::Unsupported(e) | Locked::Failed(e)) => {
                return Err(Unmade::Unavailable(format!(
                    "cannot lock {}: {e}",
                    path.display()
                )));
            }
        }
    }
}

/// How long [`Hosts::up`] waits for another test process's hosts of the
/// same prefix (its tests take minutes at most).
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(900);

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("hosts/netns.sh")
}

impl Hosts {
    /// Makes `count` hosts: namespaces `{prefix}0..` with addresses
    /// `{net}.1..` (`net`: the first three parts of an IPv4 /24 of its
    /// own), after removing any left of an earlier run with this prefix.
    pub fn up(prefix: &str, net: &str, count: u32) -> Result<Hosts, Unmade> {
        let hosts = Hosts {
            prefix: prefix.into(),
            net: net.into(),
            count,
            _lock: lock(prefix)?,
        };
        let run = |args: &[&str]| -> Result<(), String> {
            let out = hosts
                .script(args)
                .output()
                .map_err(|e| format!("cannot run {}: {e}", script().display()))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{} {}: {}",
                    script().display(),
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        run(&["probe"]).map_err(Unmade::Unavailable)?;
        run(&["up", &count.to_string()]).map_err(Unmade::Failed)?;
        Ok(hosts)
    }

    /// Three hosts for a test: `None`, after a line saying why, where this
    /// machine cannot make them (the test then skips); a failure to make
    /// them where it can fails the test.
    #[allow(clippy::panic)] // a test fails by panicking
    pub fn for_test(prefix: &str, net: &str) -> Option<Hosts> {
        match Hosts::up(prefix, net, 3) {
            Ok(h) => Some(h),
            Err(Unmade::Unavailable(why)) => {
                eprintln!("skipped: no network namespaces here ({why})");
                None
            }
            Err(Unmade::Failed(why)) => panic!("making the hosts failed: {why}"),
        }
    }

    /// A Slurm cluster of these hosts for a test, its files in `dir`:
    /// `None`, after a line saying why, where Slurm is not installed.
    pub fn slurm_for_test(&self, dir: &Path) -> Option<Slurm<'_>> {
        match self.slurm(dir) {
            Ok(s) => Some(s),
            Err(why) => {
                eprintln!("skipped: {why}");
                None
            }
        }
    }

    fn script(&self, args: &[&str]) -> Command {
        let mut c = Command::new(script());
        c.args(args)
            .env("BRAID_HOSTS_PREFIX", &self.prefix)
            .env("BRAID_HOSTS_NET", &self.net);
        c
    }

    /// How many hosts.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Host `i`'s address.
    pub fn addr(&self, i: u32) -> String {
        format!("{}.{}", self.net, i + 1)
    }

    /// A command that runs `program` on host `i` (its environment and
    /// arguments are set on the result as on any command).
    pub fn command(&self, i: u32, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &format!("{}{i}", self.prefix)])
            .arg(program);
        c
    }

    /// `mpirun` placing `n` ranks on these hosts, one host after the other
    /// (`--map-by node`), with `hostfile` written in `dir`: mpirun starts
    /// its daemons through this script's rsh agent, and MPI's own traffic
    /// (TCP between hosts, shared memory within one) stays on the hosts'
    /// network. Root is allowed through Open MPI's variables.
    pub fn mpirun(&self, n: u32, dir: &Path) -> std::io::Result<Command> {
        let hostfile = dir.join("hostfile");
        let lines: String = (0..self.count)
            .map(|i| format!("{} slots={}\n", self.addr(i), n.div_ceil(self.count)))
            .collect();
        std::fs::write(&hostfile, lines)?;
        let subnet = format!("{}.0/24", self.net);
        let mut c = Command::new("mpirun");
        c.args(["-np", &n.to_string(), "--map-by", "node", "--hostfile"])
            .arg(&hostfile)
            .args(["--mca", "plm_rsh_agent"])
            .arg(format!("{} rsh", script().display()))
            .args(["--mca", "btl", "tcp,vader,self"])
            .args(["--mca", "btl_tcp_if_include", &subnet])
            .args(["--mca", "oob_tcp_if_include", &subnet])
            .env("BRAID_HOSTS_PREFIX", &self.prefix)
            .env("BRAID_HOSTS_NET", &self.net)
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        Ok(c)
    }
}

/// A Slurm cluster on a set of [`Hosts`] (`tests/hosts/slurm.sh`):
/// slurmctld here, a slurmd on each host, all its files in one folder,
/// on ports of its own and without munge. Stopped when dropped.
pub struct Slurm<'h> {
    hosts: &'h Hosts,
    dir: PathBuf,
}

impl Hosts {
    /// Starts a Slurm cluster on these hosts with its files in `dir`.
    /// `Err` says why this machine cannot (Slurm's daemons missing).
    pub fn slurm(&self, dir: &Path) -> Result<Slurm<'_>, String> {
        let missing: Vec<&str> = ["slurmctld", "slurmd", "srun", "sinfo"]
            .into_iter()
            .filter(|p| {
                !Command::new("sh")
                    .args(["-c", &format!("command -v {p}")])
                    .output()
                    .is_ok_and(|o| o.status.success())
            })
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "Slurm is not installed (no {})",
                missing.join(", ")
            ));
        }
        let slurm = Slurm {
            hosts: self,
            dir: dir.to_path_buf(),
        };
        let out = slurm
            .script("up")
            .arg(self.count.to_string())
            .output()
            .map_err(|e| format!("cannot run slurm.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "slurm.sh up: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(slurm)
    }
}

impl Slurm<'_> {
    fn script(&self, what: &str) -> Command {
        let mut c = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("hosts/slurm.sh"));
        c.arg(what)
            .arg(&self.dir)
            .env("BRAID_HOSTS_PREFIX", &self.hosts.prefix)
            .env("BRAID_HOSTS_NET", &self.hosts.net);
        c
    }

    /// `srun` of `n` tasks spread over the hosts one after the other
    /// (`--distribution cyclic`; more tasks than cores allowed), through
    /// Slurm's PMIx plugin, as Open MPI needs, and ending every task when
    /// one fails or dies (`--kill-on-bad-exit`, as the README's Slurm line:
    /// Slurm's default lets the others wait for it); MPI's traffic stays on
    /// the hosts' network.
    pub fn srun(&self, n: u32) -> Command {
        let subnet = format!("{}.0/24", self.hosts.net);
        let nodes = n.min(self.hosts.count);
        let mut c = Command::new("srun");
        c.args(["--mpi=pmix", "--kill-on-bad-exit=1", "--overcommit"])
            .args(["--distribution", "cyclic"])
            .args(["-N", &nodes.to_string(), "-n", &n.to_string()])
            .env("SLURM_CONF", self.dir.join("slurm.conf"))
            .env("OMPI_MCA_btl_tcp_if_include", &subnet)
            .env("OMPI_MCA_oob_tcp_if_include", &subnet);
        c
    }

    /// Runs [`srun`](Self::srun) of `n` tasks, given its program, arguments
    /// and environment by `setup`, to its end within `limit`
    /// ([`output_within`](crate::output_within)); where a task died of
    /// SIGSEGV, runs it once more and says so on stderr.
    ///
    /// Why: Open MPI 4.1 (Debian 12's 4.1.4) can kill a rank inside
    /// `MPI_Init` under srun: a peer that has left `MPI_Init` sends to a
    /// rank still in it, whose tcp BTL hands the message to a handler not
    /// yet set (a race of the kind open-mpi/ompi#13559 describes for ob1).
    /// Core dumps of these deaths show SIGSEGV in `ompi_mpi_init` (waiting
    /// on a PMIx fence) -> `opal_progress` -> `mca_btl_tcp.so` calling a
    /// null handler for an ob1 match header (tag 0x41); the other ranks
    /// then report failed TCP connects and a missing shared memory
    /// segment (the dead rank's). `OMPI_MCA_mpi_add_procs_cutoff` (all
    /// peers set up in `MPI_Init`) did not prevent it. Here it
    /// comes with more ranks than cores (up to 8 on 2), in a few jobs of a
    /// hundred; a second death fails the test.
    pub fn output(&self, n: u32, setup: impl Fn(&mut Command), limit: Duration) -> Output {
        let run = || {
            let mut c = self.srun(n);
            setup(&mut c);
            crate::output_within(&mut c, limit)
        };
        let out = run();
        if out.status.success()
            || !String::from_utf8_lossy(&out.stderr).contains("Segmentation fault")
        {
            return out;
        }
        eprintln!(
            "srun of {n} tasks: a task died of SIGSEGV (Open MPI 4.1's MPI_Init race, see \
             Slurm::output); running the job once more. Its stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        run()
    }
}

impl Drop for Slurm<'_> {
    fn drop(&mut self) {
        let _ = self.script("down").output();
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = self.script(&["down"]).output();
    }
}
