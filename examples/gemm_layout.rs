//! Why the CPU engine stores its weights [in, out]: one linear layer `x @ W` through the `gemm`
//! crate with W stored as PyTorch does ([out, in], multiplied as a transposed right-hand side)
//! against W stored [in, out] (row-major), at the engine's shapes and row counts, in one run.
//!
//!     cargo run --release --example gemm_layout [EMBD VOCAB]
//!
//! Rows: 1 (a batch-1 decode step), 25 (the driver's 5 x 5 samples), 64 (an LM-head chunk),
//! 512 and 2048 (scoring batches). Prints GFLOP/s (median of 5) and the ratio.

use std::time::Instant;

use toolsift::cpu::gemm::{matmul, matmul_wt};
use toolsift::util::rng::Rng;

fn gflops(m: usize, n: usize, k: usize, f: &mut dyn FnMut()) -> f64 {
    f();
    let mut t: Vec<f64> = (0..5)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    2.0 * (m * n * k) as f64 / t[2] / 1e9
}

fn main() {
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .map_or(default, |s| s.parse().expect("a number"))
    };
    let (d, vocab) = (arg(1, 1024), arg(2, 50400));
    let mut rng = Rng::new(1);
    println!(
        "{} threads; GFLOP/s, [out, in] as PyTorch stores it vs [in, out]",
        rayon::current_num_threads()
    );
    for (name, n, k) in [
        ("qkv", 3 * d, d),
        ("out_proj", d, d),
        ("fc_in", 4 * d, d),
        ("fc_out", d, 4 * d),
        ("lm_head", vocab, d),
    ] {
        let w: Vec<f32> = (0..n * k).map(|_| rng.normal()).collect();
        for m in [1usize, 25, 64, 512, 2048] {
            if name == "lm_head" && m > 64 {
                continue; // the head runs in chunks of 64 rows
            }
            let a: Vec<f32> = (0..m * k).map(|_| rng.normal()).collect();
            let mut out = vec![0f32; m * n];
            let torch = gflops(m, n, k, &mut || {
                matmul_wt(&a, &w, &mut out, [m, n, k], false, true)
            });
            // Same values, other layout: the timing does not depend on which matrix it is.
            let stored = gflops(m, n, k, &mut || {
                matmul(&a, &w, &mut out, [m, n, k], false, true)
            });
            println!(
                "{name:>8} [{k} x {n}] x {m:>4} rows: {torch:6.1} vs {stored:6.1}  ({:.2}x)",
                stored / torch
            );
        }
    }
}
