//! Matrix products through the `gemm` crate (the one candle uses): runtime-dispatched AVX2/AVX-512
//! microkernels, rayon-parallel, arbitrary strides. The weights are stored [in, out]
//! (cpu/weights.rs) and multiplied row-major (`matmul`), because the crate would repack a
//! transposed right-hand side on every call, which at 25-64 rows costs as much as the product
//! (PyTorch's [out, in] layout, used in place until 2026-11-30). One row through a wide
//! matrix (a batch-1 decoding step) skips the crate: `row_times_matrix` streams the weights once.
//! `matmul_wt` (a times b transposed) is for attention's q K^T, whose K is gathered per call
//! anyway.

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
    assert_holds(&[(a.len(), m, k), (w.len(), n, k), (out.len(), m, n)]);
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
    assert_holds(&[(a.len(), m, k), (b.len(), k, n), (out.len(), m, n)]);
    if m == 0 || n == 0 {
        return;
    }
    if m == 1 && n >= ROW_MIN_COLS {
        return row_times_matrix(&a[..k], &b[..k * n], &mut out[..n], accumulate, parallel);
    }
    // SAFETY: bounds as asserted; all three matrices are dense row-major.
    unsafe { gemm_f32([m, n, k], out, a, b, [n, 1], accumulate, parallel) }
}

/// `out[m, nb] = a[m, k] @ b[.., j0..j0 + nb]`, b row-major [k, n]: a block of a weight
/// matrix's columns, in the calling thread (the LM head runs one block per task).
pub fn matmul_cols(
    a: &[f32],
    b: &[f32],
    out: &mut [f32],
    [m, nb, k]: [usize; 3],
    n: usize,
    j0: usize,
) {
    assert!(
        j0.checked_add(nb).is_some_and(|end| end <= n),
        "matmul_cols: columns {j0}..+{nb} of {n}"
    );
    assert_holds(&[(a.len(), m, k), (b.len(), k, n), (out.len(), m, nb)]);
    if m == 0 || nb == 0 {
        return;
    }
    // SAFETY: bounds as asserted: b's element (p, j) is at j0 + p * n + j < k * n for j < nb.
    unsafe { gemm_f32([m, nb, k], out, a, &b[j0..], [n, 1], false, false) }
}

/// Panics unless each `(len, rows, cols)` slice holds `rows * cols` elements: the bound the
/// unsafe products rely on, so the product is checked (a wrapped one would pass in release).
fn assert_holds(operands: &[(usize, usize, usize)]) {
    for &(len, rows, cols) in operands {
        assert!(
            rows.checked_mul(cols).is_some_and(|need| len >= need),
            "matmul operand of {len} elements, shape {rows} x {cols}"
        );
    }
}

/// Columns of `out` per task of [`row_times_matrix`]: 4 KB of sums, kept in L1 while the rows of
/// b stream past.
const ROW_COLS: usize = 1024;

/// From this many columns on, one row goes through [`row_times_matrix`] instead of the crate.
/// Measured on cold 512-16384 x 512-50400 weights (docs/benchmarks.md): faster from 2048 columns
/// (1.2-1.6x), a tie at 1536, slower on narrower ones, where a column block per thread is too few.
const ROW_MIN_COLS: usize = 2048;

/// `out[n] (+)= a[k] @ b[k, n]`: one row through a weight matrix (a decoding step of one
/// sequence). A bandwidth-bound pass over b, split by blocks of columns across threads: the
/// crate's gemm packs b for a reuse that one row never gets.
fn row_times_matrix(a: &[f32], b: &[f32], out: &mut [f32], accumulate: bool, parallel: bool) {
    use rayon::prelude::*;
    let n = out.len();
    let task = |(c, o): (usize, &mut [f32])| {
        if !accumulate {
            o.fill(0.0);
        }
        add_rows(a, b, n, c * ROW_COLS, o)
    };
    if parallel {
        out.par_chunks_mut(ROW_COLS).enumerate().for_each(task);
    } else {
        out.chunks_mut(ROW_COLS).enumerate().for_each(task);
    }
}

/// `o += a @ b[.., j0..j0 + o.len()]` (b row-major, row stride n).
fn add_rows(a: &[f32], b: &[f32], n: usize, j0: usize, o: &mut [f32]) {
    let w = o.len();
    // Four rows of b per pass over the sums: a quarter of the loads and stores of `o`.
    let quads = a.len() / 4;
    for (q, a4) in a.chunks_exact(4).enumerate() {
        let r = |i: usize| &b[(4 * q + i) * n + j0..][..w];
        let (b0, b1, b2, b3) = (r(0), r(1), r(2), r(3));
        for ((((s, x0), x1), x2), x3) in o.iter_mut().zip(b0).zip(b1).zip(b2).zip(b3) {
            *s += a4[0] * x0 + a4[1] * x1 + a4[2] * x2 + a4[3] * x3;
        }
    }
    for (p, &ap) in a.iter().enumerate().skip(4 * quads) {
        for (s, &x) in o.iter_mut().zip(&b[p * n + j0..][..w]) {
            *s += ap * x;
        }
    }
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

/// This machine's f32 GEMM rate in GFLOP/s on a square product of size `n` (the fastest of
/// `reps`: a peak is what the machine can do, and a shared machine's load only slows it; the
/// median of five ~25 ms products let one run's trunk read 106% of its "peak"), the ceiling
/// the trunk's GEMMs are measured against.
pub fn measure_peak_gflops(n: usize, reps: usize) -> f64 {
    let mut rng = crate::util::rng::Rng::new(7);
    let a: Vec<f32> = (0..n * n).map(|_| rng.normal()).collect();
    let b: Vec<f32> = (0..n * n).map(|_| rng.normal()).collect();
    let mut c = vec![0f32; n * n];
    matmul(&a, &b, &mut c, [n, n, n], false, true); // warm-up
    let fastest = (0..reps.max(1))
        .map(|_| {
            let t = std::time::Instant::now();
            matmul(&a, &b, &mut c, [n, n, n], false, true);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    2.0 * (n as f64).powi(3) / fastest / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    // Shapes whose element counts wrap to 0 in usize: refused, not a write past `out`.
    #[test]
    #[should_panic(expected = "matmul operand of 0 elements, shape 4294967296 x 4294967296")]
    fn a_shape_whose_size_overflows_is_refused() {
        matmul(&[], &[], &mut [], [1 << 32, 1 << 32, 0], false, false);
    }

    #[test]
    #[should_panic(expected = "matmul operand of 0 elements, shape 4294967296 x 4294967296")]
    fn a_transposed_shape_whose_size_overflows_is_refused() {
        matmul_wt(&[], &[], &mut [], [1 << 32, 1 << 32, 0], false, false);
    }

    #[test]
    #[should_panic(expected = "matmul_cols: columns")]
    fn a_column_block_whose_end_overflows_is_refused() {
        matmul_cols(&[], &[], &mut [], [0, 2, 0], 1, usize::MAX);
    }

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

    /// One row through a wide matrix takes the row-by-column path: columns past the last full
    /// block, rows past the last group of four, serial and parallel, overwrite and accumulate.
    #[test]
    fn one_row_through_a_wide_matrix_matches_naive() {
        let mut rng = crate::util::rng::Rng::new(3);
        for (n, k) in [
            (ROW_MIN_COLS, 1),
            (ROW_MIN_COLS + 7, 6),
            (3 * ROW_COLS + 333, 19),
        ] {
            let a: Vec<f32> = (0..k).map(|_| rng.normal()).collect();
            let b: Vec<f32> = (0..k * n).map(|_| rng.normal()).collect();
            let product = |j: usize| {
                (0..k)
                    .map(|p| a[p] as f64 * b[p * n + j] as f64)
                    .sum::<f64>()
            };
            // f32 sums of at most 19 products of N(0, 1) values against an f64 sum: the rounding
            // stays near 1e-6, and 1e-4 is far below any indexing mistake.
            for parallel in [false, true] {
                let mut out: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
                let before = out.clone();
                matmul(&a, &b, &mut out, [1, n, k], true, parallel);
                for (j, (&got, &was)) in out.iter().zip(&before).enumerate() {
                    let want = was as f64 + product(j);
                    assert!((got as f64 - want).abs() < 1e-4, "n {n} k {k} col {j}");
                }
                matmul(&a, &b, &mut out, [1, n, k], false, parallel);
                for (j, &got) in out.iter().enumerate() {
                    let want = product(j);
                    assert!((got as f64 - want).abs() < 1e-4, "n {n} k {k} col {j}");
                }
            }
        }
    }
}
