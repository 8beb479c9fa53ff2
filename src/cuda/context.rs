//! One CUDA context for the backend: the device, one stream, the PTX modules loaded once (the
//! opt-in mma attention's on first use), every kernel's function handle in one struct, and the
//! cuBLASLt handle.
//!
//! Everything CUDA is loaded at run time (cudarc's dynamic loading): a build needs no CUDA, and
//! `Gpu::new` says clearly which piece is missing (kernels not built, no libcuda, no libcublasLt,
//! no device).

use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, ValidAsZeroBits,
};
use half::{bf16, f16};

use super::gemm::{Blas, BlasType};
use crate::error::{driver_err, Error, Result};

/// The PTX of every kernel file, compiled by build.rs (empty when nvcc was not found).
#[cfg(toolsift_ptx)]
const PTX: &[(&str, &str)] = &[
    (
        "embedding",
        include_str!(concat!(env!("OUT_DIR"), "/embedding.ptx")),
    ),
    (
        "layer_norm",
        include_str!(concat!(env!("OUT_DIR"), "/layer_norm.ptx")),
    ),
    (
        "rotary",
        include_str!(concat!(env!("OUT_DIR"), "/rotary.ptx")),
    ),
    ("gelu", include_str!(concat!(env!("OUT_DIR"), "/gelu.ptx"))),
    (
        "tree_attention",
        include_str!(concat!(env!("OUT_DIR"), "/tree_attention.ptx")),
    ),
    (
        "tree_attention_mma",
        include_str!(concat!(env!("OUT_DIR"), "/tree_attention_mma.ptx")),
    ),
    (
        "decode_attention",
        include_str!(concat!(env!("OUT_DIR"), "/decode_attention.ptx")),
    ),
    (
        "lm_head_xent",
        include_str!(concat!(env!("OUT_DIR"), "/lm_head_xent.ptx")),
    ),
];
#[cfg(not(toolsift_ptx))]
const PTX: &[(&str, &str)] = &[];

/// Whether build.rs compiled the kernels (nvcc was found when this binary was built).
pub const KERNELS_BUILT: bool = cfg!(toolsift_ptx);

/// The 16-bit storage types of device weights and activations. Kernels are exported per type
/// (`<stem>_bf16`, `<stem>_f16`); arithmetic is f32 in both.
pub trait DeviceFloat:
    DeviceRepr + ValidAsZeroBits + BlasType + Copy + Default + Send + Sync + std::fmt::Debug + 'static
{
    /// The `CudaDType` this Rust type stores.
    const DTYPE: CudaDType;
    /// Rounds an f32 to this type (round to nearest even, as the kernels' `from_f32`).
    fn from_f32(v: f32) -> Self;
    /// Widens to f32 (exact).
    fn to_f32(self) -> f32;
    /// This type's instantiation of a kernel exported for both (`k.bf16` or `k.f16`).
    fn pick(k: &PerType) -> &CudaFunction;
}

impl DeviceFloat for bf16 {
    const DTYPE: CudaDType = CudaDType::BF16;
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn pick(k: &PerType) -> &CudaFunction {
        &k.bf16
    }
}

impl DeviceFloat for f16 {
    const DTYPE: CudaDType = CudaDType::F16;
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn pick(k: &PerType) -> &CudaFunction {
        &k.f16
    }
}

/// Device storage precision of weights and of the activations that feed GEMMs and attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudaDType {
    /// bfloat16 (f32's 8-bit exponent, 8-bit significand): the default for every checkpoint not
    /// stored as float16.
    BF16,
    /// IEEE binary16 (11-bit significand, largest finite 65504): the default for float16
    /// checkpoints.
    F16,
}

impl CudaDType {
    /// Lower-case name, as in the kernels' symbol suffix and the logs: "bf16" or "f16".
    pub fn name(self) -> &'static str {
        match self {
            CudaDType::BF16 => "bf16",
            CudaDType::F16 => "f16",
        }
    }

    /// Unit roundoff of the type (round to nearest): 2^-8 for bf16, 2^-11 for f16.
    pub fn unit_roundoff(self) -> f64 {
        match self {
            CudaDType::BF16 => 2f64.powi(-8),
            CudaDType::F16 => 2f64.powi(-11),
        }
    }
}

/// A kernel exported for both 16-bit types.
pub struct PerType {
    /// `<name>_bf16`.
    pub bf16: CudaFunction,
    /// `<name>_f16`.
    pub f16: CudaFunction,
}

/// Every kernel's function handle, loaded once per context.
pub struct Kernels {
    ctx: Arc<CudaContext>,
    /// kernels/embedding.cu (`embedding::embedding`).
    pub embedding: PerType,
    /// kernels/layer_norm.cu (`layer_norm::layer_norm`).
    pub layer_norm: PerType,
    /// kernels/rotary.cu (`rotary::rotary`).
    pub rotary: PerType,
    /// kernels/gelu.cu (`gelu::gelu`).
    pub gelu: PerType,
    /// kernels/tree_attention.cu's WMMA kernel with 16-byte row loads (`AttentionVariant::Vec`).
    pub tree_attention_vec: PerType,
    /// kernels/tree_attention.cu's WMMA kernel with element loads (`AttentionVariant::Scalar`).
    pub tree_attention_scalar: PerType,
    /// `tree_attention_mma<HD_MAX>_{vec,scalar}`: [vec, scalar] x HD_MAX 64, 128, 256, loaded
    /// on first use (`Kernels::tree_attention_mma`): the mma attention is opt-in, so its PTX
    /// failing to load must not keep the default kernels from starting.
    tree_attention_mma: OnceLock<MmaKernels>,
    /// kernels/decode_attention.cu: one block per (tile, head), made for decode steps'
    /// single-query tiles.
    pub decode_attention: PerType,
    /// kernels/lm_head_xent.cu's fused log-softmax and target gather (`lm_head_xent`); f32 only.
    pub lm_head_xent_f32: CudaFunction,
    /// kernels/lm_head_xent.cu's full log-softmax rows for the sampling steps (`log_softmax`).
    pub log_softmax_f32: CudaFunction,
    // Keep the modules alive as long as the handles (CudaFunction also holds them; explicit here).
    // The lazily loaded mma module lives in its handles.
    _modules: Vec<Arc<CudaModule>>,
}

/// The device memory pool's accounting ([`Gpu::pool_memory`]), in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolMemory {
    /// Held by live buffers now.
    pub in_use: u64,
    /// The most held at once since the high-water mark was last reset.
    pub high_water: u64,
}

impl PoolMemory {
    /// The most held at once over a span of work that started at `before` (read right after
    /// [`Gpu::reset_peak_memory`]) and ended at `self`, whether the reset restarted the mark at
    /// 0 or at the bytes then in use.
    pub fn peak_since(&self, before: &PoolMemory) -> u64 {
        self.high_water.max(before.in_use)
    }
}

/// A device, its stream, the kernels and cuBLASLt: everything a launcher needs.
pub struct Gpu {
    /// The CUDA context of the device (event tracking off: all work goes to `stream`).
    pub ctx: Arc<CudaContext>,
    /// The one stream every launch, copy and GEMM of the backend is issued on, in order.
    pub stream: Arc<CudaStream>,
    /// Every kernel's function handle.
    pub kernels: Kernels,
    /// cuBLASLt on `stream`: the layer and LM-head GEMMs.
    pub blas: Blas,
    /// The device's name, as the driver reports it (e.g. "NVIDIA H200").
    pub name: String,
    /// Streaming multiprocessors on the device (sizes `gelu`'s grid cap).
    pub sm_count: u32,
    /// Largest dynamic shared memory a block may opt into (bytes).
    pub max_smem_optin: u32,
}

impl Gpu {
    /// Opens device `ordinal`: checks that the kernels were built and the CUDA libraries load,
    /// creates the context and stream, loads the PTX modules of the default path (the opt-in
    /// mma attention loads on first use) and creates the cuBLASLt handle.
    pub fn new(ordinal: usize) -> Result<Self> {
        if !KERNELS_BUILT {
            return Err(Error::Backend(
                "cuda: this toolsift was built with the `cuda` feature but nvcc was not found at \
                 build time, so the CUDA kernels (kernels/*.cu) were not compiled; install nvcc \
                 (DEVELOPERS.md has the pinned pip line) and rebuild"
                    .into(),
            ));
        }
        // The emulated device (src/emu/device.rs), asked for explicitly.
        #[cfg(feature = "emu")]
        if super::env_flag("TOOLSIFT_EMU_DEVICE") {
            crate::emu::device::install()?;
        }
        // SAFETY: only tries to dlopen the library by its usual names; no symbol is called.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::Backend(
                "cuda: the NVIDIA driver library (libcuda.so) could not be loaded: no NVIDIA \
                 driver on this machine, or it is not on LD_LIBRARY_PATH (e.g. /usr/local/nvidia/lib64)"
                    .into(),
            ));
        }
        // SAFETY: as above, a dlopen probe.
        if !unsafe { cudarc::cublaslt::sys::is_culib_present() } {
            return Err(Error::Backend(
                "cuda: cuBLASLt (libcublasLt.so) could not be loaded: put the CUDA toolkit's lib64 \
                 or PyTorch's site-packages/nvidia/cublas/lib on LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        let n = CudaContext::device_count().map_err(driver_err("counting devices"))?;
        if n <= ordinal as i32 {
            return Err(Error::Backend(format!(
                "cuda: no CUDA device {ordinal} (this machine has {n})"
            )));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver_err("creating the context"))?;
        // One stream, so cudarc's cross-stream event tracking is pure overhead.
        // SAFETY: nothing has been allocated yet; all work goes to the single stream below.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_err("creating a stream"))?;
        let name = ctx.name().map_err(driver_err("reading the device name"))?;
        let attr = |a| {
            ctx.attribute(a)
                .map(|v| v as u32)
                .map_err(driver_err("reading a device attribute"))
        };
        let sm_count = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let max_smem_optin =
            attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let kernels = Kernels::load(&ctx)?;
        let blas = Blas::new(stream.clone())?;
        Ok(Gpu {
            ctx,
            stream,
            kernels,
            blas,
            name,
            sm_count,
            max_smem_optin,
        })
    }

    /// Waits for all work on the stream; surfaces any asynchronous kernel error.
    pub fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(driver_err("synchronizing the stream (a kernel failed)"))
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx
            .mem_get_info()
            .map_err(driver_err("querying device memory"))
    }

    /// The device memory the backend's buffers hold now and at most since the last
    /// [`Gpu::reset_peak_memory`], in bytes: the device's memory pool's accounting, which is
    /// torch's `max_memory_allocated` for this engine (every buffer, weights included, since
    /// cudarc allocates with cuMemAllocAsync from that pool). The pool is the whole process's:
    /// two engines on one device, or other CUDA work in the process, count together. None on a
    /// device without memory pools (cudarc then allocates with cuMemAlloc, which no pool
    /// counts). Synchronises first: stream-ordered frees count once the stream has run them.
    pub fn pool_memory(&self) -> Result<Option<PoolMemory>> {
        use cudarc::driver::sys::CUmemPool_attribute::{
            CU_MEMPOOL_ATTR_USED_MEM_CURRENT, CU_MEMPOOL_ATTR_USED_MEM_HIGH,
        };
        let Some(pool) = self.memory_pool()? else {
            return Ok(None);
        };
        self.sync()?;
        let read = |attribute, what| {
            let mut value: u64 = 0;
            // SAFETY: a live pool of this device; both attributes are cuuint64_t (u64).
            unsafe {
                cudarc::driver::sys::cuMemPoolGetAttribute(pool, attribute, (&raw mut value).cast())
            }
            .result()
            .map_err(driver_err(what))?;
            Ok::<_, Error>(value)
        };
        Ok(Some(PoolMemory {
            in_use: read(
                CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                "reading the pool's bytes in use",
            )?,
            high_water: read(
                CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                "reading the pool's high-water mark",
            )?,
        }))
    }

    /// Restarts [`PoolMemory::high_water`] (a no-op without memory pools). The driver may
    /// restart it at 0 rather than at the bytes in use: a peak over a span of work is the
    /// larger of `in_use` before it and `high_water` after it ([`PoolMemory::peak_since`]).
    pub fn reset_peak_memory(&self) -> Result<()> {
        let Some(pool) = self.memory_pool()? else {
            return Ok(());
        };
        self.sync()?;
        let mut zero: u64 = 0;
        // SAFETY: a live pool of this device; the high-water mark is a cuuint64_t that may only
        // be set to 0.
        unsafe {
            cudarc::driver::sys::cuMemPoolSetAttribute(
                pool,
                cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                (&raw mut zero).cast(),
            )
        }
        .result()
        .map_err(driver_err("resetting the pool's high-water mark"))
    }

    /// The pool cudarc's stream allocations come from, where it allocates from one.
    fn memory_pool(&self) -> Result<Option<cudarc::driver::sys::CUmemoryPool>> {
        if !self.ctx.has_async_alloc() {
            return Ok(None);
        }
        let mut pool = std::ptr::null_mut();
        // SAFETY: writes the device's current pool (cuMemAllocAsync's) into `pool`.
        unsafe { cudarc::driver::sys::cuDeviceGetMemPool(&mut pool, self.ctx.cu_device()) }
            .result()
            .map_err(driver_err("finding the device's memory pool"))?;
        Ok(Some(pool))
    }

    /// The device's dense GEMM rate in GFLOP/s as the layer GEMMs run it (bf16 in and out, f32
    /// compute, through `self.blas`): the fastest of `reps` timings of `iters` products
    /// [n, n] x [n, n]^T after a warm-up, with n 8192 (1.1 TFLOP a product; 128 MiB an operand).
    /// The emulated device (host matmuls) gets n 64 and one product: it checks the path, not the
    /// rate. Operands hold a fixed non-zero pattern: zeros would run cooler, and faster.
    pub fn measure_peak_gflops(&self, reps: usize) -> Result<f64> {
        let emulated = self.name.contains("emulated");
        let (n, iters) = if emulated { (64, 1) } else { (8192, 10) };
        let host: Vec<bf16> = (0..n * n)
            .map(|i| bf16::from_f32(((i * 7919) % 2001) as f32 / 1000.0 - 1.0))
            .collect();
        let a = self
            .stream
            .clone_htod(&host)
            .map_err(driver_err("uploading the peak GEMM's operand"))?;
        let mut out = self
            .stream
            .alloc_zeros::<bf16>(n * n)
            .map_err(driver_err("allocating the peak GEMM's output"))?;
        let mut product = || {
            let (a, mut out) = (a.as_view(), out.as_view_mut());
            self.blas
                .linear(&a, n, &a, n, &mut out, n, [n, n, n], false)
        };
        product()?;
        self.sync()?;
        let mut fastest = f64::INFINITY;
        for _ in 0..reps.max(1) {
            let t = std::time::Instant::now();
            for _ in 0..iters {
                product()?;
            }
            self.sync()?;
            fastest = fastest.min(t.elapsed().as_secs_f64() / iters as f64);
        }
        Ok(2.0 * (n as f64).powi(3) / fastest.max(1e-12) / 1e9)
    }
}

/// `tree_attention_mma`'s instantiations: [vec, scalar] x HD_MAX 64, 128, 256.
pub type MmaKernels = [[PerType; 3]; 2];

/// Loads kernels/`stem`.cu's PTX into `ctx`.
fn load_module(ctx: &Arc<CudaContext>, stem: &str) -> Result<Arc<CudaModule>> {
    let (_, src) = PTX
        .iter()
        .find(|(s, _)| *s == stem)
        .expect("every stem is in PTX");
    ctx.load_module(cudarc::nvrtc::Ptx::from_src(*src))
        .map_err(driver_err(&format!(
            "loading kernels/{stem}.cu's PTX (built for {}; is the driver older?)",
            env!("TOOLSIFT_PTX_ARCH")
        )))
}

/// The handle of kernel `name` in `module` (kernels/`stem`.cu).
fn function(module: &Arc<CudaModule>, stem: &str, name: &str) -> Result<CudaFunction> {
    module.load_function(name).map_err(driver_err(&format!(
        "finding kernel {name} in kernels/{stem}.cu"
    )))
}

/// The bf16 and f16 instantiations `<name>_bf16`, `<name>_f16`.
fn per_type(module: &Arc<CudaModule>, stem: &str, name: &str) -> Result<PerType> {
    Ok(PerType {
        bf16: function(module, stem, &format!("{name}_bf16"))?,
        f16: function(module, stem, &format!("{name}_f16"))?,
    })
}

impl Kernels {
    /// Loads every module the default path runs (all but `tree_attention_mma`).
    fn load(ctx: &Arc<CudaContext>) -> Result<Self> {
        let embedding = load_module(ctx, "embedding")?;
        let layer_norm = load_module(ctx, "layer_norm")?;
        let rotary = load_module(ctx, "rotary")?;
        let gelu = load_module(ctx, "gelu")?;
        let tree_attention = load_module(ctx, "tree_attention")?;
        let decode_attention = load_module(ctx, "decode_attention")?;
        let lm_head_xent = load_module(ctx, "lm_head_xent")?;
        Ok(Kernels {
            ctx: ctx.clone(),
            embedding: per_type(&embedding, "embedding", "embedding")?,
            layer_norm: per_type(&layer_norm, "layer_norm", "layer_norm")?,
            rotary: per_type(&rotary, "rotary", "rotary")?,
            gelu: per_type(&gelu, "gelu", "gelu")?,
            tree_attention_vec: per_type(&tree_attention, "tree_attention", "tree_attention_vec")?,
            tree_attention_scalar: per_type(
                &tree_attention,
                "tree_attention",
                "tree_attention_scalar",
            )?,
            tree_attention_mma: OnceLock::new(),
            decode_attention: per_type(&decode_attention, "decode_attention", "decode_attention")?,
            lm_head_xent_f32: function(&lm_head_xent, "lm_head_xent", "lm_head_xent_f32")?,
            log_softmax_f32: function(&lm_head_xent, "lm_head_xent", "log_softmax_f32")?,
            _modules: vec![
                embedding,
                layer_norm,
                rotary,
                gelu,
                tree_attention,
                decode_attention,
                lm_head_xent,
            ],
        })
    }

    /// `tree_attention_mma`'s kernels, loading their module on the first call. A failed load is
    /// an error of that call (and tried again on the next), not of `Gpu::new`.
    pub fn tree_attention_mma(&self) -> Result<&MmaKernels> {
        if let Some(k) = self.tree_attention_mma.get() {
            return Ok(k);
        }
        let stem = "tree_attention_mma";
        let m = load_module(&self.ctx, stem)?;
        let load = |loads: &str| -> Result<[PerType; 3]> {
            Ok([
                per_type(&m, stem, &format!("tree_attention_mma64_{loads}"))?,
                per_type(&m, stem, &format!("tree_attention_mma128_{loads}"))?,
                per_type(&m, stem, &format!("tree_attention_mma256_{loads}"))?,
            ])
        };
        let kernels = [load("vec")?, load("scalar")?];
        // Two threads racing here both load; one result is kept, the other dropped.
        Ok(self.tree_attention_mma.get_or_init(|| kernels))
    }
}

/// Row stride for a width: rounded up to 8 elements, so every row of a 16-bit matrix starts on a
/// 16-byte boundary (cuBLASLt alignment, vector loads). The same for GPT-J's real sizes.
pub fn stride(width: usize) -> usize {
    width.div_ceil(8) * 8
}
