//! Matrix products through the `gemm` crate (the one candle uses): runtime-dispatched AVX2/AVX-512
//! microkernels, rayon-parallel, arbitrary strides. The weights are stored [in, out]
//! (cpu/weights.rs) and multiplied row-major (`matmul`): the crate packs a transposed right-hand
//! side on every call, which at 25-64 rows costs as much as the product. `matmul_wt` (a times b
//! transposed) is for attention's q K^T, whose K is gathered per call anyway.

use gemm::Parallelism;

/// `out[m, n] (+)= a[m, k] @ w[n, k]^T`.
/// With `accumulate`, adds into `out`; otherwise overwrites it.
pub fn matmul_wt(
    a: &[f32],
    w: &[f32],
    out: &mut [f32],
    [m, n, k]: [usize; 3],
    accumulate: bool,
    parallel: bool,
) {
    assert!(a.len() >= m * k && w.len() >= n * k && out.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: the asserts above bound every index gemm touches: dst rows m (stride n), lhs rows m
    // (stride k), rhs is w viewed as [k, n] with row stride 1 and column stride k.
    unsafe { gemm_f32([m, n, k], out, a, w, [1, k], accumulate, parallel) }
}

/// `out[m, n] (+)= a[m, k] @ b[k, n]`, both row-major: the engine's linear layers (weights stored
/// [in, out], cpu/weights.rs). With `accumulate`, adds into `out`; otherwise overwrites it.
pub fn matmul(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    [m, n, k]: [usize; 3],
    accumulate: bool,
    parallel: bool,
) {
    assert!(a.len() >= m * k && b.len() >= k * n && out.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: bounds as asserted; all three matrices are dense row-major.
    unsafe { gemm_f32([m, n, k], out, a, b, [n, 1], accumulate, parallel) }
}

/// `out[m, n] (+)= a[m, k] @ b[k, n]`, out and a dense row-major, b's element (p, j) at
/// `p * b_row + j * b_col`. Without `accumulate`, out is not read.
///
/// # Safety
/// Every element of out, a and b so addressed must be in bounds.
unsafe fn gemm_f32(
    [m, n, k]: [usize; 3],
    out: &mut [f32],
    a: &[f32],
    b: &[f32],
    [b_row, b_col]: [usize; 2],
    accumulate: bool,
    parallel: bool,
) {
    gemm::gemm(
        m,
        n,
        k,
        out.as_mut_ptr(),
        1,
        n as isize,
        accumulate,
        a.as_ptr(),
        1,
        k as isize,
        b.as_ptr(),
        b_col as isize,
        b_row as isize,
        1.0,
        1.0,
        false,
        false,
        false,
        parallelism(parallel),
    )
}

fn parallelism(parallel: bool) -> Parallelism {
    if parallel {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    }
}

/// This machine's f32 GEMM rate in GFLOP/s on a square product of size `n` (median of `reps`),
/// the ceiling the trunk's GEMMs are measured against.
pub fn measure_peak_gflops(n: usize, reps: usize) -> f64 {
    let mut rng = crate::util::rng::Rng::new(7);
    let a: Vec<f32> = (0..n * n).map(|_| rng.normal()).collect();
    let b: Vec<f32> = (0..n * n).map(|_| rng.normal()).collect();
    let mut c = vec![0f32; n * n];
    matmul(&a, &b, &mut c, [n, n, n], false, true); // warm-up
    let mut times: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let t = std::time::Instant::now();
            matmul(&a, &b, &mut c, [n, n, n], false, true);
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    2.0 * (n as f64).powi(3) / times[times.len() / 2] / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts_match_naive() {
        let (m, n, k) = (7, 33, 19);
        let mut rng = crate::util::rng::Rng::new(1);
        let a: Vec<f32> = (0..m * k).map(|_| rng.normal()).collect();
        let w: Vec<f32> = (0..n * k).map(|_| rng.normal()).collect();
        let mut out = vec![1f32; m * n];
        matmul_wt(&a, &w, &mut out, [m, n, k], true, true);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = 1.0 + (0..k).map(|p| a[i * k + p] * w[j * k + p]).sum::<f32>();
                assert!((out[i * n + j] - want).abs() < 1e-4);
            }
        }
        let b: Vec<f32> = (0..k * n).map(|_| rng.normal()).collect();
        matmul(&a, &b, &mut out, [m, n, k], false, true);
        let product = |i: usize, j: usize| (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum::<f32>();
        for i in 0..m {
            for j in 0..n {
                assert!((out[i * n + j] - product(i, j)).abs() < 1e-4);
            }
        }
        // Accumulating adds the product once more.
        matmul(&a, &b, &mut out, [m, n, k], true, false);
        for i in 0..m {
            for j in 0..n {
                assert!((out[i * n + j] - 2.0 * product(i, j)).abs() < 1e-4);
            }
        }
    }
}
