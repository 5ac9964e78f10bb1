//! `kalosd doctor [--compile [--quick]] [--arch sm_XX]...`: what this machine offers Kalos, and a
//! compile of every kernel variant the engine can request (`--quick`: both ends of the
//! dimension classes only; `compile::all_variants`), through the engine's own code
//! (`KernelSpec::options`, `compile_cubin`) and whatever libnvrtc the process loads
//! (`LD_LIBRARY_PATH` is honoured).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use kalos::engine::cuda::compile::{self, KernelSpec, Module};
use kalos::engine::cuda::{device, libraries_present};

/// Runs the doctor (`--compile`, `--quick`, each `--arch`); returns the process exit status.
pub fn run(do_compile: bool, quick: bool, mut archs: Vec<String>) -> i32 {
    let gpu_arch = report();
    if !do_compile {
        return 0;
    }
    if archs.is_empty() {
        archs = vec!["sm_80".into(), "sm_90".into()];
        if let Some(a) = gpu_arch.filter(|a| !archs.contains(a)) {
            archs.push(a);
        }
    }
    compile_all(&archs, quick)
}

/// Prints the machine report; returns the first GPU's architecture, if there is a GPU.
fn report() -> Option<String> {
    println!("kalos {}", kalos::VERSION);
    match device::kernel_driver_version() {
        Some(v) => println!("driver:   {v}"),
        None => println!("driver:   no NVIDIA kernel driver (/proc/driver/nvidia/version absent)"),
    }
    let mut arch = None;
    match device::driver() {
        Ok(d) => {
            println!(
                "cuda:     driver API {}.{} (libcuda from {}){}",
                d.cuda_version / 1000,
                d.cuda_version % 1000 / 10,
                compile::loaded_from("libcuda.so").unwrap_or_else(|| "?".into()),
                if d.cuda_version < compile::OLDEST_DRIVER { "  UNSUPPORTED: the CUDA engine needs 13.0 or newer" } else { "" }
            );
            if d.gpus.is_empty() {
                println!("gpus:     none");
            }
            for g in &d.gpus {
                println!(
                    "gpu {}:    {} ({}, {} SMs, {:.1} GiB)",
                    g.ordinal,
                    g.name,
                    g.arch(),
                    g.sms,
                    g.memory_bytes as f64 / (1u64 << 30) as f64
                );
            }
            arch = d.gpus.first().map(|g| g.arch());
        }
        Err(e) => println!("cuda:     {}", e.message),
    }
    match compile::nvrtc_version() {
        Ok((ma, mi)) => println!(
            "nvrtc:    {ma}.{mi} from {}{}",
            compile::loaded_from("libnvrtc").unwrap_or_else(|| "?".into()),
            if (ma, mi) < compile::OLDEST_NVRTC { "  UNSUPPORTED: the kernels need NVRTC 13.0 or newer" } else { "" }
        ),
        Err(e) => println!("nvrtc:    {}", e.message),
    }
    println!(
        "cublas:   {}",
        if libraries_present() { "loadable" } else { "not all of libcuda, libnvrtc and libcublas load: the CUDA engine is unavailable" }
    );
    match shm_space() {
        Some((total, free)) => {
            println!("/dev/shm: {:.1} GiB, {:.1} GiB free", total as f64 / (1u64 << 30) as f64, free as f64 / (1u64 << 30) as f64)
        }
        None => println!("/dev/shm: not mounted"),
    }
    arch
}

/// Size and free bytes of /dev/shm.
fn shm_space() -> Option<(u64, u64)> {
    let path = std::ffi::CString::new("/dev/shm").ok()?;
    // SAFETY: statvfs is plain data; zeroed is a valid value that the call overwrites.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: path is NUL-terminated; st is a valid out-pointer.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let f = st.f_frsize as u64;
    Some((st.f_blocks as u64 * f, st.f_bavail as u64 * f))
}

/// Compiles every variant for `archs` on all cores; prints failures with their NVRTC log.
fn compile_all(archs: &[String], quick: bool) -> i32 {
    let ver = match compile::nvrtc_version() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("kalosd doctor --compile: {}", e.message);
            return 2;
        }
    };
    if let Err(e) = compile::check_nvrtc() {
        eprintln!("kalosd doctor --compile: {}", e.message);
        return 2;
    }
    let variants = compile::all_variants(archs, quick);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(variants.len());
    println!(
        "compiling {} kernel variants{} with NVRTC {}.{} for {} on {threads} threads",
        variants.len(),
        if quick { " (quick: both ends of the dimension classes)" } else { "" },
        ver.0,
        ver.1,
        archs.join(", ")
    );
    let t0 = Instant::now();
    let next = AtomicUsize::new(0);
    let failures: Mutex<Vec<(Module, KernelSpec, String)>> = Mutex::new(Vec::new());
    // Per module: variants compiled and seconds spent (summed over threads).
    let spent: Mutex<Vec<(Module, usize, f64)>> = Mutex::new(compile::MODULES.iter().map(|m| (*m, 0, 0.0)).collect());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((m, v)) = variants.get(i) else { break };
                let t = Instant::now();
                let r = v.compile(m);
                if let Some(e) = spent.lock().unwrap_or_else(|p| p.into_inner()).iter_mut().find(|e| e.0 == *m) {
                    e.1 += 1;
                    e.2 += t.elapsed().as_secs_f64();
                }
                if let Err(e) = r {
                    failures.lock().unwrap_or_else(|p| p.into_inner()).push((*m, v.clone(), e.message));
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
    for (m, n, secs) in spent.into_inner().unwrap_or_else(|p| p.into_inner()) {
        println!("  {}.cu: {n} variants, {secs:.1} s of compile time", m.name);
    }
    for (m, v, log) in &failures {
        println!("FAIL {}.cu {}\n{log}\n", m.name, v.label());
    }
    println!(
        "NVRTC {}.{}: {} of {} variants compiled ({} failed) in {:.1} s",
        ver.0,
        ver.1,
        variants.len() - failures.len(),
        variants.len(),
        failures.len(),
        t0.elapsed().as_secs_f64()
    );
    if failures.is_empty() {
        0
    } else {
        1
    }
}
