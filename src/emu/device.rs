//! The emulated device: the CUDA backend, host code and kernels together, run without a GPU.
//!
//! build.rs links kernels/emu/device into two shared libraries named like NVIDIA's,
//! `libcuda.so` (the driver API over the emulator, every kernel of kernels/*.cu in its launch
//! table) and `libcublasLt.so` (host matmuls). cudarc opens those libraries by name, and the
//! dynamic loader answers a name with a library already loaded under it, so [`install`] loading
//! ours first routes every driver and cuBLASLt call of `crate::cuda` to the host: the same
//! `Gpu::new`, uploads, plan chunks, launch geometry and GEMM calls as on the H200, with
//! allocations, copies and kernel arguments checked against live device memory.
//!
//! Tests call [`use_unless_gpu`]; a binary built with `emu` does it when `TOOLSIFT_EMU_DEVICE=1`
//! (`Gpu::new`); any CUDA build runs on it with `LD_LIBRARY_PATH=<LIB_DIR>`. It checks what the
//! backend computes, not how fast: docs/kernels.md, "The emulated device".

use std::sync::OnceLock;

use crate::error::{Error, Result};

/// The folder holding the emulated `libcuda.so` and `libcublasLt.so` (this build's OUT_DIR).
pub const LIB_DIR: &str = concat!(env!("OUT_DIR"), "/emu/device");

/// The loaded libraries, kept for the life of the process (cudarc holds function pointers).
static LOADED: OnceLock<std::result::Result<Vec<libloading::Library>, String>> = OnceLock::new();
/// What [`use_unless_gpu`] decided: true for the emulated device.
static CHOICE: OnceLock<std::result::Result<bool, String>> = OnceLock::new();

/// Loads the emulated driver and cuBLASLt. Call it before anything opens CUDA: once cudarc has
/// loaded a real libcuda, this cannot take its place (it then fails, saying so).
pub fn install() -> Result<()> {
    let loaded = LOADED.get_or_init(|| {
        ["libcuda.so", "libcublasLt.so"]
            .iter()
            .map(|name| {
                let path = std::path::Path::new(LIB_DIR).join(name);
                // SAFETY: our own libraries; their initialisers only fill the kernel table.
                unsafe { libloading::Library::new(&path) }
                    .map_err(|e| format!("loading the emulated device's {}: {e}", path.display()))
            })
            .collect()
    });
    loaded.as_ref().map_err(|e| Error::Backend(e.clone()))?;
    if !is_active() {
        return Err(Error::Backend(
            "the emulated device was loaded after a real libcuda.so: cudarc keeps the first one"
                .into(),
        ));
    }
    Ok(())
}

/// Whether cudarc's libcuda is the emulated one.
pub fn is_active() -> bool {
    // SAFETY: a dlopen probe, then a symbol lookup on the library cudarc uses.
    unsafe {
        cudarc::driver::sys::is_culib_present()
            && cudarc::driver::sys::culib()
                .get::<unsafe extern "C" fn() -> i32>(b"toolsift_emu_device_marker\0")
                .is_ok()
    }
}

/// A real GPU's driver when this machine has one, else the emulated device (installed here).
/// Returns true for the emulated device. The first call decides for the whole process.
pub fn use_unless_gpu() -> Result<bool> {
    let choice = CHOICE.get_or_init(|| {
        // SAFETY: a dlopen probe of the usual libcuda names.
        if unsafe { cudarc::driver::sys::is_culib_present() } && !is_active() {
            return Ok(false);
        }
        install().map(|()| true).map_err(|e| e.to_string())
    });
    choice.clone().map_err(Error::Backend)
}
