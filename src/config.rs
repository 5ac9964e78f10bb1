//! Settings, at the bottom of the crate: [`Options`], the public settings of one open (from the
//! C struct `kalos_options` and the bindings), and [`Tuning`], the internal knobs that come from
//! the environment. The environment is read once, on the first open of the process, into one
//! [`Tuning`]; nothing else in the crate reads `KALOS_*` variables.
//!
//! The variables, their defaults and effects are listed in one table: docs/CONFIG.md.
//!
//! A value that does not parse fails the open with `INVALID_ARGUMENT` naming the variable.
//!
//! [`Tuning`]: crate::config::Tuning

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::error::{Error, Result, Status};
use crate::types::{Backend, Dtype, Metric, Placement, Role, Scan, SyncPolicy};

/// Client busy-wait cap: see [`Options::client_spin_ns`].
pub const ADAPTIVE_SPIN_CAP: std::time::Duration = std::time::Duration::from_micros(500);

/// Options for [`crate::Kalos::open`]. `Options::default()` gives the documented defaults.
#[derive(Debug, Clone)]
pub struct Options {
    pub role: Role,
    /// Vector dimension. Required to create a store; for a client, 0 accepts the server's and a
    /// non-zero value must match it.
    pub dim: u32,
    pub metric: Metric,
    pub dtype: Dtype,
    pub backend: Backend,
    /// Maximum number of memories (rows).
    pub capacity: u64,
    /// Request slots in the segment (concurrent requests in flight).
    pub slots: u32,
    /// Data bytes per slot: bounds one request/response (larger calls are split where possible).
    pub slot_bytes: u32,
    /// Permission bits of the segment (default 0o600).
    pub mode: u32,
    pub max_payload_bytes: u32,
    /// Client busy-wait before sleeping on the futex (0 = sleep at once); stretched to twice the
    /// handle's recent answer time, at most [`ADAPTIVE_SPIN_CAP`]. When the expected answer is far
    /// enough off, the client sleeps on the futex until shortly before it and polls only across
    /// the recent answers' spread (at most half the cap a side).
    pub client_spin_ns: u64,
    /// Server busy-poll window after its last request before it parks (0 = park at once).
    pub server_spin_ns: u64,
    /// Default deadline of every blocking call.
    pub timeout_ms: u64,
    /// A server whose heartbeat is older than this is treated as gone.
    pub heartbeat_timeout_ms: u64,
    /// Write-ahead log and snapshots directory. `None` with role auto: the store's default
    /// directory ([`default_data_dir`]) unless `ephemeral`; `None` with role server: memory only.
    pub data_dir: Option<PathBuf>,
    /// Role auto without a `data_dir`: keep the store in memory only, so it lives exactly as long
    /// as its server process and no surviving process can take it over. Ignored otherwise.
    pub ephemeral: bool,
    pub sync: SyncPolicy,
    pub sync_interval_ms: u64,
    /// CPU engine threads (0 = all cores).
    pub threads: u32,
    /// GPU memory the CUDA engine may use for the table (0 = 90% of free memory).
    pub gpu_memory_bytes: u64,
    /// Exact scan, or an 8-bit scan with exact re-ranking of the best candidates.
    pub scan: Scan,
    /// Candidates re-ranked per query by the int8 scan (0 = adapt to k:
    /// `crate::engine::quant::rerank_count`); at most [`MAX_RERANK`].
    pub rerank: u32,
    /// Shards the table is split into (0 or 1 = one table). Each shard is a table of its own with
    /// its own engine on its own thread; a recall scans the shards in parallel and merges their
    /// top-k into the exact global top-k. At most [`MAX_DEVICE_SHARDS`].
    pub device_shards: u32,
    /// How memories are assigned to shards.
    pub placement: Placement,
    /// The GPUs a CUDA store spreads over, as a bit mask of device ordinals (bit i = device i;
    /// [`GPUS_ALL`] = every device; 0 = device 0 alone). With more than one device the table is
    /// sharded: `max(device_shards, devices)` shards, shard i on the i-th device modulo their
    /// number.
    pub gpus: u64,
}

/// `gpus` value that selects every CUDA device of the host.
pub const GPUS_ALL: u64 = u64::MAX;

/// Largest `device_shards` option.
pub const MAX_DEVICE_SHARDS: u32 = 64;

/// Largest `rerank` option (candidates re-scored exactly per query in the int8 scan).
pub const MAX_RERANK: u32 = 65536;

impl Default for Options {
    fn default() -> Options {
        Options {
            role: Role::Auto,
            dim: 0,
            metric: Metric::Cosine,
            dtype: Dtype::F32,
            backend: Backend::Auto,
            capacity: 1 << 20,
            slots: 32,
            slot_bytes: 1 << 20,
            mode: 0o600,
            max_payload_bytes: 64 * 1024,
            client_spin_ns: 50_000,
            server_spin_ns: 2_000_000,
            timeout_ms: 5_000,
            heartbeat_timeout_ms: 10_000,
            data_dir: None,
            ephemeral: false,
            sync: SyncPolicy::Always,
            sync_interval_ms: 100,
            threads: 0,
            gpu_memory_bytes: 0,
            scan: Scan::Exact,
            rerank: 0,
            device_shards: 0,
            placement: Placement::Id,
            gpus: 0,
        }
    }
}

/// The internal knobs (see the module's table). `None` means "the built-in default"; the flags
/// hold their value, default included ([`Tuning::from_lookup`] with nothing set gives every
/// default). `Tuning::default()` is the tuning of an empty environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuning {
    pub backend: Option<Backend>,
    pub cpu_threads: Option<usize>,
    pub cpu_scan_isa: Option<String>,
    pub cpu_parallel_min_bytes: Option<usize>,
    pub cpu_spin_ns: Option<u64>,
    /// `KALOS_CPU_PIN` (default on): pin a server's CPU engine threads apart when its workers
    /// sleep between jobs.
    pub cpu_pin: bool,
    pub gpu_min_work: Option<usize>,
    pub gpu_min_split_bytes: Option<usize>,
    pub compact_min_bytes: Option<u64>,
    /// The permission bits a data directory may have (`KALOS_DATA_DIR_MODE`); `None` = 0700.
    pub data_dir_mode: Option<u32>,
    pub copy_threads: Option<usize>,
    pub copy_streaming: bool,
    pub client_trace: bool,
    pub cuda_report: bool,
    /// `KALOS_SERVER_REPORT`: the server thread prints where its passes' time went when it stops.
    pub server_report: bool,
    pub prof: bool,
    pub cuda_fault_after: Option<u64>,
    pub gather_us: Option<u64>,
    /// The most queries a multi-query pass takes (`KALOS_MULTI_MAXQ`, 0 to 32; 0 = never).
    pub multi_maxq: Option<usize>,
    /// Candidates of the CUDA int8 scan's 4-bit first pass (`KALOS_INT8_NIBBLE`; unset or 0: no
    /// first pass; else 2 to 256).
    pub int8_nibble: Option<usize>,
    /// `KALOS_HUGE_PAGES` (default on): back the table's vectors with transparent huge pages.
    pub huge_pages: bool,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning::from_lookup(|_| None).expect("the built-in defaults parse")
    }
}

impl Tuning {
    /// Every knob from `var` (the environment, or a map in tests).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Tuning> {
        fn num<T: std::str::FromStr>(var: &impl Fn(&str) -> Option<String>, name: &str) -> Result<Option<T>> {
            match var(name) {
                None => Ok(None),
                Some(s) => s.trim().parse().map(Some).map_err(|_| bad(name, &s, "a non-negative integer")),
            }
        }
        fn flag(var: &impl Fn(&str) -> Option<String>, name: &str, default: bool) -> Result<bool> {
            match var(name).as_deref().map(str::trim) {
                None => Ok(default),
                Some("1") => Ok(true),
                Some("0") => Ok(false),
                Some(s) => Err(bad(name, s, "0 or 1")),
            }
        }
        let backend = match var("KALOS_BACKEND") {
            None => None,
            Some(s) => Some(Backend::parse(&s).map_err(|_| bad("KALOS_BACKEND", &s, "cpu, cuda or auto"))?),
        };
        let cpu_scan_isa = match var("KALOS_CPU_SCAN_ISA") {
            None => None,
            Some(s) if ["scalar", "avx2", "avx512"].contains(&s.as_str()) => Some(s),
            Some(s) => return Err(bad("KALOS_CPU_SCAN_ISA", &s, "scalar, avx2 or avx512")),
        };
        let cpu_threads: Option<usize> = num(&var, "KALOS_CPU_THREADS")?;
        if cpu_threads == Some(0) {
            return Err(bad("KALOS_CPU_THREADS", "0", "a positive integer"));
        }
        let data_dir_mode = match var("KALOS_DATA_DIR_MODE") {
            None => None,
            Some(s) => match u32::from_str_radix(s.trim(), 8) {
                // The owner keeps rwx; group and others may get read and search, never write.
                Ok(m) if s.trim().bytes().all(|b| b.is_ascii_digit()) && m & !0o777 == 0 && m & 0o700 == 0o700 && m & 0o022 == 0 => Some(m),
                _ => {
                    return Err(bad(
                        "KALOS_DATA_DIR_MODE",
                        &s,
                        "octal permission bits that include 0700 and give group and others no write permission, e.g. 0750",
                    ))
                }
            },
        };
        let copy_threads: Option<usize> = num(&var, "KALOS_COPY_THREADS")?;
        if let Some(n) = copy_threads.filter(|n| !(1..=16).contains(n)) {
            return Err(bad("KALOS_COPY_THREADS", &n.to_string(), "1 to 16"));
        }
        let multi_maxq: Option<usize> = num(&var, "KALOS_MULTI_MAXQ")?;
        if let Some(n) = multi_maxq.filter(|n| *n > 32) {
            return Err(bad("KALOS_MULTI_MAXQ", &n.to_string(), "0 to 32"));
        }
        let int8_nibble: Option<usize> = num(&var, "KALOS_INT8_NIBBLE")?;
        if let Some(n) = int8_nibble.filter(|n| *n == 1 || *n > 256) {
            return Err(bad("KALOS_INT8_NIBBLE", &n.to_string(), "0 (off) or 2 to 256"));
        }
        Ok(Tuning {
            backend,
            cpu_threads,
            cpu_scan_isa,
            cpu_parallel_min_bytes: num(&var, "KALOS_CPU_PARALLEL_MIN_BYTES")?,
            cpu_spin_ns: num(&var, "KALOS_CPU_SPIN_NS")?,
            cpu_pin: flag(&var, "KALOS_CPU_PIN", true)?,
            gpu_min_work: num(&var, "KALOS_GPU_MIN_WORK")?,
            gpu_min_split_bytes: num(&var, "KALOS_GPU_MIN_SPLIT_BYTES")?,
            compact_min_bytes: num(&var, "KALOS_COMPACT_MIN_BYTES")?,
            data_dir_mode,
            copy_threads,
            copy_streaming: flag(&var, "KALOS_COPY_NT", true)?,
            huge_pages: flag(&var, "KALOS_HUGE_PAGES", true)?,
            client_trace: flag(&var, "KALOS_CLIENT_TRACE", false)?,
            cuda_report: flag(&var, "KALOS_CUDA_REPORT", false)?,
            server_report: flag(&var, "KALOS_SERVER_REPORT", false)?,
            prof: flag(&var, "KALOS_PROF", false)?,
            cuda_fault_after: num(&var, "KALOS_CUDA_FAULT_AFTER")?,
            gather_us: num(&var, "KALOS_GATHER_US")?,
            multi_maxq,
            int8_nibble,
        })
    }
}

fn bad(name: &str, value: &str, want: &str) -> Error {
    Error::new(Status::InvalidArgument, format!("environment variable {name}={value:?}: expected {want}"))
}

/// The directory where role auto keeps the store `name` when the caller gives no `data_dir` and
/// does not ask for an ephemeral store: `$XDG_DATA_HOME/kalos/<name>`, or
/// `$HOME/.local/share/kalos/<name>` when `XDG_DATA_HOME` is unset, empty or relative (the XDG
/// base directory rules). Read at every open, not once: these are the user's, not Kalos's.
pub fn default_data_dir(name: &str) -> Result<PathBuf> {
    default_data_dir_from(name, |v| std::env::var_os(v))
}

fn default_data_dir_from(name: &str, var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Result<PathBuf> {
    let xdg = var("XDG_DATA_HOME").map(PathBuf::from).filter(|p| p.is_absolute());
    let base = match xdg {
        Some(x) => x,
        None => match var("HOME").map(PathBuf::from).filter(|p| p.is_absolute()) {
            Some(h) => h.join(".local").join("share"),
            None => {
                return Err(Error::new(
                    Status::InvalidArgument,
                    "role auto keeps a store under $XDG_DATA_HOME/kalos or $HOME/.local/share/kalos, and neither is set to an absolute path: give a data_dir or ask for an ephemeral store",
                ))
            }
        },
    };
    Ok(base.join("kalos").join(name))
}

/// The process's tuning, read from the environment on the first call (the first open) and kept
/// for the life of the process. An unparsable variable fails every open with its message.
pub fn tuning() -> Result<&'static Tuning> {
    static T: OnceLock<std::result::Result<Tuning, Error>> = OnceLock::new();
    T.get_or_init(|| Tuning::from_lookup(|name| std::env::var(name).ok())).as_ref().map_err(Clone::clone)
}

/// The tuning for code that runs only after an open succeeded (so [`tuning`] has been read and
/// is valid); built-in defaults otherwise.
pub fn tuning_or_default() -> &'static Tuning {
    static DEFAULT: OnceLock<Tuning> = OnceLock::new();
    tuning().unwrap_or_else(|_| DEFAULT.get_or_init(Tuning::default))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with(pairs: &[(&str, &str)]) -> Result<Tuning> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Tuning::from_lookup(|n| m.get(n).cloned())
    }

    #[test]
    fn defaults_when_nothing_is_set() {
        let t = with(&[]).unwrap();
        assert_eq!(
            t,
            Tuning {
                backend: None,
                cpu_threads: None,
                cpu_scan_isa: None,
                cpu_parallel_min_bytes: None,
                cpu_spin_ns: None,
                cpu_pin: true,
                gpu_min_work: None,
                gpu_min_split_bytes: None,
                compact_min_bytes: None,
                data_dir_mode: None,
                copy_threads: None,
                copy_streaming: true,
                client_trace: false,
                cuda_report: false,
                server_report: false,
                prof: false,
                cuda_fault_after: None,
                gather_us: None,
                multi_maxq: None,
                int8_nibble: None,
                huge_pages: true,
            }
        );
        assert_eq!(Tuning::default(), t);
    }

    #[test]
    fn every_variable_is_read() {
        let t = with(&[
            ("KALOS_BACKEND", "cpu"),
            ("KALOS_CPU_THREADS", "3"),
            ("KALOS_CPU_SCAN_ISA", "scalar"),
            ("KALOS_CPU_PARALLEL_MIN_BYTES", "4096"),
            ("KALOS_CPU_SPIN_NS", "1000"),
            ("KALOS_CPU_PIN", "0"),
            ("KALOS_GPU_MIN_WORK", "77"),
            ("KALOS_GPU_MIN_SPLIT_BYTES", "0"),
            ("KALOS_COMPACT_MIN_BYTES", "32768"),
            ("KALOS_DATA_DIR_MODE", "0750"),
            ("KALOS_COPY_THREADS", "2"),
            ("KALOS_COPY_NT", "0"),
            ("KALOS_CLIENT_TRACE", "1"),
            ("KALOS_CUDA_REPORT", "1"),
            ("KALOS_SERVER_REPORT", "1"),
            ("KALOS_PROF", "1"),
            ("KALOS_CUDA_FAULT_AFTER", "5"),
            ("KALOS_GATHER_US", "0"),
            ("KALOS_MULTI_MAXQ", "8"),
            ("KALOS_INT8_NIBBLE", "128"),
            ("KALOS_HUGE_PAGES", "0"),
        ])
        .unwrap();
        assert_eq!(
            t,
            Tuning {
                backend: Some(Backend::Cpu),
                cpu_threads: Some(3),
                cpu_scan_isa: Some("scalar".into()),
                cpu_parallel_min_bytes: Some(4096),
                cpu_spin_ns: Some(1000),
                cpu_pin: false,
                gpu_min_work: Some(77),
                gpu_min_split_bytes: Some(0),
                compact_min_bytes: Some(32768),
                data_dir_mode: Some(0o750),
                copy_threads: Some(2),
                copy_streaming: false,
                client_trace: true,
                cuda_report: true,
                server_report: true,
                prof: true,
                cuda_fault_after: Some(5),
                gather_us: Some(0),
                multi_maxq: Some(8),
                int8_nibble: Some(128),
                huge_pages: false,
            }
        );
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("KALOS_BACKEND", "tpu"),
            ("KALOS_CPU_THREADS", "0"),
            ("KALOS_CPU_THREADS", "many"),
            ("KALOS_CPU_SCAN_ISA", "sse9"),
            ("KALOS_COPY_THREADS", "99"),
            ("KALOS_COPY_NT", "yes"),
            ("KALOS_COMPACT_MIN_BYTES", "-1"),
            ("KALOS_CUDA_FAULT_AFTER", "x"),
            ("KALOS_DATA_DIR_MODE", "0777"),
            ("KALOS_DATA_DIR_MODE", "0770"),
            ("KALOS_DATA_DIR_MODE", "0600"),
            ("KALOS_DATA_DIR_MODE", "01750"),
            ("KALOS_DATA_DIR_MODE", "0758"),
            ("KALOS_DATA_DIR_MODE", "+750"),
            ("KALOS_DATA_DIR_MODE", "rwxr-x---"),
            ("KALOS_GATHER_US", "soon"),
            ("KALOS_MULTI_MAXQ", "33"),
            ("KALOS_INT8_NIBBLE", "1"),
            ("KALOS_INT8_NIBBLE", "257"),
            ("KALOS_HUGE_PAGES", "yes"),
        ] {
            let e = with(&[(k, v)]).unwrap_err();
            assert_eq!(e.status, Status::InvalidArgument);
            assert!(e.message.contains(k), "{}", e.message);
        }
    }

    #[test]
    fn default_data_dir_follows_xdg() {
        use std::ffi::OsString;
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |n: &str| pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| OsString::from(v))
        };
        let d = |pairs| default_data_dir_from("chat", env(pairs));
        assert_eq!(d(&[("XDG_DATA_HOME", "/x/data"), ("HOME", "/home/u")]).unwrap(), PathBuf::from("/x/data/kalos/chat"));
        assert_eq!(d(&[("HOME", "/home/u")]).unwrap(), PathBuf::from("/home/u/.local/share/kalos/chat"));
        assert_eq!(d(&[("XDG_DATA_HOME", "rel"), ("HOME", "/home/u")]).unwrap(), PathBuf::from("/home/u/.local/share/kalos/chat"));
        assert_eq!(d(&[("XDG_DATA_HOME", ""), ("HOME", "/home/u")]).unwrap(), PathBuf::from("/home/u/.local/share/kalos/chat"));
        let e = d(&[]).unwrap_err();
        assert_eq!(e.status, Status::InvalidArgument);
        assert!(e.message.contains("ephemeral"), "{}", e.message);
    }

    #[test]
    fn data_dir_mode_is_octal_owner_rwx_and_no_write_for_others() {
        for (v, m) in [("0700", 0o700), ("700", 0o700), ("0750", 0o750), (" 0755 ", 0o755), ("0710", 0o710)] {
            assert_eq!(with(&[("KALOS_DATA_DIR_MODE", v)]).unwrap().data_dir_mode, Some(m), "{v:?}");
        }
        assert_eq!(with(&[]).unwrap().data_dir_mode, None);
    }
}
