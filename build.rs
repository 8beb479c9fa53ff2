//! Build script. With the `cuda` feature, compiles every kernels/*.cu to PTX in OUT_DIR with nvcc.
//!
//! Three honest outcomes (docs/gpu.md):
//! - nvcc not found: a cargo warning; the crate builds, and the CUDA backend reports at run time
//!   that its kernels were not built (cfg `toolsift_ptx` unset).
//! - nvcc fails: a hard error carrying nvcc's output.
//! - success: OUT_DIR/<stem>.ptx for every kernel, and cfg `toolsift_ptx`.
//!
//! nvcc is looked up through NVCC (the binary), CUDA_HOME / CUDA_PATH (<dir>/bin/nvcc), PATH, then
//! the PyPI wheels (`nvidia-cuda-nvcc`: <purelib>/nvidia/cu13/bin/nvcc or nvidia/cuda_nvcc/bin/nvcc).
//! The target is TOOLSIFT_CUDA_ARCH (default sm_90, the H200), compiled as compute_XY PTX.
//! No --use_fast_math: f32 exp/log/tanh stay IEEE-accurate (STYLE.md 12).

use std::path::{Path, PathBuf};
use std::process::Command;

const DEFAULT_ARCH: &str = "sm_90";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-check-cfg=cfg(toolsift_ptx)");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    for var in [
        "NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
        "PATH",
        "TOOLSIFT_CUDA_ARCH",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let kernels = Path::new("kernels");
    println!("cargo:rerun-if-changed=kernels");
    let mut sources: Vec<PathBuf> = std::fs::read_dir(kernels)
        .expect("kernels/ exists")
        .map(|e| e.expect("readable kernels/ entry").path())
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("cu" | "cuh")))
        .collect();
    sources.sort();
    for s in &sources {
        println!("cargo:rerun-if-changed={}", s.display());
    }

    let arch = std::env::var("TOOLSIFT_CUDA_ARCH").unwrap_or_else(|_| DEFAULT_ARCH.into());
    println!("cargo:rustc-env=TOOLSIFT_PTX_ARCH={arch}");
    let Some(nvcc) = find_nvcc() else {
        println!(
            "cargo:warning=toolsift: nvcc not found (NVCC, CUDA_HOME, PATH, PyPI nvidia-cuda-nvcc); \
             the CUDA kernels are NOT built and the cuda backend will refuse to start. \
             See DEVELOPERS.md for the pinned pip install."
        );
        return;
    };
    let compute = format!(
        "compute_{}",
        arch.trim_start_matches("sm_")
            .trim_start_matches("compute_")
    );
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let extra_includes = pypi_includes(&nvcc);
    for src in sources
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
    {
        let stem = src
            .file_stem()
            .expect("file stem")
            .to_string_lossy()
            .to_string();
        let ptx = out_dir.join(format!("{stem}.ptx"));
        let mut cmd = Command::new(&nvcc);
        cmd.arg("--ptx")
            .arg(format!("-arch={compute}"))
            .args(["-O3", "-std=c++17", "-lineinfo", "-Ikernels"])
            .args(extra_includes.iter().map(|i| format!("-I{}", i.display())))
            .arg("-o")
            .arg(&ptx)
            .arg(src);
        let output = cmd
            .output()
            .unwrap_or_else(|e| panic!("failed to run {}: {e}", nvcc.display()));
        if !output.status.success() {
            panic!(
                "nvcc failed on {} ({:?}):\n{}\n{}",
                src.display(),
                cmd,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    println!("cargo:rustc-cfg=toolsift_ptx");
}

fn find_nvcc() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("NVCC") {
        return Some(PathBuf::from(p));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            let p = Path::new(&home).join("bin/nvcc");
            if p.is_file() {
                return Some(p);
            }
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("nvcc");
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let purelib = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let purelib = PathBuf::from(String::from_utf8_lossy(&purelib.stdout).trim());
    ["nvidia/cu13/bin/nvcc", "nvidia/cuda_nvcc/bin/nvcc"]
        .iter()
        .map(|rel| purelib.join(rel))
        .find(|p| p.is_file())
}

/// The CUDA 12 wheels split headers over several packages (nvidia/cuda_runtime/include, ...);
/// the CUDA 13 wheel (nvidia/cu13) finds its own through nvcc.profile. Add the split ones if the
/// toolkit next to nvcc has no cuda_runtime.h.
fn pypi_includes(nvcc: &Path) -> Vec<PathBuf> {
    let Some(top) = nvcc.parent().and_then(Path::parent) else {
        return Vec::new();
    };
    if top.join("include/cuda_runtime.h").is_file() {
        return Vec::new();
    }
    let Some(nvidia) = top.parent() else {
        return Vec::new();
    };
    [
        "cuda_runtime/include",
        "cuda_cccl/include",
        "cuda_crt/include",
    ]
    .iter()
    .map(|rel| nvidia.join(rel))
    .filter(|p| p.is_dir())
    .collect()
}
