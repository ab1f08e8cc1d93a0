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
use std::process::Command;

/// A set of hosts, removed when dropped.
pub struct Hosts {
    prefix: String,
    net: String,
    count: u32,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("hosts/netns.sh")
}

impl Hosts {
    /// Makes `count` hosts: namespaces `{prefix}0..` with addresses
    /// `{net}.1..` (`net`: the first three parts of an IPv4 /24 of its
    /// own). `Err` says why this machine cannot (not root, no `ip`).
    pub fn up(prefix: &str, net: &str, count: u32) -> Result<Hosts, String> {
        let hosts = Hosts {
            prefix: prefix.into(),
            net: net.into(),
            count,
        };
        let out = hosts
            .script(["up", &count.to_string()])
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script().display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} up {count}: {}",
                script().display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(hosts)
    }

    fn script<const N: usize>(&self, args: [&str; N]) -> Command {
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

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = self.script(["down"]).output();
    }
}
