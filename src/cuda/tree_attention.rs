//! Launcher for kernels/tree_attention.cu, and the host side of it: the plan's segments cut into
//! query tiles of at most 64 tokens, each with the map of its context (ancestor tokens, root
//! first, then its own segment's).

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, CudaViewMut, DevicePtr, LaunchConfig, PushKernelArg,
};

use super::context::{DeviceFloat, Gpu};
use super::{check, need};
use crate::error::{driver_err, Result};
use crate::plan::Plan;
use crate::sample::kv_tree::Group;

/// Query rows per tile (4 warps x 16): with `BN` and `THREADS`, the attention kernels' tile
/// contract (kernels/attention_tile.cuh).
pub const BM: usize = 64;
/// Context keys (and values) a `tree_attention` / `tree_attention_mma` block gathers into shared
/// memory per step.
pub const BN: usize = 64;
/// Threads per block of every attention kernel (`tree_attention`, `tree_attention_mma`,
/// `decode_attention`): 4 warps.
pub const THREADS: u32 = 128;

/// The exported variants of the same contract: `Vec` and `Scalar` (kernels/tree_attention.cu,
/// WMMA with S and O in shared memory) and `MmaVec` and `MmaScalar` (kernels/
/// tree_attention_mma.cu, mma.sync with S and O in registers, FlashAttention-2 style; head_dim
/// <= 256). The vec ones gather rows as 16-byte vectors (head_dim % 8 == 0, ld % 8 == 0,
/// aligned buffers), the scalar ones element by element (any shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionVariant {
    /// `tree_attention_vec_<T>` (WMMA), 16-byte row gathers: the default where `vec_allowed`.
    Vec,
    /// `tree_attention_scalar_<T>` (WMMA), element-wise gathers: any shape and alignment.
    Scalar,
    /// `tree_attention_mma<HD_MAX>_vec_<T>` (mma.sync), 16-byte row gathers.
    MmaVec,
    /// `tree_attention_mma<HD_MAX>_scalar_<T>` (mma.sync), element-wise gathers.
    MmaScalar,
}

impl AttentionVariant {
    /// The variant of one kernel family (mma or not) for buffers that do or do not allow vector
    /// loads (`vec_allowed`).
    pub fn pick(mma: bool, vec_allowed: bool) -> Self {
        match (mma, vec_allowed) {
            (false, true) => AttentionVariant::Vec,
            (false, false) => AttentionVariant::Scalar,
            (true, true) => AttentionVariant::MmaVec,
            (true, false) => AttentionVariant::MmaScalar,
        }
    }

    /// Whether this is a `tree_attention_mma` kernel (loaded on first use, head_dim <= 256).
    pub fn is_mma(self) -> bool {
        matches!(self, AttentionVariant::MmaVec | AttentionVariant::MmaScalar)
    }

    /// Whether the kernel gathers rows as 16-byte vectors (only where `vec_allowed`).
    pub fn loads_vectors(self) -> bool {
        matches!(self, AttentionVariant::Vec | AttentionVariant::MmaVec)
    }
}

/// The `tree_attention_mma` instantiation for a head_dim: index into `Kernels::tree_attention_mma`
/// and its HD_MAX (64, 128 or 256), or None past 256.
pub fn mma_instance(head_dim: usize) -> Option<(usize, usize)> {
    match hd_pad(head_dim) {
        0..=64 => Some((0, 64)),
        65..=128 => Some((1, 128)),
        129..=256 => Some((2, 256)),
        _ => None,
    }
}

/// Dynamic shared memory of a `tree_attention_mma` block: sQ `[64, hdp + 8]`, sK and sV
/// `[64, hdp + 8]` in T; token ids `[64]` u32; row masks `[64]` u64.
pub fn mma_smem_bytes(head_dim: usize, elem: usize) -> usize {
    (BM + 2 * BN) * (hd_pad(head_dim) + 8) * elem + BM * 4 + BM * 8
}

/// head_dim rounded up to the WMMA k-step.
pub fn hd_pad(head_dim: usize) -> usize {
    head_dim.div_ceil(16) * 16
}

/// Dynamic shared memory of one block, mirroring the kernel's layout: sQ, sK, sV [64, hdp + 8] T;
/// sS `[64, 68]` f32; sP `[64, 72]` T; sO `[64, hdp + 4]` f32; m, l, token ids `[64]` x 4 bytes
/// each; row masks `[64]` x 8 bytes.
pub fn smem_bytes(head_dim: usize, elem: usize) -> usize {
    let hdp = hd_pad(head_dim);
    (BM + 2 * BN) * (hdp + 8) * elem
        + BM * (BN + 4) * 4
        + BM * (BN + 8) * elem
        + BM * (hdp + 4) * 4
        + 3 * BM * 4
        + BM * 8
}

/// `len` set bits from bit `from` (within 64).
fn bits(from: u32, len: u32) -> u64 {
    let ones = if len >= 64 {
        u64::MAX
    } else {
        (1u64 << len) - 1
    };
    ones << from
}

/// Query tiles of a plan and their context maps, on the host.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TreeTiles {
    /// [n_tiles, 4]: first query token, query count (<= 64), context position of the first
    /// query (its number of keys visible to every row), packed (1: several segments; per row a
    /// 64-bit mask of the tile tokens it sees follows the tile's context map).
    pub tiles: Vec<u32>,
    /// `[n_tiles]`: offset of the tile's context map in `ctx_tokens`.
    pub tile_ctx: Vec<u64>,
    /// The context maps, one per segment or packed tile (shared by a segment's tiles), at
    /// `tile_ctx`: the flat token index of each context position (ancestors, then the segment's
    /// or tile's own tokens); a packed tile's map is followed by its rows' masks (two u32 each).
    pub ctx_tokens: Vec<u32>,
    /// One past the largest query token index.
    pub q_rows: usize,
    /// One past the largest key token index.
    pub kv_rows: usize,
}

impl TreeTiles {
    /// Tiles of `plan`, whose tokens sit at flat indices `token_offset..` of the K/V cache and of
    /// the query buffer. Small subtrees share one packed tile: a run of sibling subtrees (same
    /// parent, at most 64 tokens together, contiguous since tokens are in DFS order) is one tile
    /// over their common ancestors. Inline placement's candidates are such runs: short branches
    /// under one long text prefix, whose K/V a packed tile reads once instead of once per branch.
    pub fn from_plan(plan: &Plan, token_offset: u32) -> Self {
        Self::build(plan, token_offset, true)
    }

    /// As `from_plan`, one segment per tile (no packing): the layout verified on the H200, and
    /// the scorer's default until packed tiles have run there (`CudaOptions::pack_tiles`).
    pub fn from_plan_unpacked(plan: &Plan, token_offset: u32) -> Self {
        Self::build(plan, token_offset, false)
    }

    fn build(plan: &Plan, token_offset: u32, pack: bool) -> Self {
        let segs = &plan.segments;
        let n = segs.len();
        // DFS order: segment s's subtree is s..subtree_end[s], its tokens one contiguous run.
        let mut subtree_end: Vec<usize> = (1..=n).collect();
        for s in (0..n).rev() {
            if let Some(p) = segs[s].parent {
                let p = p as usize;
                subtree_end[p] = subtree_end[p].max(subtree_end[s]);
            }
        }
        let tokens_of = |a: usize, b: usize| -> u32 {
            if a == b {
                0
            } else {
                segs[b - 1].start + segs[b - 1].len - segs[a].start
            }
        };
        let mut t = TreeTiles::default();
        let mut s = 0;
        while s < n {
            let seg = segs[s];
            // Packable: has ancestors (every row then sees key 0) and its subtree fits a tile;
            // then as many following sibling subtrees as fit.
            let mut end = s;
            if pack && seg.depth > 0 && tokens_of(s, subtree_end[s]) as usize <= BM {
                end = subtree_end[s];
                while end < n
                    && segs[end].parent == seg.parent
                    && tokens_of(s, subtree_end[end]) as usize <= BM
                {
                    end = subtree_end[end];
                }
            }
            let ctx_offset = t.ctx_tokens.len() as u64;
            for &a in plan.ancestors_of(s) {
                let a = segs[a as usize];
                t.ctx_tokens
                    .extend((a.start..a.start + a.len).map(|i| i + token_offset));
            }
            debug_assert_eq!(t.ctx_tokens.len() as u64 - ctx_offset, seg.depth as u64);
            if end > s + 1 {
                // One packed tile over segments s..end: context = common ancestors, then the
                // tile's own tokens; then per row a 64-bit mask (two u32, low first) of the tile
                // tokens it sees: its ancestors inside the tile and its own segment up to itself.
                let q_len = tokens_of(s, end);
                t.ctx_tokens
                    .extend((seg.start..seg.start + q_len).map(|i| i + token_offset));
                t.tiles
                    .extend([seg.start + token_offset, q_len, seg.depth, 1]);
                t.tile_ctx.push(ctx_offset);
                for g in s..end {
                    let mut inherited = 0u64;
                    for &a in plan.ancestors_of(g) {
                        let a = a as usize;
                        if (s..end).contains(&a) {
                            let off = segs[a].start - seg.start;
                            inherited |= bits(off, segs[a].len);
                        }
                    }
                    let off = segs[g].start - seg.start;
                    for r in 0..segs[g].len {
                        let mask = inherited | bits(off, r + 1);
                        t.ctx_tokens.extend([mask as u32, (mask >> 32) as u32]);
                    }
                }
                let stop = (seg.start + q_len + token_offset) as usize;
                t.q_rows = t.q_rows.max(stop);
                t.kv_rows = t.kv_rows.max(stop);
                s = end;
            } else {
                t.ctx_tokens
                    .extend((seg.start..seg.start + seg.len).map(|i| i + token_offset));
                for r0 in (0..seg.len).step_by(BM) {
                    let q_len = (seg.len - r0).min(BM as u32);
                    t.tiles
                        .extend([seg.start + r0 + token_offset, q_len, seg.depth + r0, 0]);
                    t.tile_ctx.push(ctx_offset);
                }
                let stop = (seg.start + seg.len + token_offset) as usize;
                t.q_rows = t.q_rows.max(stop);
                t.kv_rows = t.kv_rows.max(stop);
                s += 1;
            }
        }
        t
    }

    /// Tiles of the new tokens of a KV-tree forward: group g's `n_new` queries are rows
    /// `first..first + n_new` of the query buffer and the last `n_new` entries of its context
    /// `ctx` (cache rows: ancestors' and earlier tokens, then its own new rows).
    pub fn from_groups(groups: &[Group]) -> Self {
        let mut t = TreeTiles::default();
        for Group {
            ranges,
            n_new,
            first_query: first,
        } in groups
        {
            let ctx_offset = t.ctx_tokens.len() as u64;
            for r in ranges {
                t.ctx_tokens.extend(r.clone().map(|i| i as u32));
                t.kv_rows = t.kv_rows.max(r.end);
            }
            let n_ctx = (t.ctx_tokens.len() as u64 - ctx_offset) as usize;
            debug_assert!(n_ctx >= *n_new);
            let n_old = n_ctx - n_new;
            for r0 in (0..*n_new).step_by(BM) {
                let q_len = (n_new - r0).min(BM);
                t.tiles
                    .extend([(first + r0) as u32, q_len as u32, (n_old + r0) as u32, 0]);
                t.tile_ctx.push(ctx_offset);
            }
            t.q_rows = t.q_rows.max(first + n_new);
        }
        t
    }

    /// Whether every tile holds a single query (a decode step): `decode_attention` serves it.
    pub fn single_queries(&self) -> bool {
        self.tiles.chunks(4).all(|t| t[1] == 1)
    }

    /// Query tiles: the attention grid's x dimension.
    pub fn n_tiles(&self) -> usize {
        self.tile_ctx.len()
    }

    /// Copies the tiles and context maps to the device (an empty array as one zero element:
    /// zero-length allocations are refused); fails if an allocation or copy does.
    pub fn upload(&self, gpu: &Gpu) -> Result<DeviceTiles> {
        let s = &gpu.stream;
        // Zero-length device buffers are not allocatable; keep one element.
        let pad32 = |v: &[u32]| if v.is_empty() { vec![0] } else { v.to_vec() };
        Ok(DeviceTiles {
            tiles: s
                .clone_htod(&pad32(&self.tiles))
                .map_err(driver_err("uploading attention tiles"))?,
            tile_ctx: s
                .clone_htod(&if self.tile_ctx.is_empty() {
                    vec![0]
                } else {
                    self.tile_ctx.clone()
                })
                .map_err(driver_err("uploading attention tiles"))?,
            ctx_tokens: s
                .clone_htod(&pad32(&self.ctx_tokens))
                .map_err(driver_err("uploading the attention context map"))?,
            n_tiles: self.n_tiles(),
            q_rows: self.q_rows,
            kv_rows: self.kv_rows,
            packed: self.tiles.chunks(4).any(|t| t[3] != 0),
        })
    }
}

/// `TreeTiles` on the device.
pub struct DeviceTiles {
    /// `TreeTiles::tiles`: [n_tiles, 4] u32 (first query, query count, context position of the
    /// first query, packed flag).
    pub tiles: CudaSlice<u32>,
    /// `[n_tiles]` u64: offset of each tile's context map in `ctx_tokens`.
    pub tile_ctx: CudaSlice<u64>,
    /// The context maps: K/V row of every context position (then, for a packed tile, each row's
    /// 64-bit mask as two u32, low first).
    pub ctx_tokens: CudaSlice<u32>,
    /// Tiles in `tiles` (0 for an empty upload, whose arrays hold one padding element).
    pub n_tiles: usize,
    /// One past the largest query row the tiles name: the rows q and out must hold.
    pub q_rows: usize,
    /// One past the largest K/V row the context maps name: the rows k and v must hold.
    pub kv_rows: usize,
    /// Whether any tile is packed (`tree_attention` only; `decode_attention` refuses them).
    pub packed: bool,
}

/// Shapes of an attention launch.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// Attention heads: the grid's y dimension.
    pub n_head: usize,
    /// Dimensions per head (scores are scaled by 1/sqrt(head_dim)); sets the shared memory a
    /// block needs, which must fit the device (the mma variants: head_dim <= 256).
    pub head_dim: usize,
    /// Row stride of q, k and v.
    pub ld: usize,
    /// Row stride of out.
    pub ld_out: usize,
}

/// Whether the vector-load variant may run on these buffers.
pub fn vec_allowed<T: DeviceFloat>(
    gpu: &Gpu,
    s: AttentionShape,
    q: &CudaView<T>,
    k: &CudaView<T>,
    v: &CudaView<T>,
) -> bool {
    let aligned = |p: u64| p.is_multiple_of(16);
    let (pq, _g1) = q.device_ptr(&gpu.stream);
    let (pk, _g2) = k.device_ptr(&gpu.stream);
    let (pv, _g3) = v.device_ptr(&gpu.stream);
    s.head_dim.is_multiple_of(8)
        && s.ld.is_multiple_of(8)
        && aligned(pq)
        && aligned(pk)
        && aligned(pv)
}

/// `tree_attention_{vec,scalar}_<T>(const T* q /*[n, ld]*/, const T* k, const T* v
/// /*[capacity, ld]*/, const uint32_t* tiles /*[n_tiles, 4]*/, const uint64_t* tile_ctx
/// /*[n_tiles]*/, const uint32_t* ctx_tokens, T* out /*[n, ld_out]*/, uint32_t head_dim,
/// uint32_t hd_pad, uint32_t ld, uint32_t ld_out, float scale)`, grid (n_tiles, n_head).
/// `variant`: None picks Vec when allowed.
#[allow(clippy::too_many_arguments)]
pub fn tree_attention<T: DeviceFloat>(
    gpu: &Gpu,
    q: &CudaView<T>,
    k: &CudaView<T>,
    v: &CudaView<T>,
    tiles: &DeviceTiles,
    out: &mut CudaViewMut<T>,
    s: AttentionShape,
    variant: Option<AttentionVariant>,
) -> Result<()> {
    if tiles.n_tiles == 0 {
        return Ok(());
    }
    let elem = std::mem::size_of::<T>();
    let allowed = vec_allowed(gpu, s, q, k, v);
    let variant = variant.unwrap_or(AttentionVariant::pick(false, allowed));
    let smem = if variant.is_mma() {
        mma_smem_bytes(s.head_dim, elem)
    } else {
        smem_bytes(s.head_dim, elem)
    };
    check(
        !variant.loads_vectors() || allowed,
        "tree_attention: the vector variants need head_dim % 8 == 0, ld % 8 == 0, aligned buffers",
    )?;
    let func = match variant {
        AttentionVariant::Vec => T::pick(&gpu.kernels.tree_attention_vec),
        AttentionVariant::Scalar => T::pick(&gpu.kernels.tree_attention_scalar),
        AttentionVariant::MmaVec | AttentionVariant::MmaScalar => {
            let Some((i, _)) = mma_instance(s.head_dim) else {
                return Err(crate::error::Error::Backend(format!(
                    "tree_attention: the mma variants take head_dim <= 256, not {}",
                    s.head_dim
                )));
            };
            let loads = if variant.loads_vectors() { 0 } else { 1 };
            T::pick(&gpu.kernels.tree_attention_mma()?[loads][i])
        }
    };
    let cfg = launch_config(gpu, "tree_attention", func, [q, k, v], out, tiles, s, smem)?;
    let u = |v: usize| v as u32;
    let (hd, hdp, ld, ldo) = (u(s.head_dim), u(hd_pad(s.head_dim)), u(s.ld), u(s.ld_out));
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    // SAFETY: argument types match the C signature above; the checks bound every query, key,
    // value and output row the tiles name (q_rows / kv_rows were computed from the same tiles,
    // whose context maps lie inside ctx_tokens by construction); shared memory is sized by the
    // kernel's own layout.
    unsafe {
        gpu.stream
            .launch_builder(func)
            .arg(q)
            .arg(k)
            .arg(v)
            .arg(&tiles.tiles)
            .arg(&tiles.tile_ctx)
            .arg(&tiles.ctx_tokens)
            .arg(out)
            .arg(&hd)
            .arg(&hdp)
            .arg(&ld)
            .arg(&ldo)
            .arg(&scale)
            .launch(cfg)
    }
    .map(|_| ())
    .map_err(driver_err("launching tree_attention"))
}

/// What both attention launchers check and set up: the buffers cover every row the tiles name
/// (`[q, k, v]` at row stride `s.ld`, `out` at `s.ld_out`), `smem` fits the device (raising the
/// function's limit past the default 48 KiB), and the grid: one block of THREADS per (tile, head).
#[allow(clippy::too_many_arguments)]
fn launch_config<T: DeviceFloat>(
    gpu: &Gpu,
    name: &str,
    func: &CudaFunction,
    [q, k, v]: [&CudaView<T>; 3],
    out: &CudaViewMut<T>,
    tiles: &DeviceTiles,
    s: AttentionShape,
    smem: usize,
) -> Result<LaunchConfig> {
    let d = s.n_head * s.head_dim;
    check(
        s.head_dim > 0
            && s.ld >= d
            && s.ld_out >= d
            && q.len() >= need(tiles.q_rows, s.ld, d)
            && k.len() >= need(tiles.kv_rows, s.ld, d)
            && v.len() >= need(tiles.kv_rows, s.ld, d)
            && out.len() >= need(tiles.q_rows, s.ld_out, d),
        &format!("{name}: buffers shorter than the shapes"),
    )?;
    // The heads are the grid's y dimension, which CUDA caps at 65535.
    check(
        s.n_head <= 65535,
        &format!(
            "{name}: {} heads exceed CUDA's grid limit of 65535",
            s.n_head
        ),
    )?;
    check(
        smem <= gpu.max_smem_optin as usize,
        &format!(
            "{name}: head_dim {} needs {smem} bytes of shared memory, the device allows {}",
            s.head_dim, gpu.max_smem_optin
        ),
    )?;
    if smem > 48 * 1024 {
        gpu.ctx
            .bind_to_thread()
            .map_err(driver_err("binding the context"))?;
        func.set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(driver_err(&format!("raising {name}'s shared memory limit")))?;
    }
    Ok(LaunchConfig {
        grid_dim: (tiles.n_tiles as u32, s.n_head as u32, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: smem as u32,
    })
}

/// Dynamic shared memory of a `decode_attention` block: q, 4 per-warp accumulators, m and l.
pub fn decode_smem_bytes(head_dim: usize) -> usize {
    (5 * head_dim + 8) * 4
}

/// `decode_attention_<T>(const T* q, const T* k, const T* v, const uint32_t* tiles,
/// const uint64_t* tile_ctx, const uint32_t* ctx_tokens, T* out, uint32_t head_dim, uint32_t ld,
/// uint32_t ld_out, float scale)`, grid (n_tiles, n_head), block 128: the same contract as
/// `tree_attention`, one block per (tile, head) and tile rows one after another; meant for tiles
/// of one query (decode steps), correct for any.
pub fn decode_attention<T: DeviceFloat>(
    gpu: &Gpu,
    q: &CudaView<T>,
    k: &CudaView<T>,
    v: &CudaView<T>,
    tiles: &DeviceTiles,
    out: &mut CudaViewMut<T>,
    s: AttentionShape,
) -> Result<()> {
    if tiles.n_tiles == 0 {
        return Ok(());
    }
    check(
        !tiles.packed,
        "decode_attention: packed tiles are tree_attention's alone",
    )?;
    let func = T::pick(&gpu.kernels.decode_attention);
    let smem = decode_smem_bytes(s.head_dim);
    let cfg = launch_config(
        gpu,
        "decode_attention",
        func,
        [q, k, v],
        out,
        tiles,
        s,
        smem,
    )?;
    let u = |v: usize| v as u32;
    let (hd, ld, ldo) = (u(s.head_dim), u(s.ld), u(s.ld_out));
    let scale = 1.0 / (s.head_dim as f32).sqrt();
    // SAFETY: argument types match the C signature above; as for tree_attention, the checks
    // bound every query, key, value and output row the tiles name; shared memory is sized by
    // the kernel's layout (decode_smem_bytes).
    unsafe {
        gpu.stream
            .launch_builder(func)
            .arg(q)
            .arg(k)
            .arg(v)
            .arg(&tiles.tiles)
            .arg(&tiles.tile_ctx)
            .arg(&tiles.ctx_tokens)
            .arg(out)
            .arg(&hd)
            .arg(&ld)
            .arg(&ldo)
            .arg(&scale)
            .launch(cfg)
    }
    .map(|_| ())
    .map_err(driver_err("launching decode_attention"))
}
