//! Build script. The CUDA kernels (kernels/*.cu) are compiled to PTX here when the `cuda` feature
//! is on; without it there is nothing to build.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
}
