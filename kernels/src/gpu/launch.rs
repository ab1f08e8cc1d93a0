//! The compiled module cache and launch helpers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use braid_core::cuda::cudarc::driver::{CudaFunction, CudaModule, LaunchConfig};
use braid_core::cuda::cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};
use braid_core::cuda::{CudaError, Gpu};

/// The CUDA C source of every kernel.
const SOURCE: &str = include_str!("kernels.cu");

/// Names a file whose text replaces the built-in kernel source, for
/// kernel work: a changed kernel runs without rebuilding the binary (and
/// several variants can be timed by one binary). Entry points, argument
/// lists and the tile constants `rolling.rs` mirrors must stay as they are.
pub const SOURCE_VAR: &str = "BRAID_KERNEL_SOURCE";

/// The kernel source in use: `SOURCE_VAR`'s file if set, else the built-in
/// one (read once per process).
fn source(rank: u32) -> Result<&'static str, KernelError> {
    static OVERRIDE: OnceLock<Result<Option<String>, String>> = OnceLock::new();
    let o = OVERRIDE.get_or_init(|| match std::env::var_os(SOURCE_VAR) {
        None => Ok(None),
        Some(path) => std::fs::read_to_string(&path)
            .map(Some)
            .map_err(|e| format!("{SOURCE_VAR}={}: {e}", path.to_string_lossy())),
    });
    match o {
        Ok(Some(text)) => Ok(text.as_str()),
        Ok(None) => Ok(SOURCE),
        Err(detail) => Err(KernelError::Compile {
            rank,
            detail: detail.clone(),
        }),
    }
}

/// Failures of compiling or launching kernels.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KernelError {
    /// NVRTC could not compile the kernels (or is not installed).
    #[error("rank {rank}: compiling GPU kernels failed: {detail}")]
    Compile {
        /// The rank.
        rank: u32,
        /// NVRTC's log.
        detail: String,
    },
    /// A CUDA call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// Bad arguments; nothing was launched.
    #[error("rank {rank}: {kernel}: {detail}")]
    Invalid {
        /// The rank.
        rank: u32,
        /// The kernel.
        kernel: &'static str,
        /// What is wrong.
        detail: String,
    },
}

/// Which compilation of `kernels.cu`: the tile pass's geometry (region,
/// tile, block) is compile-time constant, so long windows get a module of
/// their own, compiled on first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Build {
    /// Every kernel; the tile pass on 1024-row tiles, blocks of 256, four
    /// an SM, a lookback of 448 rows.
    Default,
    /// The same source with 2048-row tiles, blocks of 512, two an SM and a
    /// larger region (a lookback of 1344 rows), for the tiles whose windows
    /// the default region cannot hold.
    LongWindows,
}

/// Output rows per flag of the tile passes (`ROLL_FLAG_TILE`): the
/// default tile. Every build reads and writes flags at this grain.
pub const FLAG_TILE_ROWS: usize = 1024;

impl Build {
    /// Region rows a tile block holds (`ROLL_CAP`: halo, tile and ties
    /// past it). The larger region's shared memory would cost the default
    /// case (fewer blocks an SM, a smaller L1), so it only takes the tiles
    /// the default build leaves.
    pub fn region_rows(self) -> usize {
        match self {
            Build::Default => 1536,
            Build::LongWindows => 3456,
        }
    }

    /// Output rows per block of the tile pass (`ROLL_TILE`).
    pub fn tile_rows(self) -> usize {
        match self {
            Build::Default => FLAG_TILE_ROWS,
            Build::LongWindows => 2 * FLAG_TILE_ROWS,
        }
    }

    /// Threads per block of the tile pass (`ROLL_THREADS`; 4 rows each).
    pub fn tile_threads(self) -> u32 {
        match self {
            Build::Default => 256,
            Build::LongWindows => 512,
        }
    }

    /// NVRTC options beyond the common ones (the source's defaults are
    /// the default build's).
    fn defines(self) -> Vec<String> {
        match self {
            Build::Default => Vec::new(),
            Build::LongWindows => vec![
                format!("-DROLL_CAP={}", self.region_rows()),
                format!("-DROLL_TILE={}", self.tile_rows()),
                format!("-DROLL_THREADS={}", self.tile_threads()),
                "-DROLL_MINB=2".into(),
            ],
        }
    }
}

/// The kernels compiled for one device.
pub struct Kernels {
    _module: Arc<CudaModule>,
    funcs: HashMap<&'static str, CudaFunction>,
}

/// Every kernel entry point in `kernels.cu`.
const ENTRY_POINTS: &[&str] = &[
    "gather_u8",
    "gather_u16",
    "gather_u32",
    "gather_u64",
    "hash_partition_i64",
    "order_key_i64",
    "order_key_f64",
    "u64_min_max",
    "radix_histogram",
    "radix_row_totals",
    "radix_scan_digits",
    "radix_scatter",
    "lower_bound_u64",
    "cast_to_f64",
    "cast_to_i64",
    "roll_level_rows",
    "roll_level_up",
    "rolling_window",
    "rolling_tile_pl",
    "rolling_tile_keyed_pl",
    "rolling_tile_cal_pl",
    "rolling_tile_keyed_cal_pl",
    "rolling_tile",
    "rolling_tile_keyed",
    "rolling_tile_cal",
    "rolling_tile_keyed_cal",
    "nvlink_sendrecv",
    "iota_u32",
    "iota_i64",
];

type Cache = Mutex<HashMap<(usize, Build), Arc<Kernels>>>;

/// Where compiled PTX is kept between processes: `BRAID_KERNEL_CACHE`, or
/// `$XDG_CACHE_HOME/braid`, or `$HOME/.cache/braid`; `None` when none is
/// set or `BRAID_KERNEL_CACHE` is empty (no disk cache). NVRTC takes about
/// a second for `kernels.cu`; a cached file loads in microseconds (the
/// driver caches its own PTX-to-binary step).
fn ptx_cache_dir() -> Option<std::path::PathBuf> {
    if let Some(d) = std::env::var_os("BRAID_KERNEL_CACHE") {
        return (!d.is_empty()).then(|| d.into());
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache")))?;
    Some(base.join("braid"))
}

/// The cache file of the kernels compiled from `source` with `options`
/// (FNV-1a of both: a changed source is a new file).
fn ptx_path(source: &str, options: &[String]) -> Option<std::path::PathBuf> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in source.bytes().chain(options.join(" ").bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    Some(ptx_cache_dir()?.join(format!("kernels-{h:016x}.ptx")))
}

fn cached_ptx(source: &str, options: &[String]) -> Option<Ptx> {
    let text = std::fs::read_to_string(ptx_path(source, options)?).ok()?;
    text.contains(".entry").then(|| Ptx::from_src(text))
}

/// Writes the PTX to the cache (atomically: a temporary file, renamed);
/// failures only cost the next process a compile.
fn store_ptx(source: &str, options: &[String], ptx: &Ptx) {
    let Some(path) = ptx_path(source, options) else {
        return;
    };
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, ptx.to_src()).is_ok() && std::fs::rename(&tmp, &path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

impl Kernels {
    /// The kernels for `gpu`'s device, compiled on first use (NVRTC) and
    /// cached for the life of the process.
    pub fn get(gpu: &Gpu) -> Result<Arc<Kernels>, KernelError> {
        Self::get_build(gpu, Build::Default)
    }

    /// The kernels of one [`Build`] for `gpu`'s device, as [`Kernels::get`].
    pub fn get_build(gpu: &Gpu, build: Build) -> Result<Arc<Kernels>, KernelError> {
        let ordinal = gpu.ordinal();
        if let Some(k) = cache()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(ordinal, build))
        {
            return Ok(k.clone());
        }
        let rank = gpu.rank();
        // SAFETY: only probes whether the library can be loaded.
        if !unsafe { braid_core::cuda::cudarc::nvrtc::sys::is_culib_present() } {
            return Err(KernelError::Compile {
                rank,
                detail: "libnvrtc could not be loaded (is it on LD_LIBRARY_PATH?)".into(),
            });
        }
        let (major, minor) =
            gpu.context()
                .compute_capability()
                .map_err(|e| KernelError::Compile {
                    rank,
                    detail: format!("compute capability: {e:?}"),
                })?;
        let opts = CompileOptions {
            options: vec![
                format!("--gpu-architecture=sm_{major}{minor}"),
                "-std=c++17".into(),
            ]
            .into_iter()
            .chain(build.defines())
            .collect(),
            ..Default::default()
        };
        let source = source(rank)?;
        // Compiles the source and caches its PTX for later processes.
        let compile = || -> Result<Ptx, KernelError> {
            let ptx =
                compile_ptx_with_opts(source, opts.clone()).map_err(|e| KernelError::Compile {
                    rank,
                    detail: format!("{e:?}"),
                })?;
            store_ptx(source, &opts.options, &ptx);
            Ok(ptx)
        };
        let load = |ptx: Ptx| {
            gpu.context()
                .load_module(ptx)
                .map_err(|e| KernelError::Compile {
                    rank,
                    detail: format!("loading the module: {e:?}"),
                })
        };
        let module = match cached_ptx(source, &opts.options) {
            // A cached file this driver cannot load (written by a newer
            // NVRTC on a host sharing the cache, say) is compiled afresh
            // and replaced, not a failure of every later run.
            Some(p) => match load(p) {
                Ok(m) => m,
                Err(_) => load(compile()?)?,
            },
            None => load(compile()?)?,
        };
        let mut funcs = HashMap::new();
        for &name in ENTRY_POINTS {
            let f = module
                .load_function(name)
                .map_err(|e| KernelError::Compile {
                    rank,
                    detail: format!("entry point {name}: {e:?}"),
                })?;
            funcs.insert(name, f);
        }
        let k = Arc::new(Kernels {
            _module: module,
            funcs,
        });
        cache()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((ordinal, build), k.clone());
        Ok(k)
    }

    /// An entry point.
    pub(crate) fn func(&self, rank: u32, name: &'static str) -> Result<&CudaFunction, KernelError> {
        self.funcs.get(name).ok_or(KernelError::Invalid {
            rank,
            kernel: name,
            detail: "no such entry point".into(),
        })
    }
}

/// Threads per block for the element-wise kernels.
pub(crate) const BLOCK: u32 = 256;

/// A 1-D launch covering `n` elements (at least one block).
pub(crate) fn grid(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, 1 << 30) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Maps a launch failure.
pub(crate) fn launched<T>(
    rank: u32,
    r: Result<T, braid_core::cuda::cudarc::driver::DriverError>,
) -> Result<(), KernelError> {
    r.map(|_| ()).map_err(|e| {
        KernelError::Cuda(CudaError::Driver {
            rank,
            call: "cuLaunchKernel",
            detail: format!("{e:?}"),
        })
    })
}
