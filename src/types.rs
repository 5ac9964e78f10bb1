//! Plain types shared by the Rust API, the server, the engines and the C ABI.

use crate::error::{Error, Result, Status};

/// Largest `k` a recall may ask for.
pub const MAX_K: usize = 1024;
/// Largest number of namespaces in one recall filter.
pub const MAX_FILTER_NAMESPACES: usize = 64;
/// Largest supported vector dimension.
pub const MAX_DIM: usize = 65536;

/// Similarity metric, fixed when the store is created.
///
/// Scores returned to callers:
/// - `InnerProduct`: `q·x`, higher is better.
/// - `Cosine`: `q·x / (|q||x|)`, higher is better. Vectors are stored normalised.
/// - `L2`: squared Euclidean distance `|q-x|²`, **lower** is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    InnerProduct = 0,
    Cosine = 1,
    L2 = 2,
}

impl Metric {
    pub fn from_u32(v: u32) -> Result<Metric> {
        match v {
            0 => Ok(Metric::InnerProduct),
            1 => Ok(Metric::Cosine),
            2 => Ok(Metric::L2),
            _ => Err(Error::new(Status::InvalidArgument, format!("unknown metric {v} (0=ip, 1=cosine, 2=l2)"))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Metric::InnerProduct => "ip",
            Metric::Cosine => "cosine",
            Metric::L2 => "l2",
        }
    }
    pub fn parse(s: &str) -> Result<Metric> {
        match s.to_ascii_lowercase().as_str() {
            "ip" | "dot" | "inner_product" => Ok(Metric::InnerProduct),
            "cos" | "cosine" => Ok(Metric::Cosine),
            "l2" | "euclidean" => Ok(Metric::L2),
            _ => Err(Error::new(Status::InvalidArgument, format!("unknown metric {s:?} (ip, cosine, l2)"))),
        }
    }
    /// True when a lower score is better.
    pub fn lower_is_better(self) -> bool {
        self == Metric::L2
    }
}

/// Element type of the stored table (the CPU engine always keeps f32; f16/bf16 apply to the GPU copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32 = 0,
    F16 = 1,
    Bf16 = 2,
}

impl Dtype {
    pub fn from_u32(v: u32) -> Result<Dtype> {
        match v {
            0 => Ok(Dtype::F32),
            1 => Ok(Dtype::F16),
            2 => Ok(Dtype::Bf16),
            _ => Err(Error::new(Status::InvalidArgument, format!("unknown dtype {v} (0=f32, 1=f16, 2=bf16)"))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }
    pub fn parse(s: &str) -> Result<Dtype> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Dtype::F32),
            "f16" | "float16" | "half" => Ok(Dtype::F16),
            "bf16" | "bfloat16" => Ok(Dtype::Bf16),
            _ => Err(Error::new(Status::InvalidArgument, format!("unknown dtype {s:?} (f32, f16, bf16)"))),
        }
    }
}

/// How an engine scans the table: every score exact, or an 8-bit scan of a quantized copy whose
/// best candidates are re-scored exactly (`engine::quant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scan {
    #[default]
    Exact = 0,
    Int8 = 1,
}

impl Scan {
    pub fn from_u32(v: u32) -> Result<Scan> {
        match v {
            0 => Ok(Scan::Exact),
            1 => Ok(Scan::Int8),
            _ => Err(Error::new(Status::InvalidArgument, format!("unknown scan {v} (0=exact, 1=int8)"))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Scan::Exact => "exact",
            Scan::Int8 => "int8",
        }
    }
    pub fn parse(s: &str) -> Result<Scan> {
        match s.to_ascii_lowercase().as_str() {
            "exact" => Ok(Scan::Exact),
            "int8" => Ok(Scan::Int8),
            _ => Err(Error::new(Status::InvalidArgument, format!("unknown scan {s:?} (exact, int8)"))),
        }
    }
}

/// How a sharded store (option `device_shards` > 1) assigns memories to its shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Placement {
    /// By a hash of the id: shards stay within a few rows of each other whatever the namespaces,
    /// and every recall scans every shard.
    #[default]
    Id = 0,
    /// By a hash of the namespace: a recall scoped to namespaces scans only the shards that hold
    /// them, but one large namespace fills its shard alone.
    Namespace = 1,
}

impl Placement {
    pub fn from_u32(v: u32) -> Result<Placement> {
        match v {
            0 => Ok(Placement::Id),
            1 => Ok(Placement::Namespace),
            _ => Err(Error::new(Status::InvalidArgument, format!("unknown placement {v} (0=id, 1=namespace)"))),
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Placement::Id => "id",
            Placement::Namespace => "namespace",
        }
    }
    pub fn parse(s: &str) -> Result<Placement> {
        match s.to_ascii_lowercase().as_str() {
            "id" => Ok(Placement::Id),
            "namespace" => Ok(Placement::Namespace),
            _ => Err(Error::new(Status::InvalidArgument, format!("unknown placement {s:?} (id, namespace)"))),
        }
    }
}

/// Which side of the segment a handle takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Attach to a live server, else become it.
    Auto = 0,
    /// Create the segment and run the server thread in this process.
    Server = 1,
    /// Attach to an existing live server.
    Client = 2,
}

impl Role {
    pub fn from_u32(v: u32) -> Result<Role> {
        match v {
            0 => Ok(Role::Auto),
            1 => Ok(Role::Server),
            2 => Ok(Role::Client),
            _ => Err(Error::new(Status::InvalidArgument, format!("unknown role {v} (0=auto, 1=server, 2=client)"))),
        }
    }
}

/// Engine selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Auto = 0,
    Cpu = 1,
    Cuda = 2,
}

impl Backend {
    pub fn from_u32(v: u32) -> Result<Backend> {
        match v {
            0 => Ok(Backend::Auto),
            1 => Ok(Backend::Cpu),
            2 => Ok(Backend::Cuda),
            _ => Err(Error::new(Status::InvalidArgument, format!("unknown backend {v} (0=auto, 1=cpu, 2=cuda)"))),
        }
    }
    pub fn parse(s: &str) -> Result<Backend> {
        match s.to_ascii_lowercase().as_str() {
            "auto" | "" => Ok(Backend::Auto),
            "cpu" => Ok(Backend::Cpu),
            "cuda" | "gpu" => Ok(Backend::Cuda),
            _ => Err(Error::new(Status::InvalidArgument, format!("unknown backend {s:?} (cpu, cuda, auto)"))),
        }
    }
}

/// WAL sync policy (see docs/DURABILITY.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncPolicy {
    /// fsync before every acknowledgement (group commit per server batch).
    Always = 0,
    /// fsync at most every `sync_interval_ms`; a crash of the machine may lose that window.
    Interval = 1,
    /// Never fsync; the OS writes back when it likes.
    Never = 2,
}

impl SyncPolicy {
    pub fn from_u32(v: u32) -> Result<SyncPolicy> {
        match v {
            0 => Ok(SyncPolicy::Always),
            1 => Ok(SyncPolicy::Interval),
            2 => Ok(SyncPolicy::Never),
            _ => Err(Error::new(Status::InvalidArgument, format!("unknown sync policy {v} (0=always, 1=interval, 2=never)"))),
        }
    }
}

/// One recall result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Hit {
    pub id: u64,
    pub score: f32,
}

/// Recency weighting: `score' = (1-w)·score + w·2^(-age/half_life)`, age = now − created.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recency {
    pub weight: f32,
    pub half_life_ms: f64,
}

/// What a recall is allowed to see.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Filter {
    /// `None` = every namespace; otherwise a sorted, deduplicated list (≤ 64).
    pub namespaces: Option<Vec<u64>>,
    /// A checked metadata filter expression (`None` = no condition on fields); a row must pass
    /// both the namespace list and the expression.
    pub expr: Option<std::sync::Arc<crate::filter::Compiled>>,
}

impl Filter {
    pub fn all() -> Filter {
        Filter { namespaces: None, expr: None }
    }
    pub fn new(ns: &[u64]) -> Result<Filter> {
        if ns.len() > MAX_FILTER_NAMESPACES {
            return Err(Error::new(
                Status::InvalidArgument,
                format!("namespace filter has {} entries; at most {MAX_FILTER_NAMESPACES}", ns.len()),
            ));
        }
        let mut v = ns.to_vec();
        v.sort_unstable();
        v.dedup();
        Ok(Filter { namespaces: Some(v), expr: None })
    }
    /// The same filter with the metadata expression `bytes` (its binary form), decoded and
    /// checked ([`crate::filter::Expr::decode`]).
    pub fn with_expr(mut self, bytes: &[u8]) -> Result<Filter> {
        self.expr = Some(std::sync::Arc::new(crate::filter::Compiled::new(bytes)?));
        Ok(self)
    }
    #[inline]
    pub fn matches(&self, ns: u64) -> bool {
        match &self.namespaces {
            None => true,
            Some(v) if v.len() == 1 => v[0] == ns,
            Some(v) if v.len() <= 8 => v.contains(&ns),
            Some(v) => v.binary_search(&ns).is_ok(),
        }
    }
}

/// Sum of squares of `v` in f64: finite for every finite f32 vector.
pub fn squared_norm(v: &[f32]) -> f64 {
    v.iter().map(|&x| (x as f64) * (x as f64)).sum()
}

/// The f32 factor 1/n that scales a vector of norm `n` > 0 (from [`squared_norm`]) to unit
/// length, when it is a normal f32 (the CUDA engine's convert_queries applies the same factor);
/// None for norms below about 1e-38 or above about 1e38, whose values are scaled one by one in
/// f64 instead ([`scale_to_unit`]).
fn unit_factor(n: f64) -> Option<f32> {
    Some((1.0 / n) as f32).filter(|f| f.is_normal())
}

/// Writes `src` (norm `n` > 0) scaled to unit length into `dst`, without overflow or underflow
/// to zero of the factor: every value written is finite.
pub fn scale_to_unit(src: &[f32], dst: &mut [f32], n: f64) {
    match unit_factor(n) {
        Some(f) => dst.iter_mut().zip(src).for_each(|(d, &x)| *d = x * f),
        None => dst.iter_mut().zip(src).for_each(|(d, &x)| *d = (x as f64 / n) as f32),
    }
}

/// Cosine: scales each query (`dim` values; finite) to unit length as [`scale_to_unit`] does. An
/// all-zero query is an INVALID_ARGUMENT.
pub fn normalize_queries(q: &mut [f32], dim: usize) -> Result<()> {
    for row in q.chunks_exact_mut(dim) {
        let n = squared_norm(row).sqrt();
        if n == 0.0 {
            return Err(Error::new(Status::InvalidArgument, "a cosine query must not be all zeros"));
        }
        match unit_factor(n) {
            Some(f) => row.iter_mut().for_each(|x| *x *= f),
            None => row.iter_mut().for_each(|x| *x = (*x as f64 / n) as f32),
        }
    }
    Ok(())
}

/// A duration in nanoseconds, saturating at `u64::MAX` (584 years).
pub fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Validates a store name: 1..=200 chars of `[A-Za-z0-9._-]`, not starting with '.'.
pub fn validate_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            Status::InvalidName,
            format!("invalid store name {name:?}: use 1-200 characters of A-Z a-z 0-9 . _ - not starting with '.'"),
        ))
    }
}

/// Checks that every value is finite.
pub fn check_finite(v: &[f32], what: &str) -> Result<()> {
    match first_non_finite(v) {
        Some(i) => Err(non_finite(what, v[i], i)),
        None => Ok(()),
    }
}

/// The index of the first NaN or infinity in `v`. Branch-free over blocks of 64 (the compiler
/// vectorises the fold; an early-exit scan does not): batches of megabytes are checked.
pub fn first_non_finite(v: &[f32]) -> Option<usize> {
    v.chunks(64)
        .enumerate()
        .find(|(_, c)| !c.iter().fold(true, |ok, x| ok & x.is_finite()))
        .map(|(b, c)| b * 64 + c.iter().position(|x| !x.is_finite()).unwrap_or(0))
}

/// The NON_FINITE error for `value`, found at index `at` of the caller's `what`.
pub fn non_finite(what: &str, value: f32, at: usize) -> Error {
    Error::new(Status::NonFinite, format!("{what} holds a non-finite value ({value}) at index {at}"))
}

pub fn check_k(k: usize) -> Result<()> {
    if k == 0 || k > MAX_K {
        return Err(Error::new(Status::KOutOfRange, format!("k = {k}; k must be between 1 and {MAX_K}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_finite_reports_the_first_bad_index_in_any_block() {
        let n = 64 * 5 + 7;
        assert!(check_finite(&vec![1.5f32; n], "v").is_ok());
        assert!(check_finite(&[], "v").is_ok());
        for &bad in &[f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for &i in &[0, 1, 63, 64, 65, 127, 200, n - 1] {
                let mut v = vec![0.25f32; n];
                v[i] = bad;
                if i + 3 < n {
                    v[i + 3] = f32::NAN; // a later bad value must not be the one reported
                }
                let e = check_finite(&v, "v").unwrap_err();
                assert_eq!(e.status, Status::NonFinite);
                assert!(e.message.ends_with(&format!("at index {i}")), "{}", e.message);
            }
        }
    }
}
