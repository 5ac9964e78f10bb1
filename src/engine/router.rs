//! Which engine serves: the backend choice when the server starts, and the CPU engine that takes
//! over when the CUDA engine fails while serving. The [`Router`] keeps why the CUDA engine is not
//! serving and how often it failed, for the server's stats.

use std::sync::Arc;
use std::time::Duration;

use super::cpu::CpuEngine;
use super::shard::ShardedEngine;
use super::{cuda, Engine, EngineKind};
use crate::config::{Options, GPUS_ALL};
use crate::error::{Error, Result, Status};
use crate::store::Store;
use crate::types::{Backend, Scan};

/// Resolves the engine choice: an explicit option wins; with `Auto`, `KALOS_BACKEND` decides.
pub fn resolve_backend(opt: Backend) -> Result<Backend> {
    if opt != Backend::Auto {
        return Ok(opt);
    }
    Ok(crate::config::tuning()?.backend.unwrap_or(Backend::Auto))
}

/// The device ordinals `gpus` selects among the host's CUDA devices (0 = device 0 alone,
/// [`GPUS_ALL`] = every device), in order. BACKEND_UNAVAILABLE when the host has no usable CUDA
/// device; INVALID_ARGUMENT when `gpus` names a device the host does not have.
fn selected_devices(gpus: u64) -> Result<Vec<i32>> {
    let count = cuda::device_count().min(64);
    if count == 0 {
        return Err(Error::new(Status::BackendUnavailable, "no usable CUDA device (driver, libraries or GPU missing)"));
    }
    let mask = match gpus {
        0 => 1,
        GPUS_ALL => GPUS_ALL,
        m => {
            if let Some(d) = (count as u32..64).find(|&d| m & (1u64 << d) != 0) {
                return Err(Error::new(Status::InvalidArgument, format!("gpus names device {d}; this host has {count} CUDA devices")));
            }
            m
        }
    };
    Ok((0..count as i32).filter(|&d| mask & (1u64 << d) != 0).collect())
}

/// The server's engine choice, made once at start and revised only by a CUDA failure.
#[derive(Debug)]
pub struct Router {
    /// CPU engine threads and spin window (options `threads`, `server_spin_ns`).
    threads: usize,
    spin_ns: u64,
    /// Options `scan` and `rerank`, for the CPU engine.
    scan: Scan,
    rerank: u32,
    fallbacks: u64,
    reason: String,
    /// Int8-scan counts of engines that were replaced ([`Engine::rerank_counts`]).
    carried: (u64, u64),
}

impl Router {
    /// The engine for `backend` (already resolved, [`resolve_backend`]) and its router. Under
    /// `Auto` the CPU engine serves when the CUDA engine cannot start (no driver, a compile error,
    /// out of memory, an unsupported device); the router keeps why.
    pub fn start(backend: Backend, opts: &Options, store: &Store) -> Result<(Box<dyn Engine>, Router)> {
        let mut router = Router {
            threads: opts.threads as usize,
            spin_ns: opts.server_spin_ns,
            scan: opts.scan,
            rerank: opts.rerank,
            fallbacks: 0,
            reason: String::new(),
            carried: (0, 0),
        };
        let shards = opts.device_shards as usize;
        // The GPUs to use: device 0 unless `gpus` names others (checked against the host).
        let devices = match backend {
            Backend::Cpu => Ok(Vec::new()),
            _ if opts.gpus == 0 && shards <= 1 => Ok(vec![0]),
            _ => selected_devices(opts.gpus),
        };
        let devices = match (devices, backend) {
            (Ok(d), _) => d,
            (Err(e), Backend::Cuda) => return Err(e),
            (Err(e), _) => {
                router.reason = e.message;
                Vec::new()
            }
        };
        if shards > 1 || devices.len() > 1 {
            return router.sharded(backend, opts, store, devices).map(|e| (e, router));
        }
        let engine = match (backend, devices.first()) {
            (Backend::Cpu, _) | (Backend::Auto, None) => router.cpu(),
            (Backend::Cuda, d) => cuda::create_on(opts, store, d.copied().unwrap_or(0), false)?,
            // Auto: the GPU when one is usable, with a cost model that keeps requests too small to
            // pay for a GPU round trip on the CPU (cuda::create_auto); else the CPU engine.
            (Backend::Auto, Some(&d)) => match cuda::create_on(opts, store, d, true) {
                Ok(e) => e,
                Err(e) => {
                    router.reason = e.message;
                    router.cpu()
                }
            },
        };
        Ok((engine, router))
    }

    /// A store split into shards: `max(device_shards, devices)` of them, shard i served by the
    /// CUDA engine on `devices[i % devices.len()]` (backends cuda and auto), or by a CPU engine
    /// each (backend cpu, or auto when no GPU is selected or the GPU shards cannot start; the
    /// router keeps why). Shards that share a device share its memory budget.
    fn sharded(&mut self, backend: Backend, opts: &Options, store: &Store, devices: Vec<i32>) -> Result<Box<dyn Engine>> {
        let n = (opts.device_shards as usize).max(devices.len());
        let cores = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
        // As the unsharded engine: all but one core (the clients') on hosts of 8 or more.
        let total = match self.threads {
            0 if cores >= super::cpu::SPIN_MIN_CORES => cores - 1,
            0 => cores,
            t => t,
        };
        let per = (total / n).max(1);
        // Shard threads poll between jobs only where every polling thread (each shard's engine
        // threads and the server thread) has a core of its own.
        let worker_spin = Duration::from_nanos(if cores >= super::cpu::SPIN_MIN_CORES && n * per < cores { self.spin_ns } else { 0 });
        if backend != Backend::Cpu {
            let gpu = if devices.is_empty() {
                Err(Error::new(Status::BackendUnavailable, self.reason.clone()))
            } else {
                let (o, hybrid, devs) = (opts.clone(), backend == Backend::Auto, devices.clone());
                let factory = move |i: usize, st: &Store| -> Result<Box<dyn Engine>> {
                    let dev = devs[i % devs.len()];
                    let share = (0..n).filter(|j| devs[j % devs.len()] == dev).count();
                    let mut o = o.clone();
                    o.threads = per as u32;
                    if share > 1 {
                        let budget =
                            if o.gpu_memory_bytes > 0 { o.gpu_memory_bytes as usize } else { cuda::device_free_memory(dev)? / 10 * 9 };
                        o.gpu_memory_bytes = (budget / share) as u64;
                    }
                    cuda::create_on(&o, st, dev, hybrid)
                };
                ShardedEngine::new(n, opts.placement, store, worker_spin, Arc::new(factory))
            };
            match (gpu, backend) {
                (Ok(e), _) => return Ok(Box::new(e)),
                (Err(e), Backend::Cuda) => return Err(e),
                (Err(e), _) => self.reason = e.message,
            }
        }
        let (spin_ns, scan, rerank) = (self.spin_ns, self.scan, self.rerank);
        let factory = move |_: usize, _: &Store| -> Result<Box<dyn Engine>> {
            let mut e = CpuEngine::for_server(per, spin_ns);
            e.set_scan(scan, rerank);
            Ok(Box::new(e))
        };
        Ok(Box::new(ShardedEngine::new(n, opts.placement, store, worker_spin, Arc::new(factory))?))
    }

    fn cpu(&self) -> Box<dyn Engine> {
        let mut e = CpuEngine::for_server(self.threads, self.spin_ns);
        e.set_scan(self.scan, self.rerank);
        Box::new(e)
    }

    /// The int8 scan's counts ([`Engine::rerank_counts`]) of `engine` and of the engines it
    /// replaced.
    pub fn rerank_counts(&self, engine: &dyn Engine) -> (u64, u64) {
        let (q, u) = engine.rerank_counts();
        (self.carried.0 + q, self.carried.1 + u)
    }

    /// `engine` failed with `e`: a GPU engine is replaced by the CPU engine, which serves from
    /// now on (the failure is counted and becomes the reported reason). The CPU engine failing
    /// changes nothing.
    pub fn engine_failed(&mut self, engine: &mut Box<dyn Engine>, store: &Store, e: Error) {
        if engine.kind() != EngineKind::Cpu {
            eprintln!("kalos: engine {} failed ({e}); falling back to the CPU engine", engine.describe());
            self.fallbacks += 1;
            self.reason = format!("the CUDA engine failed while serving: {e}");
            let (q, u) = engine.rerank_counts();
            self.carried = (self.carried.0 + q, self.carried.1 + u);
            let mut cpu = self.cpu();
            let _ = cpu.sync(store, &[]);
            *engine = cpu;
        }
    }

    /// Times the GPU engine failed and the CPU engine took over.
    pub fn fallbacks(&self) -> u64 {
        self.fallbacks
    }

    /// Why the CUDA engine is not serving (it could not start under backend auto, or it failed
    /// while serving); empty otherwise.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}
