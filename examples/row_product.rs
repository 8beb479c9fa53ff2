//! One row through a weight matrix (`x @ W`, x [1, k], W [k, n] row-major), the product of a
//! batch-1 decoding step: `toolsift::cpu::gemm::matmul` (its own row-by-column path from 2048
//! columns on) against the `gemm` crate called directly, on cold weights as a decoding step meets
//! them (several copies of W, together larger than the caches, used in turn).
//!
//!     cargo run --release --example row_product
//!
//! Shapes: the bench model's LM head (512 x 50400) and layers (512 x 1536 q|k|v, 512 x 2048
//! fc_in, 2048 x 512 fc_out, 512 x 512 out_proj), and GPT-J-6B's (4096 x 4096, 4096 x 12288,
//! 4096 x 16384, 16384 x 4096). Prints the mean time per product and the bytes of W per second.

use std::time::Instant;

use toolsift::cpu::gemm::matmul;

const SHAPES: [(usize, usize); 9] = [
    (512, 50400),
    (512, 1536),
    (512, 2048),
    (2048, 512),
    (512, 512),
    (4096, 4096),
    (4096, 12288),
    (4096, 16384),
    (16384, 4096),
];

fn main() {
    println!("{} threads", rayon::current_num_threads());
    for (k, n) in SHAPES {
        let copies = (256usize << 20) / (k * n * 4) + 1;
        let x: Vec<f32> = (0..k).map(|i| (i as f32 * 0.37).sin()).collect();
        let ws: Vec<Vec<f32>> = (0..copies)
            .map(|c| (0..k * n).map(|i| ((i + c) as f32 * 0.11).cos()).collect())
            .collect();
        let reps = copies.max(20);
        let mut out = vec![0f32; n];
        let mut time = |f: &mut dyn FnMut(&[f32], &mut [f32])| {
            let start = Instant::now();
            for r in 0..reps {
                f(&ws[r % copies], &mut out);
            }
            start.elapsed().as_secs_f64() / reps as f64
        };
        let ours = time(&mut |w, out| matmul(&x, w, out, [1, n, k], false, true));
        let theirs = time(&mut |w, out| {
            // SAFETY: x is [1, k], w [k, n] and out [1, n], all dense row-major.
            unsafe {
                gemm::gemm(
                    1,
                    n,
                    k,
                    out.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    x.as_ptr(),
                    1,
                    k as isize,
                    w.as_ptr(),
                    1,
                    n as isize,
                    1.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::Rayon(0),
                )
            }
        });
        let gb = (k * n * 4) as f64 / 1e9;
        println!(
            "{k:>5} x {n:<5}  toolsift {:>7.3} ms ({:>4.1} GB/s)  gemm crate {:>7.3} ms ({:>4.1} GB/s)  {:.2}x",
            ours * 1e3,
            gb / ours,
            theirs * 1e3,
            gb / theirs,
            theirs / ours
        );
    }
}
