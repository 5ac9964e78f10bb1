//! What the machine offers the CUDA engine: the driver, its CUDA version and the GPUs, read
//! without creating a context (for `kalosd doctor`).

use std::ffi::CStr;

use cudarc::driver::sys;

use super::ck;
use crate::error::{Error, Result, Status};

/// One GPU as the driver reports it.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub ordinal: i32,
    pub name: String,
    /// Compute capability (major, minor).
    pub cc: (i32, i32),
    pub memory_bytes: usize,
    pub sms: i32,
}

impl Gpu {
    /// The NVRTC architecture of this GPU, e.g. "sm_90".
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.cc.0, self.cc.1)
    }
}

/// The driver: its CUDA version (e.g. 13000) and its GPUs.
#[derive(Debug, Clone)]
pub struct Driver {
    pub cuda_version: i32,
    pub gpus: Vec<Gpu>,
}

/// The kernel driver's own version line (/proc/driver/nvidia/version), when there is one.
pub fn kernel_driver_version() -> Option<String> {
    let s = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    s.lines().next().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// Loads the driver library and lists the GPUs.
pub fn driver() -> Result<Driver> {
    // SAFETY: is_culib_present only tries to load the library.
    if !std::panic::catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false) {
        return Err(Error::new(Status::BackendUnavailable, "the CUDA driver library (libcuda.so) was not found"));
    }
    std::panic::catch_unwind(|| -> Result<Driver> {
        let mut ver = 0;
        // SAFETY: the driver library is loaded; `ver` is a valid out-pointer.
        ck("cuDriverGetVersion", unsafe { sys::cuDriverGetVersion(&mut ver) })?;
        // SAFETY: cuInit takes no pointers.
        ck("cuInit", unsafe { sys::cuInit(0) })?;
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer.
        ck("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
        let mut gpus = Vec::new();
        for ordinal in 0..n {
            let mut dev = 0;
            // SAFETY: ordinal < the device count; `dev` is a valid out-pointer.
            ck("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, ordinal) })?;
            let attr = |a| {
                let mut v = 0;
                // SAFETY: `dev` is a device handle the driver gave; `v` is a valid out-pointer.
                unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) };
                v
            };
            let mut name = [0 as std::os::raw::c_char; 128];
            let mut mem = 0usize;
            // SAFETY: the buffer holds 128 bytes and the driver writes at most 127 and a NUL;
            // `mem` is a valid out-pointer.
            let name = unsafe {
                sys::cuDeviceGetName(name.as_mut_ptr(), 127, dev);
                sys::cuDeviceTotalMem_v2(&mut mem, dev);
                CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned()
            };
            gpus.push(Gpu {
                ordinal,
                name,
                cc: (
                    attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                    attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
                ),
                memory_bytes: mem,
                sms: attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
            });
        }
        Ok(Driver { cuda_version: ver, gpus })
    })
    .unwrap_or_else(|_| Err(Error::new(Status::BackendUnavailable, "the CUDA driver library lacks a required function")))
}
