//! Build script. With the `cuda` feature, compiles every kernels/*.cu to PTX in OUT_DIR with nvcc.
//!
//! Three honest outcomes (docs/gpu.md):
//! - nvcc not found: a cargo warning; the crate builds, and the CUDA backend reports at run time
//!   that its kernels were not built (cfg `toolsift_ptx` unset).
//! - nvcc fails: a hard error carrying nvcc's output.
//! - success: OUT_DIR/<stem>.ptx for every kernel, and cfg `toolsift_ptx`.
//!
//! nvcc is looked up through NVCC (the binary), CUDA_HOME / CUDA_PATH (<dir>/bin/nvcc), PATH, then
//! the PyPI wheels (`nvidia-cuda-nvcc`: <purelib>/nvidia/cu13/bin/nvcc or
//! nvidia/cuda_nvcc/bin/nvcc). The target is TOOLSIFT_CUDA_ARCH (default sm_90, the H200), compiled
//! as compute_XY PTX. No --use_fast_math: f32 exp/log/tanh stay accurate (softmax and cross-entropy
//! depend on it).
//!
//! With the `emu` feature, also compiles every kernel for the host with the C++ compiler, through
//! the CUDA emulator in kernels/emu (docs/kernels.md): a static library whose extern "C" kernels
//! src/emu.rs launches on fibers. The only rewrite of a kernel's source is its `extern
//! __shared__` array, which becomes a pointer into the launch's dynamic shared memory.

use std::path::{Path, PathBuf};
use std::process::Command;

const DEFAULT_ARCH: &str = "sm_90";

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-check-cfg=cfg(toolsift_ptx)");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_some() {
        build_ptx();
    }
    #[cfg(feature = "emu")]
    emu::build();
}

fn build_ptx() {
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
        // Found nowhere: build again once a pip install could have brought it (cargo would keep
        // this PTX-less build otherwise, whatever was installed since).
        if let Some(purelib) = python_purelib() {
            let nvidia = purelib.join("nvidia");
            let watch = if nvidia.is_dir() { nvidia } else { purelib };
            println!("cargo:rerun-if-changed={}", watch.display());
        }
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
    let purelib = python_purelib()?;
    let nvcc = ["nvidia/cu13/bin/nvcc", "nvidia/cuda_nvcc/bin/nvcc"]
        .iter()
        .map(|rel| purelib.join(rel))
        .find(|p| p.is_file())?;
    // A reinstalled or upgraded wheel builds the PTX again.
    println!("cargo:rerun-if-changed={}", nvcc.display());
    Some(nvcc)
}

/// Where python3's pip installs wheels (site-packages), if there is a python3.
fn python_purelib() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
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

#[cfg(feature = "emu")]
mod emu {
    use std::path::{Path, PathBuf};

    /// kernels/*.cu -> OUT_DIR/emu/<stem>.cpp (cuda_emu.h first, `extern __shared__` rewritten)
    /// -> one static library with kernels/emu/runtime.cpp; then the emulated device
    /// (`device_libraries`).
    pub fn build() {
        let kernels = Path::new("kernels");
        let emu = kernels.join("emu");
        println!("cargo:rerun-if-changed=kernels");
        for f in [
            "cuda_emu.h",
            "runtime.cpp",
            "selftest.cpp",
            "include/cuda_bf16.h",
            "include/cuda_fp16.h",
            "include/mma.h",
            "include/mma_sync.cuh",
            "device/registry.h",
            "device/driver.cpp",
            "device/cublaslt.cpp",
        ] {
            println!("cargo:rerun-if-changed={}", emu.join(f).display());
        }
        let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("emu");
        std::fs::create_dir_all(&out).expect("creating OUT_DIR/emu");
        let mut sources: Vec<PathBuf> = std::fs::read_dir(kernels)
            .expect("kernels/ exists")
            .map(|e| e.expect("readable kernels/ entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "cu"))
            .collect();
        sources.sort();
        let mut base = cc::Build::new();
        base.cpp(true)
            .std("c++17")
            .opt_level(2)
            .pic(true)
            .flag("-fno-strict-aliasing")
            .warnings(false)
            .include(emu.join("include"))
            .include(&emu)
            .include(kernels);
        let mut build = base.clone();
        build
            .file(emu.join("runtime.cpp"))
            .file(emu.join("selftest.cpp"));
        let mut kernel_files = Vec::new();
        for src in &sources {
            println!("cargo:rerun-if-changed={}", src.display());
            let text = std::fs::read_to_string(src)
                .unwrap_or_else(|e| panic!("reading {}: {e}", src.display()));
            let abs = std::fs::canonicalize(src).unwrap_or_else(|_| src.clone());
            let mut cpp = format!("#include \"cuda_emu.h\"\n#line 1 \"{}\"\n", abs.display());
            for (i, line) in text.lines().enumerate() {
                cpp += &rewrite_shared(line)
                    .unwrap_or_else(|e| panic!("{}:{}: {e}", src.display(), i + 1));
                cpp.push('\n');
            }
            let stem = src.file_stem().expect("file stem").to_string_lossy();
            let dst = out.join(format!("{stem}.cpp"));
            std::fs::write(&dst, cpp).unwrap_or_else(|e| panic!("writing {}: {e}", dst.display()));
            build.file(&dst);
            kernel_files.push((abs, dst));
        }
        build.compile("toolsift_emu");
        device_libraries(&base, &emu, &out, &kernel_files);
    }

    /// The emulated device (kernels/emu/device): OUT_DIR/emu/device/libcuda.so, the driver API
    /// over the emulator with every kernel of kernels/*.cu in its launch table, and
    /// libcublasLt.so, host matmuls. cudarc finds them by name like the real libraries
    /// (src/emu/device.rs). `kernel_files`: (kernels/<stem>.cu, its rewritten OUT_DIR copy).
    fn device_libraries(
        base: &cc::Build,
        emu: &Path,
        out: &Path,
        kernel_files: &[(PathBuf, PathBuf)],
    ) {
        let dir = out.join("device");
        std::fs::create_dir_all(&dir).expect("creating OUT_DIR/emu/device");
        let mut driver = base.clone();
        driver
            .flag("-fvisibility=hidden")
            .include(emu.join("device"))
            .file(emu.join("runtime.cpp"))
            .file(emu.join("device/driver.cpp"));
        for (cu, cpp) in kernel_files {
            // The entry points, read from the preprocessed kernel file, go into the launch
            // table; the compiler takes each signature from the definition (registry.h).
            let expanded = base
                .clone()
                .file(cpp)
                .try_expand()
                .unwrap_or_else(|e| panic!("preprocessing {}: {e}", cpp.display()));
            let names = entry_points(&String::from_utf8_lossy(&expanded), &cu.to_string_lossy());
            assert!(
                !names.is_empty(),
                "{}: no extern \"C\" kernels",
                cu.display()
            );
            let stem = cpp.file_stem().expect("file stem").to_string_lossy();
            let entries: Vec<String> = names
                .iter()
                .map(|n| format!("TOOLSIFT_EMU_ENTRY({n})"))
                .collect();
            let table = dir.join(format!("{stem}_entries.cpp"));
            let text = format!(
                "#include \"{}\"\n#include \"registry.h\"\nTOOLSIFT_EMU_ENTRIES({})\n",
                cpp.display(),
                entries.join(", ")
            );
            std::fs::write(&table, text)
                .unwrap_or_else(|e| panic!("writing {}: {e}", table.display()));
            driver.file(table);
        }
        link_shared(&driver, &dir, "libcuda.so", &[]);
        let mut blas = base.clone();
        blas.flag("-fvisibility=hidden")
            .file(emu.join("device/cublaslt.cpp"));
        // Its operand checks call into the emulated libcuda.so, found next to it.
        link_shared(
            &blas,
            &dir,
            "libcublasLt.so",
            &[
                format!("-L{}", dir.display()),
                "-lcuda".into(),
                "-Wl,-rpath,$ORIGIN".into(),
            ],
        );
    }

    /// Compiles `build`'s files and links them into `dir/name` (soname `name`).
    fn link_shared(build: &cc::Build, dir: &Path, name: &str, libs: &[String]) {
        let objects = build.compile_intermediates();
        let mut cmd = build.get_compiler().to_command();
        cmd.arg("-shared")
            .arg(format!("-Wl,-soname,{name}"))
            .arg("-Wl,-Bsymbolic")
            .arg("-o")
            .arg(dir.join(name))
            .args(&objects)
            .args(libs)
            .arg("-lpthread");
        let output = cmd
            .output()
            .unwrap_or_else(|e| panic!("linking {name}: {e}"));
        assert!(
            output.status.success(),
            "linking {name} ({cmd:?}):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }

    /// The names of the `extern "C"` functions defined in `file` (a .cu), from its preprocessed
    /// text: only the lines the preprocessor attributes to `file`, so no header's declarations.
    fn entry_points(expanded: &str, file: &str) -> Vec<String> {
        let mut own = String::new();
        let mut in_file = false;
        for line in expanded.lines() {
            if let Some(marker) = line.strip_prefix("# ") {
                // `# <line> "<file>" <flags>`
                in_file = marker.split('"').nth(1) == Some(file);
                continue;
            }
            if in_file {
                own += line;
                own.push('\n');
            }
        }
        let mut names = Vec::new();
        for (at, _) in own.match_indices("extern \"C\"") {
            let rest = own[at + "extern \"C\"".len()..].trim_start();
            if rest.starts_with('{') {
                continue;
            }
            let Some(open) = rest.find('(') else { continue };
            let name: String = rest[..open]
                .trim_end()
                .chars()
                .rev()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            if !name.is_empty() && !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }

    /// `extern __shared__ [__align__(N)] TYPE NAME[];` -> `TYPE* const NAME = reinterpret_cast<
    /// TYPE*>(::toolsift_emu::dynamic_shared());` (the runtime aligns it to 128 bytes); any other
    /// line unchanged.
    fn rewrite_shared(line: &str) -> Result<String, String> {
        let Some(at) = line.find("extern __shared__") else {
            return Ok(line.to_string());
        };
        let indent = &line[..at];
        let mut rest = line[at + "extern __shared__".len()..].trim_start();
        if let Some(r) = rest.strip_prefix("__align__(") {
            let close = r.find(')').ok_or("unclosed __align__(")?;
            rest = r[close + 1..].trim_start();
        }
        let decl_end = rest
            .find("[];")
            .ok_or("expected `TYPE NAME[];` after extern __shared__")?;
        let (decl, tail) = (&rest[..decl_end], &rest[decl_end + 3..]);
        let split = decl
            .rfind(char::is_whitespace)
            .ok_or("expected `TYPE NAME`")?;
        let (ty, name) = (decl[..split].trim(), decl[split..].trim());
        Ok(format!(
            "{indent}{ty}* const {name} = reinterpret_cast<{ty}*>(::toolsift_emu::dynamic_shared());{tail}"
        ))
    }
}
