//! Which engine serves: the backend choice when the server starts, and the CPU engine that takes
//! over when the CUDA engine fails while serving. The [`Router`] keeps why the CUDA engine is not
//! serving and how often it failed, for the server's stats.

use std::sync::Arc;
use std::time::Duration;

use super::cpu::CpuEngine;
use super::shard::ShardedEngine;
use super::{cuda, Engine, EngineKind};
use crate::config::Options;
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
        if opts.device_shards > 1 {
            return router.sharded(backend, opts, store).map(|e| (e, router));
        }
        let engine = match backend {
            Backend::Cpu => router.cpu(),
            Backend::Cuda => cuda::create(opts, store)?,
            // Auto: the GPU when one is usable, with a cost model that keeps requests too small to
            // pay for a GPU round trip on the CPU (cuda::create_auto); else the CPU engine.
            Backend::Auto => match cuda::create_auto(opts, store) {
                Ok(e) => e,
                Err(e) => {
                    router.reason = e.message;
                    router.cpu()
                }
            },
        };
        Ok((engine, router))
    }

    /// A store split into `device_shards` shards, each served by a CPU engine with its share of
    /// the threads. The CUDA backend does not serve sharded stores (INVALID_ARGUMENT); under
    /// `Auto` the router keeps why the GPU is not serving.
    fn sharded(&mut self, backend: Backend, opts: &Options, store: &Store) -> Result<Box<dyn Engine>> {
        let n = opts.device_shards as usize;
        match backend {
            Backend::Cuda => {
                return Err(Error::new(
                    Status::InvalidArgument,
                    format!("device_shards = {n} runs on the CPU engine only; open with backend cpu or auto"),
                ))
            }
            Backend::Auto => self.reason = format!("device_shards = {n}: sharded stores run on the CPU engine"),
            Backend::Cpu => {}
        }
        let cores = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
        // As the unsharded engine: all but one core (the clients') on hosts of 8 or more.
        let total = match self.threads {
            0 if cores >= super::cpu::SPIN_MIN_CORES => cores - 1,
            0 => cores,
            t => t,
        };
        let per = (total / n).max(1);
        let (spin_ns, scan, rerank) = (self.spin_ns, self.scan, self.rerank);
        // Shard threads poll between jobs only where every polling thread (each shard's engine
        // threads and the server thread) has a core of its own.
        let worker_spin = if cores >= super::cpu::SPIN_MIN_CORES && n * per < cores { spin_ns } else { 0 };
        let factory = move |_: usize| -> Result<Box<dyn Engine>> {
            let mut e = CpuEngine::for_server(per, spin_ns);
            e.set_scan(scan, rerank);
            Ok(Box::new(e))
        };
        let e = ShardedEngine::new(n, opts.placement, store, Duration::from_nanos(worker_spin), Arc::new(factory))?;
        Ok(Box::new(e))
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
