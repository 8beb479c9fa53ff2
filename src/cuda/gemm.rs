//! The layer GEMMs through cuBLASLt: 16-bit inputs (bf16 or f16), f32 compute and scale, output
//! f32 or 16-bit, with the algorithm choice cached per shape.
//!
//! Every product here is a linear layer in PyTorch's layout over row-major activations:
//!
//! ```text
//! out[m, n] = beta * out[m, n] + a[m, k] @ w[n, k]^T      (row strides lda, ldw, ldo)
//! ```
//!
//! cuBLASLt is column-major, so this is issued as out^T = w a^T: "TN" with M = n, N = m, K = k,
//! A = w (stored k x n, ld ldw, transposed), B = a (stored k x m, ld lda), C = D = out (n x m, ld
//! ldo). beta = 1 accumulates into `out`, which is how the residual add is fused into out_proj and
//! fc_out. The heuristic is asked once per (shape, strides, types, beta, pointer alignments) and
//! the chosen algorithm, descriptors and layouts are kept.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut};
use half::{bf16, f16};

use crate::error::{driver_err, Error, Result};

/// 32 MiB, NVIDIA's recommendation for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;
/// Cached plans beyond this are dropped (shapes vary with the number of tokens of a chunk).
const MAX_CACHED: usize = 4096;

/// Element types cuBLASLt sees.
pub trait BlasType {
    /// cuBLASLt's name for the type (`CUDA_R_32F`, `CUDA_R_16BF`, `CUDA_R_16F`).
    const CUDA: sys::cudaDataType;
}
impl BlasType for f32 {
    const CUDA: sys::cudaDataType = sys::cudaDataType::CUDA_R_32F;
}
impl BlasType for bf16 {
    const CUDA: sys::cudaDataType = sys::cudaDataType::CUDA_R_16BF;
}
impl BlasType for f16 {
    const CUDA: sys::cudaDataType = sys::cudaDataType::CUDA_R_16F;
}

fn blas_err(what: &str) -> impl FnOnce(lt::CublasError) -> Error + '_ {
    move |e| Error::Backend(format!("cuBLASLt: {what}: {e:?}"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    mnk: [u64; 3],
    ld: [i64; 3],
    types: [u32; 2],
    accumulate: bool,
    align: [u32; 3],
}

/// Descriptors, layouts and the chosen algorithm of one GEMM shape.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    a: sys::cublasLtMatrixLayout_t,
    b: sys::cublasLtMatrixLayout_t,
    c: sys::cublasLtMatrixLayout_t,
    algo: sys::cublasLtMatmulAlgo_t,
}

// SAFETY: the handles are plain cuBLASLt descriptors, never mutated after creation; cuBLASLt
// allows them to be used from any thread.
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each handle was created by this Plan and is destroyed once. Errors on destroy
        // cannot be acted on in drop.
        unsafe {
            let _ = lt::destroy_matrix_layout(self.a);
            let _ = lt::destroy_matrix_layout(self.b);
            let _ = lt::destroy_matrix_layout(self.c);
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// The cuBLASLt handle, its workspace and the plan cache.
pub struct Blas {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
    cache: Mutex<HashMap<Key, Arc<Plan>>>,
}

// SAFETY: the handle is used only through &self methods that cuBLASLt documents as thread-safe
// (cublasLtMatmul with distinct plans); the cache is behind a Mutex.
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once, after the cached plans.
        self.cache.lock().map(|mut c| c.clear()).ok();
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

/// Largest power of two (<= 256) dividing the address: the alignment cuBLASLt may assume.
fn alignment(ptr: u64) -> u32 {
    1u32 << ptr.trailing_zeros().min(8)
}

impl Blas {
    /// Creates the cuBLASLt handle and allocates its 32 MiB workspace on `stream`; every GEMM runs
    /// on that stream. Fails with a backend error if either fails.
    pub fn new(stream: Arc<CudaStream>) -> Result<Self> {
        let handle = lt::create_handle().map_err(blas_err("creating the handle"))?;
        // SAFETY: u8 needs no initialisation; cuBLASLt treats the workspace as scratch.
        let workspace = unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }
            .map_err(driver_err("allocating the cuBLASLt workspace"))?;
        Ok(Blas {
            handle,
            workspace,
            stream,
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// `out[m, n] = a[m, k] @ w[n, k]^T`, or `out += ...` with `accumulate` (the fused residual
    /// add), row-major with row strides `lda`, `ldw`, `ldo`.
    #[allow(clippy::too_many_arguments)]
    pub fn linear<T: BlasType, O: BlasType>(
        &self,
        a: &CudaView<T>,
        lda: usize,
        w: &CudaView<T>,
        ldw: usize,
        out: &mut CudaViewMut<O>,
        ldo: usize,
        [m, n, k]: [usize; 3],
        accumulate: bool,
    ) -> Result<()> {
        if m == 0 || n == 0 {
            return Ok(());
        }
        let need = |rows: usize, ld: usize, cols: usize| (rows - 1) * ld + cols;
        if k == 0
            || lda < k
            || ldw < k
            || ldo < n
            || a.len() < need(m, lda, k)
            || w.len() < need(n, ldw, k)
            || out.len() < need(m, ldo, n)
        {
            return Err(Error::Backend(format!(
                "cuBLASLt: bad GEMM operands: m {m} n {n} k {k}, lda {lda} ldw {ldw} ldo {ldo}, \
                 lengths a {} w {} out {}",
                a.len(),
                w.len(),
                out.len()
            )));
        }
        // cuBLASLt runs in the calling thread's current context: make it ours.
        self.stream
            .context()
            .bind_to_thread()
            .map_err(driver_err("binding the context"))?;
        let (pa, _ga) = a.device_ptr(&self.stream);
        let (pw, _gw) = w.device_ptr(&self.stream);
        let (po, _go) = out.device_ptr_mut(&self.stream);
        let key = Key {
            mnk: [m as u64, n as u64, k as u64],
            ld: [lda as i64, ldw as i64, ldo as i64],
            types: [T::CUDA as u32, O::CUDA as u32],
            accumulate,
            align: [alignment(pa), alignment(pw), alignment(po)],
        };
        let plan = self.plan::<T, O>(&key)?;
        let alpha = 1f32;
        let beta = if accumulate { 1f32 } else { 0f32 };
        let (ws, _gws) = self.workspace.device_ptr(&self.stream);
        // SAFETY: the operand checks above bound every element cuBLASLt reads or writes under the
        // layouts of `plan` (built from the same key); the pointers are live device allocations
        // of the right element types; the workspace is WORKSPACE_BYTES long; the stream is ours.
        unsafe {
            lt::matmul(
                self.handle,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                pw as *const c_void,
                plan.a,
                pa as *const c_void,
                plan.b,
                po as *const c_void,
                plan.c,
                po as *mut c_void,
                plan.c,
                &plan.algo,
                ws as *mut c_void,
                WORKSPACE_BYTES,
                self.stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(blas_err(&format!("matmul m {m} n {n} k {k}")))
    }

    fn plan<T: BlasType, O: BlasType>(&self, key: &Key) -> Result<Arc<Plan>> {
        let mut cache = self.cache.lock().expect("gemm cache lock");
        if let Some(p) = cache.get(key) {
            return Ok(p.clone());
        }
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        let [m, n, k] = key.mnk;
        let [lda, ldw, ldo] = key.ld;
        let what = format!("planning m {m} n {n} k {k}");
        let desc = lt::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(blas_err(&what))?;
        // Build the plan as we go so that Drop releases whatever was created on an error.
        let mut plan = Plan {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            c: std::ptr::null_mut(),
            algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] },
        };
        // CUBLAS_OP_T for the weights, CUBLAS_OP_N for the activations.
        let (transa, transb): (i32, i32) = (1, 0);
        // SAFETY: attribute buffers are i32 as cuBLASLt documents for TRANSA / TRANSB.
        unsafe {
            lt::set_matmul_desc_attribute(
                plan.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &transa as *const i32 as *const c_void,
                4,
            )
            .map_err(blas_err(&what))?;
            lt::set_matmul_desc_attribute(
                plan.desc,
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                &transb as *const i32 as *const c_void,
                4,
            )
            .map_err(blas_err(&what))?;
        }
        plan.a = lt::create_matrix_layout(T::CUDA, k, n, ldw).map_err(blas_err(&what))?;
        plan.b = lt::create_matrix_layout(T::CUDA, k, m, lda).map_err(blas_err(&what))?;
        plan.c = lt::create_matrix_layout(O::CUDA, n, m, ldo).map_err(blas_err(&what))?;
        let pref = lt::create_matmul_pref().map_err(blas_err(&what))?;
        let ws = WORKSPACE_BYTES as u64;
        // cuBLASLt's heuristic assumes 256-byte aligned operands unless told otherwise.
        let [al_a, al_w, al_o] = key.align;
        // Split-K partial sums are reduced in f32 (the compute type), never in place in a 16-bit
        // output: that rounds each partial (first H200 run: a bf16 C += A W came out 1.5 half-ulps
        // off) and its atomics make results depend on timing.
        let reduction =
            sys::cublasLtReductionScheme_t::CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE as u32;
        // SAFETY: u64 for MAX_WORKSPACE_BYTES, u32 for the alignments and the reduction mask, as
        // documented; the preference is destroyed below on every path.
        let heuristic = unsafe {
            let set =
                |attr, v: *const c_void, size| lt::set_matmul_pref_attribute(pref, attr, v, size);
            use sys::cublasLtMatmulPreferenceAttributes_t as P;
            let r = set(
                P::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as _,
                8,
            )
            .and_then(|_| {
                set(
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    &al_w as *const u32 as _,
                    4,
                )
            })
            .and_then(|_| {
                set(
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    &al_a as *const u32 as _,
                    4,
                )
            })
            .and_then(|_| {
                set(
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    &al_o as *const u32 as _,
                    4,
                )
            })
            .and_then(|_| {
                set(
                    P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                    &al_o as *const u32 as _,
                    4,
                )
            })
            .and_then(|_| {
                set(
                    P::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                    &reduction as *const u32 as _,
                    4,
                )
            })
            .and_then(|_| {
                lt::get_matmul_algo_heuristic(
                    self.handle,
                    plan.desc,
                    plan.a,
                    plan.b,
                    plan.c,
                    plan.c,
                    pref,
                )
            });
            let _ = lt::destroy_matmul_pref(pref);
            r
        }
        .map_err(blas_err(&format!(
            "{what}: no algorithm for these types ({:?} x {:?} -> {:?}) and alignments {:?}",
            T::CUDA,
            T::CUDA,
            O::CUDA,
            key.align
        )))?;
        plan.algo = heuristic.algo;
        let plan = Arc::new(plan);
        cache.insert(*key, plan.clone());
        Ok(plan)
    }

    /// Number of cached GEMM plans (for tests and logs).
    pub fn cached_plans(&self) -> usize {
        self.cache.lock().map(|c| c.len()).unwrap_or(0)
    }
}
