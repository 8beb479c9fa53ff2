//! The driver's sampling steps on the GPU (`Sampler`, `Decoder`), on a device KV tree: the CUDA
//! side of `crate::cpu::decode` / `crate::cpu::sampler`. `Sampler` runs the algorithm the CPU
//! runs (`crate::sample::cached`) on this engine's store and heads (`Engine`), and the decode
//! session shares the CPU's checks (`crate::sample::batch`): the same errors and the same draws.
//!
//! - `CudaKvTree`: the KV tree of `crate::sample::kv_tree` (the nodes, on the host, shared with
//!   the CPU engine) over a device store: per layer one K and one V buffer
//!   [capacity, stride(n_embd)] of T, rows appended as tokens are computed (`sample` sizes it for
//!   the whole call up front, `propose` grows it once, exactly, when the branches are known, a
//!   decode session told its size allocates that once; otherwise the capacity doubles by
//!   reallocate-and-copy when exceeded). Forks share their prefix rows and cost nothing on the
//!   device.
//! - A forward over new tokens runs the scoring layer loop (`CudaScorer::run_layers`) with the
//!   K/V rows written at the end of the cache and attention tiles built from the nodes
//!   (`TreeTiles::from_groups`): the 64-query tile kernel when a group has several new tokens
//!   (prefill, spliced tool results), `decode_attention` (one block per sequence and head) when
//!   every group has exactly one (decode steps).
//! - Heads: `token_log_probs` computes the full log-softmax in bounded chunks of rows on the
//!   device (`lm_head_xent`) and copies back only the queried tokens; decode steps copy back the
//!   full log-softmax row of each sequence ([rows, vocab] f32, `log_softmax_f32`) and the host
//!   draws from it with `sample::draw` and `sample::sample_rng`, exactly as the CPU does — so both
//!   backends pick the same token from the same row. (At GPT-J size that copy is 201.6 KB per
//!   sample per step; a device-side draw is the next step if it ever shows in a profile.)

use std::sync::atomic::Ordering;

use cudarc::driver::CudaSlice;
use half::{bf16, f16};

use super::context::{stride, DeviceFloat, Gpu};
use super::layer_norm::{self, Rows};
use super::lm_head_xent;
use super::tree_attention::TreeTiles;
use super::weights::CudaWeights;
use super::{check, upload, zeros, CudaScorer, DeviceWeights, NewTokens};
use crate::error::{driver_err, Error, Result};
use crate::model::GptjConfig;
use crate::plan::Plan;
use crate::sample::cached::{self, KvEngine};
use crate::sample::kv_tree::{Group, KvTree};
use crate::sample::{
    batch, Choose, DecodeSession, Decoder, Proposal, Sample, SampleOptions, SampleRequest, Sampler,
};

/// The device store of a KV tree: per layer one K and one V buffer [capacity, stride(n_embd)].
pub struct DeviceKv<T> {
    k: Vec<CudaSlice<T>>,
    v: Vec<CudaSlice<T>>,
    /// Row stride of the K/V buffers (stride(n_embd)).
    ld: usize,
    capacity: usize,
}

/// A KV tree on the device (`crate::sample::kv_tree`).
pub type CudaKvTree<T> = KvTree<DeviceKv<T>>;

impl<T: DeviceFloat> KvTree<DeviceKv<T>> {
    /// An empty tree with room for `capacity` rows per layer.
    pub fn new(gpu: &Gpu, n_layer: usize, n_embd: usize, capacity: usize) -> Result<Self> {
        let ld = stride(n_embd);
        let capacity = capacity.max(1);
        let elements = cache_elements(capacity, ld)?;
        let mut k = Vec::with_capacity(n_layer);
        let mut v = Vec::with_capacity(n_layer);
        for _ in 0..n_layer {
            k.push(zeros::<T>(gpu, elements)?);
            v.push(zeros::<T>(gpu, elements)?);
        }
        Ok(KvTree::with_store(DeviceKv { k, v, ld, capacity }))
    }

    /// Rows the buffers hold before they must grow.
    pub fn capacity(&self) -> usize {
        self.store.capacity
    }

    /// Device bytes the K/V buffers hold: after a growth that failed partway, some buffers
    /// are already larger than `capacity` says.
    pub fn device_bytes(&self) -> usize {
        let kv = &self.store;
        let elements: usize = kv.k.iter().chain(&kv.v).map(|b| b.len()).sum();
        elements * std::mem::size_of::<T>()
    }

    /// Makes room for `extra` more rows, doubling the capacity (at least) when they do not fit:
    /// for a cache whose final size nobody announced.
    fn reserve(&mut self, gpu: &Gpu, extra: usize) -> Result<()> {
        self.reserve_within(gpu, extra, usize::MAX)
    }

    /// `reserve`, the doubling capped at `most` rows (what the cache's sequences can ever hold).
    fn reserve_within(&mut self, gpu: &Gpu, extra: usize, most: usize) -> Result<()> {
        let need = self.rows().saturating_add(extra);
        if need <= self.store.capacity {
            return Ok(());
        }
        self.grow_to(
            gpu,
            need.max(2usize.saturating_mul(self.store.capacity).min(most)),
        )
    }

    /// Makes room for exactly `extra` more rows when they do not fit: for a cache whose final
    /// size is known (a group of `propose`'s branches, a session told its size).
    fn reserve_exact(&mut self, gpu: &Gpu, extra: usize) -> Result<()> {
        let need = self.rows().saturating_add(extra);
        if need <= self.store.capacity {
            return Ok(());
        }
        self.grow_to(gpu, need)
    }

    /// Room for `extra` more rows: `target` rows exactly when given and the device has them,
    /// else by doubling up to `most` rows (`reserve_within`). Returns whether the target was
    /// reached; a target the device could not allocate leaves the buffers as they were (all or
    /// nothing), so that it costs nothing once it has failed.
    fn reserve_toward(
        &mut self,
        gpu: &Gpu,
        extra: usize,
        target: Option<usize>,
        most: usize,
    ) -> Result<bool> {
        if let Some(rows) = target {
            if rows <= self.store.capacity || self.try_grow_to(gpu, rows).is_ok() {
                return Ok(true);
            }
        }
        self.reserve_within(gpu, extra, most).map(|()| false)
    }

    /// `grow_to`, all or nothing: every new buffer is allocated before any replaces its old
    /// one, so a failure frees them and leaves the cache as it was. Its peak is the old buffers
    /// and the new ones together (`grow_to`'s: the new ones and one old one), so a target that
    /// buffer-by-buffer growth would just reach can fail here and fall back to doubling; it
    /// only runs for a size announced after the cache exists (`generate` announces it before).
    fn try_grow_to(&mut self, gpu: &Gpu, capacity: usize) -> Result<()> {
        let elements = cache_elements(capacity, self.store.ld)?;
        let kv = &self.store;
        let mut grown = Vec::with_capacity(kv.k.len() + kv.v.len());
        for buf in kv.k.iter().chain(&kv.v) {
            grown.push(
                (buf.len() < elements)
                    .then(|| zeros::<T>(gpu, elements))
                    .transpose()?,
            );
        }
        let used = self.rows() * self.store.ld;
        let kv = &mut self.store;
        for (buf, new) in kv.k.iter_mut().chain(kv.v.iter_mut()).zip(grown) {
            if let Some(new) = new {
                replace_keeping(gpu, buf, new, used)?;
            }
        }
        kv.capacity = capacity;
        Ok(())
    }

    /// Reallocates every buffer to `capacity` rows, copying the cached rows over. A buffer
    /// already that large (grown by an earlier try that failed on a later buffer) is kept.
    fn grow_to(&mut self, gpu: &Gpu, capacity: usize) -> Result<()> {
        let rows = self.rows();
        let kv = &mut self.store;
        let used = rows * kv.ld;
        let elements = cache_elements(capacity, kv.ld)?;
        for buf in kv.k.iter_mut().chain(kv.v.iter_mut()) {
            if buf.len() >= elements {
                continue;
            }
            replace_keeping(gpu, buf, zeros::<T>(gpu, elements)?, used)?;
        }
        kv.capacity = capacity;
        Ok(())
    }
}

/// Replaces `buf` by the larger `grown`, its first `used` elements copied over.
fn replace_keeping<T: DeviceFloat>(
    gpu: &Gpu,
    buf: &mut CudaSlice<T>,
    mut grown: CudaSlice<T>,
    used: usize,
) -> Result<()> {
    if used > 0 {
        gpu.stream
            .memcpy_dtod(&buf.slice(0..used), &mut grown.slice_mut(0..used))
            .map_err(driver_err("growing the KV cache"))?;
    }
    *buf = grown;
    Ok(())
}

/// Elements of one K or V buffer of `capacity` rows: an error, not a wrapped size, for a cache no
/// device could hold.
fn cache_elements(capacity: usize, ld: usize) -> Result<usize> {
    capacity.checked_mul(ld).ok_or_else(|| {
        Error::Backend(format!(
            "cuda: a KV cache of {capacity} rows is larger than any device memory"
        ))
    })
}

/// What the head gathers (`lm_head_xent`): head row i yields log p(tokens[j] | row i) into
/// slot slots[j] of the output, for j in offsets[i]..offsets[i + 1].
pub(super) struct HeadGather {
    pub offsets: Vec<u32>,
    pub tokens: Vec<u32>,
    pub slots: Vec<u32>,
    /// Output length (slots are below it).
    pub n_out: usize,
}

/// A tree of either storage type (the session does not know the weights' type statically).
enum AnyTree {
    Bf16(CudaKvTree<bf16>),
    F16(CudaKvTree<f16>),
}

impl CudaScorer {
    /// A tree of the weights' storage type.
    fn any_tree(&self, capacity: usize) -> Result<AnyTree> {
        let c = &self.config;
        Ok(match &self.weights {
            DeviceWeights::Bf16(_) => {
                AnyTree::Bf16(CudaKvTree::new(&self.gpu, c.n_layer, c.n_embd, capacity)?)
            }
            DeviceWeights::F16(_) => {
                AnyTree::F16(CudaKvTree::new(&self.gpu, c.n_layer, c.n_embd, capacity)?)
            }
        })
    }

    /// Runs `tokens[g]` at the end of sequence `nodes[g]` for every group g, extending the tree;
    /// returns the final residual stream of the new tokens ([n_new, stride(d)] f32, the last
    /// fc_out bias pending: the heads add it) in order. The caller holds `device_calls`.
    fn extend_tree<T: DeviceFloat>(
        &self,
        w: &CudaWeights<T>,
        tree: &mut CudaKvTree<T>,
        nodes: &[usize],
        tokens: &[Vec<u32>],
    ) -> Result<CudaSlice<f32>> {
        let n: usize = tokens.iter().map(Vec::len).sum();
        tree.reserve(&self.gpu, n)?;
        let (ids, positions, groups) = tree.append(nodes, tokens);
        self.forward_new(w, tree, &ids, &positions, &groups)
    }

    /// The layer loop over new tokens whose cache rows start at `tree.rows()` and whose groups'
    /// contexts are already recorded.
    fn forward_new<T: DeviceFloat>(
        &self,
        w: &CudaWeights<T>,
        tree: &mut CudaKvTree<T>,
        ids: &[u32],
        positions: &[u32],
        groups: &[Group],
    ) -> Result<CudaSlice<f32>> {
        let c = &self.config;
        check(
            positions.iter().all(|&p| (p as usize) < c.n_positions),
            "a position is beyond n_positions",
        )?;
        let n = ids.len();
        let base = tree.rows();
        check(
            base + n <= tree.capacity(),
            "KV tree: rows beyond the capacity",
        )?;
        let host_tiles = TreeTiles::from_groups(groups);
        let single_queries = host_tiles.single_queries();
        let tiles = host_tiles.upload(&self.gpu)?;
        let ids_d = upload(&self.gpu, ids)?;
        let positions_d = upload(&self.gpu, positions)?;
        let x = self.run_layers(
            w,
            NewTokens {
                ids: &ids_d,
                positions: &positions_d,
                n,
                tiles: &tiles,
                single_queries,
            },
            &mut tree.store.k,
            &mut tree.store.v,
            base,
        )?;
        tree.commit(n);
        Ok(x)
    }

    /// ln_f and the LM head at rows `head_rows` of `x` ([x_rows, ds]), chunk by chunk, with the
    /// fused log-softmax and gather of `lm_head_xent` (`gather`); returns its `n_out` values.
    pub(super) fn head_gather<T: DeviceFloat>(
        &self,
        w: &CudaWeights<T>,
        x: &mut CudaSlice<f32>,
        x_rows: usize,
        head_rows: &[u32],
        gather: &HeadGather,
    ) -> Result<Vec<f32>> {
        let gpu = &self.gpu;
        let offsets_d = upload(gpu, &gather.offsets)?;
        let tokens_d = upload(gpu, &gather.tokens)?;
        let slots_d = upload(gpu, &gather.slots)?;
        let mut out = zeros::<f32>(gpu, gather.n_out)?;
        let vocab = self.config.vocab_size;
        let vs = stride(vocab);
        self.head_chunks(w, x, x_rows, head_rows, |logits, r0, m| {
            lm_head_xent::lm_head_xent(
                gpu,
                &logits.as_view(),
                &w.lm_head_b.as_view(),
                &offsets_d.slice(r0..r0 + m + 1),
                &tokens_d.as_view(),
                &slots_d.as_view(),
                &mut out.as_view_mut(),
                [m, vocab, vs],
                gather.tokens.len(),
                None,
            )
        })?;
        let mut host = gpu
            .stream
            .clone_dtoh(&out)
            .map_err(driver_err("downloading log-probs"))?;
        gpu.sync()?;
        host.truncate(gather.n_out);
        Ok(host)
    }

    /// Full log-softmax rows ([rows.len()][vocab]) at rows `rows` of `x`, copied back.
    fn head_log_softmax<T: DeviceFloat>(
        &self,
        w: &CudaWeights<T>,
        x: &mut CudaSlice<f32>,
        x_rows: usize,
        rows: &[u32],
    ) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(rows.len());
        self.head_log_softmax_each(w, x, x_rows, rows, |_, row| out.push(row.to_vec()))?;
        Ok(out)
    }

    /// As `head_log_softmax`, handing each row to `each(k, row)` (k: its index in `rows`, in
    /// order) instead of keeping them: the host holds one chunk of rows at a time.
    fn head_log_softmax_each<T: DeviceFloat>(
        &self,
        w: &CudaWeights<T>,
        x: &mut CudaSlice<f32>,
        x_rows: usize,
        rows: &[u32],
        mut each: impl FnMut(usize, &[f32]),
    ) -> Result<()> {
        let gpu = &self.gpu;
        let vocab = self.config.vocab_size;
        let vs = stride(vocab);
        let mut lp = zeros::<f32>(gpu, self.head_chunk_rows.min(rows.len()) * vs)?;
        self.head_chunks(w, x, x_rows, rows, |logits, r0, m| {
            lm_head_xent::log_softmax(
                gpu,
                &logits.as_view(),
                &w.lm_head_b.as_view(),
                &mut lp.as_view_mut(),
                [m, vocab, vs, vs],
                None,
            )?;
            let host = gpu
                .stream
                .clone_dtoh(&lp.slice(0..m * vs))
                .map_err(driver_err("downloading log-softmax rows"))?;
            gpu.sync()?;
            for (j, row) in host.chunks(vs).enumerate() {
                each(r0 + j, &row[..vocab]);
            }
            Ok(())
        })
    }

    /// ln_f and the lm_head GEMM over `rows` of `x` in chunks of at most `head_chunk_rows`;
    /// `each(logits [m, stride(vocab)] f32, first row index, m)` consumes a chunk. `x` is
    /// `&mut` for the layer_norm launcher's sake only: gathering rows, ln_f adds the pending
    /// fc_out bias to what it reads and never writes `x`, so the heads may read one `x` again.
    pub(super) fn head_chunks<T: DeviceFloat>(
        &self,
        w: &CudaWeights<T>,
        x: &mut CudaSlice<f32>,
        x_rows: usize,
        rows: &[u32],
        mut each: impl FnMut(&CudaSlice<f32>, usize, usize) -> Result<()>,
    ) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let (c, gpu) = (&self.config, &self.gpu);
        let (d, vocab) = (c.n_embd, c.vocab_size);
        let (ds, vs) = (stride(d), stride(vocab));
        let eps = c.layer_norm_epsilon as f32;
        let chunk = self.head_chunk_rows.min(rows.len());
        let rows_d = upload(gpu, rows)?;
        let mut hidden = zeros::<T>(gpu, chunk * ds)?; // [chunk, ds]
        let mut logits = zeros::<f32>(gpu, chunk * vs)?; // [chunk, vs]
        let rb = w.h.last().map(|b| b.fc_out_b.as_view());
        for r0 in (0..rows.len()).step_by(chunk) {
            let m = chunk.min(rows.len() - r0);
            let rows_view = rows_d.slice(r0..r0 + m);
            layer_norm::layer_norm(
                gpu,
                &mut x.as_view_mut(),
                x_rows,
                Rows {
                    gather: Some(&rows_view),
                    residual_bias: rb.as_ref(),
                },
                &w.ln_f.weight.as_view(),
                &w.ln_f.bias.as_view(),
                &mut hidden.as_view_mut(),
                [m, d, ds, ds],
                eps,
                None,
            )?;
            gpu.blas.linear(
                &hidden.as_view(),
                ds,
                &w.lm_head.as_view(),
                ds,
                &mut logits.as_view_mut(),
                vs,
                [m, vocab, d],
                false,
            )?;
            each(&logits, r0, m)?;
        }
        Ok(())
    }
}

/// The engine at its weights' storage type, as the sampling algorithm (`crate::sample::cached`)
/// runs on it. The caller holds `device_calls`.
struct Engine<'a, T> {
    scorer: &'a CudaScorer,
    w: &'a CudaWeights<T>,
}

impl<'a, T> Engine<'a, T> {
    fn new(scorer: &'a CudaScorer, w: &'a CudaWeights<T>) -> Self {
        Engine { scorer, w }
    }
}

/// A forward's final residual stream on the device: [rows, stride(n_embd)] f32, the last fc_out
/// bias pending (the heads add it).
struct Hidden {
    x: CudaSlice<f32>,
    rows: usize,
}

impl<T: DeviceFloat> KvEngine for Engine<'_, T> {
    type Store = DeviceKv<T>;
    type Hidden = Hidden;

    fn config(&self) -> &GptjConfig {
        &self.scorer.config
    }

    /// A token's activations and K/V; a group may use the memory budget within the operand cap
    /// of `max_chunk_tokens`.
    fn sample_budget(&self) -> (batch::TokenBytes, usize) {
        let s = self.scorer;
        let kv = s.kv_bytes_per_token();
        let bytes = batch::TokenBytes {
            activations: s.bytes_per_token() - kv,
            kv,
        };
        (bytes, s.max_chunk_tokens() * s.bytes_per_token())
    }

    fn new_tree(&self, rows: usize) -> Result<CudaKvTree<T>> {
        let c = &self.scorer.config;
        CudaKvTree::new(&self.scorer.gpu, c.n_layer, c.n_embd, rows)
    }

    fn reserve(&self, tree: &mut CudaKvTree<T>, rows: usize) -> Result<()> {
        tree.reserve_exact(&self.scorer.gpu, rows)
    }

    fn prefill_tree(&self, tree: &mut CudaKvTree<T>, plan: &Plan) -> Result<(Vec<usize>, Hidden)> {
        tree.reserve(&self.scorer.gpu, plan.n_tokens())?;
        let (nodes, groups) = tree.add_plan(plan);
        let x = self
            .scorer
            .forward_new(self.w, tree, &plan.tokens, &plan.positions, &groups)?;
        let rows = plan.n_tokens();
        Ok((nodes, Hidden { x, rows }))
    }

    fn extend_tree(
        &self,
        tree: &mut CudaKvTree<T>,
        nodes: &[usize],
        tokens: &[Vec<u32>],
    ) -> Result<Hidden> {
        let x = self.scorer.extend_tree(self.w, tree, nodes, tokens)?;
        let rows = tokens.iter().map(Vec::len).sum();
        Ok(Hidden { x, rows })
    }

    /// Chunk by chunk; the full log-softmax stays on the device, only `tokens` come back.
    fn head_token_log_probs(&self, mut hidden: Hidden, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let (nt, x_rows) = (tokens.len(), hidden.rows);
        if nt == 0 || x_rows == 0 {
            return Ok(vec![Vec::new(); x_rows]);
        }
        // The gather's offsets and slots are u32 on the device.
        if u32::try_from(x_rows.saturating_mul(nt)).is_err() {
            return Err(Error::input(format!(
                "{x_rows} rows x {nt} tokens asked for are more log-probabilities than one \
                 call returns (2^32)"
            )));
        }
        // The gather's offsets, tokens and slots and its output take 16 bytes per (row, token)
        // on the device, outside the budget: rows in blocks whose gather is no larger than the
        // head's own logits scratch (one block when few tokens are asked for, as the driver's
        // "[" is). Each block's rows are disjoint, so ln_f's bias goes into each row once.
        let scratch = self.scorer.head_chunk_rows * stride(self.scorer.config.vocab_size) * 4;
        let block = (scratch / (16 * nt)).clamp(1, x_rows);
        let mut out = Vec::with_capacity(x_rows);
        for r0 in (0..x_rows).step_by(block) {
            let m = block.min(x_rows - r0);
            let rows: Vec<u32> = (r0 as u32..(r0 + m) as u32).collect();
            let gather = HeadGather {
                offsets: (0..=m as u32).map(|i| i * nt as u32).collect(),
                tokens: (0..m).flat_map(|_| tokens.iter().copied()).collect(),
                slots: (0..(m * nt) as u32).collect(),
                n_out: m * nt,
            };
            let values = self
                .scorer
                .head_gather(self.w, &mut hidden.x, x_rows, &rows, &gather)?;
            out.extend(values.chunks(nt).map(<[f32]>::to_vec));
        }
        Ok(out)
    }

    fn head_log_softmax_each(
        &self,
        mut hidden: Hidden,
        rows: &[u32],
        each: impl FnMut(usize, &[f32]),
    ) -> Result<()> {
        self.scorer
            .head_log_softmax_each(self.w, &mut hidden.x, hidden.rows, rows, each)
    }
}

impl Sampler for CudaScorer {
    fn token_log_probs(&self, ids: &[u32], tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let _device = self.lock_device()?;
        match &self.weights {
            DeviceWeights::Bf16(w) => cached::token_log_probs(&Engine::new(self, w), ids, tokens),
            DeviceWeights::F16(w) => cached::token_log_probs(&Engine::new(self, w), ids, tokens),
        }
    }

    fn sample(
        &self,
        requests: &[SampleRequest],
        options: &SampleOptions,
    ) -> Result<Vec<Vec<Sample>>> {
        let _device = self.lock_device()?;
        match &self.weights {
            DeviceWeights::Bf16(w) => cached::sample(&Engine::new(self, w), requests, options),
            DeviceWeights::F16(w) => cached::sample(&Engine::new(self, w), requests, options),
        }
    }

    fn propose(
        &self,
        ids: &[u32],
        tokens: &[u32],
        choose: &mut Choose<'_>,
        options: &SampleOptions,
    ) -> Result<Proposal> {
        // Held across `choose` too (the sequence's cache stays allocated while it picks), so
        // a call on this scorer from `choose` is an error (`lock_device`).
        let _device = self.lock_device()?;
        match &self.weights {
            DeviceWeights::Bf16(w) => {
                cached::propose(&Engine::new(self, w), ids, tokens, choose, options)
            }
            DeviceWeights::F16(w) => {
                cached::propose(&Engine::new(self, w), ids, tokens, choose, options)
            }
        }
    }
}

/// Least rows of a decode session's first cache when nobody said how large it will grow
/// (`DecodeSession::reserve`); past it, it doubles as sequences grow.
const SESSION_CAPACITY: usize = 256;

/// Fewest new tokens a piece of a session's `extend` runs (its activations: ~10 MB at 6B).
const SESSION_MIN_PIECE: usize = 64;

/// A decode session on the GPU: a device KV tree with one node per sequence. Its cache stays
/// allocated between calls, so its bytes count against the scorer's memory budget
/// (`CudaScorer::session_kv_bytes`) until the session is dropped.
pub struct CudaDecodeSession<'a> {
    engine: &'a CudaScorer,
    /// None until the first sequence (allocation errors surface from `extend`).
    tree: Option<AnyTree>,
    /// Per sequence: its node in `tree` (its length is the tree's `len`).
    nodes: Vec<usize>,
    /// Bytes of `tree` added to the engine's `session_kv_bytes`.
    counted: usize,
    /// Rows the caller said the cache will hold (`reserve`): grown to exactly that, once.
    planned: usize,
}

impl Decoder for CudaScorer {
    fn session(&self) -> Box<dyn DecodeSession + Send + '_> {
        Box::new(CudaDecodeSession {
            engine: self,
            tree: None,
            nodes: Vec::new(),
            counted: 0,
            planned: 0,
        })
    }
}

impl CudaDecodeSession<'_> {
    fn tree_len(&self, node: usize) -> usize {
        match &self.tree {
            Some(AnyTree::Bf16(t)) => t.len(node),
            Some(AnyTree::F16(t)) => t.len(node),
            None => 0,
        }
    }

    fn tree_rows(&self) -> usize {
        match &self.tree {
            Some(AnyTree::Bf16(t)) => t.rows(),
            Some(AnyTree::F16(t)) => t.rows(),
            None => 0,
        }
    }

    /// Brings the engine's count of session cache bytes up to the tree's size now.
    fn count_cache(&mut self) {
        let bytes = match &self.tree {
            Some(AnyTree::Bf16(t)) => t.device_bytes(),
            Some(AnyTree::F16(t)) => t.device_bytes(),
            None => 0,
        };
        let count = &self.engine.session_kv_bytes;
        if bytes > self.counted {
            count.fetch_add(bytes - self.counted, Ordering::Relaxed);
        } else {
            count.fetch_sub(self.counted - bytes, Ordering::Relaxed);
        }
        self.counted = bytes;
    }
}

impl Drop for CudaDecodeSession<'_> {
    fn drop(&mut self) {
        // cudarc frees a buffer in whatever context the dropping thread has current, and a
        // session may be dropped on another thread than the one that used it: bind ours first,
        // or the frees fail (leaking the cache) and leave their error for the next call.
        if self.tree.is_some() {
            let _ = self.engine.gpu.ctx.bind_to_thread();
        }
        self.tree = None;
        self.count_cache();
    }
}

impl DecodeSession for CudaDecodeSession<'_> {
    fn new_sequence(&mut self) -> usize {
        // Node ids equal sequence ids: the tree creates one root per sequence, in order, when it
        // is allocated (lazily, so that this infallible call allocates nothing).
        self.nodes.push(self.nodes.len());
        if let Some(tree) = &mut self.tree {
            match tree {
                AnyTree::Bf16(t) => t.root(),
                AnyTree::F16(t) => t.root(),
            };
        }
        self.nodes.len() - 1
    }

    fn extend(&mut self, sequences: &[usize], tokens: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let engine = self.engine;
        // One `extend` at a time per scorer, as its other calls. The cache this session keeps
        // between calls is counted against the budget the others plan with (`count_cache`).
        let _device = engine.lock_device()?;
        let c = &engine.config;
        let nodes = batch::check_extend(
            sequences,
            tokens,
            &self.nodes,
            |n| self.tree_len(n),
            c.vocab_size,
            c.n_positions,
        )?;
        // The cache is grown for the whole call first (to the announced size when the call
        // stays within it, else by doubling) and counted, then the call runs in pieces within
        // what the budget leaves for activations.
        let n: usize = tokens.iter().map(Vec::len).sum();
        let need = self.tree_rows() + n;
        // No more than the sequences can ever hold, announced (a hint past that is a caller's
        // slip) or grown.
        let most = self.nodes.len().saturating_mul(c.n_positions);
        let planned = self.planned.min(most);
        let mut exact = need <= planned;
        if self.tree.is_none() {
            // The announced size, or (that failing, or none) what this call needs. A size that
            // failed is not tried again: the session grows by doubling from then on.
            let mut tree = match exact.then(|| engine.any_tree(planned)) {
                Some(Ok(tree)) => tree,
                tried => {
                    if tried.is_some() {
                        (exact, self.planned) = (false, 0);
                    }
                    engine.any_tree(need.max(SESSION_CAPACITY.min(most)))?
                }
            };
            for _ in 0..self.nodes.len() {
                match &mut tree {
                    AnyTree::Bf16(t) => t.root(),
                    AnyTree::F16(t) => t.root(),
                };
            }
            self.tree = Some(tree);
        }
        // A failed call adds nothing: the sequences keep their lengths and the next call reuses
        // the rows (a device error can also be fatal to the context; then every call fails).
        fn step<T: DeviceFloat>(
            engine: &CudaScorer,
            w: &CudaWeights<T>,
            t: &mut CudaKvTree<T>,
            nodes: &[usize],
            tokens: &[Vec<u32>],
        ) -> Result<Vec<Vec<f32>>> {
            // At least `SESSION_MIN_PIECE`: a cache that alone fills the budget slows the call
            // down, it does not make every token a forward of its own.
            let max_tokens = engine.max_cached_tokens().max(SESSION_MIN_PIECE);
            let checkpoint = t.checkpoint(nodes);
            let out = batch::extend_in_pieces(nodes, tokens, max_tokens, |nodes, tokens, last| {
                let n = tokens.iter().map(Vec::len).sum();
                let mut x = engine.extend_tree(w, t, nodes, tokens)?;
                if last.is_empty() {
                    return Ok(Vec::new());
                }
                engine.head_log_softmax(w, &mut x, n, last)
            });
            if out.is_err() {
                t.restore(checkpoint);
            }
            out
        }
        // To the announced size, else (none, or that allocation failing) by doubling.
        let gpu = &engine.gpu;
        let target = exact.then_some(planned);
        let grown = match self.tree.as_mut().expect("allocated above") {
            AnyTree::Bf16(t) => t.reserve_toward(gpu, n, target, most),
            AnyTree::F16(t) => t.reserve_toward(gpu, n, target, most),
        };
        self.count_cache();
        if target.is_some() && !matches!(grown, Ok(true)) {
            self.planned = 0;
        }
        grown?;
        let out = match (
            &engine.weights,
            self.tree.as_mut().expect("allocated above"),
        ) {
            (DeviceWeights::Bf16(w), AnyTree::Bf16(t)) => step(engine, w, t, &nodes, tokens),
            (DeviceWeights::F16(w), AnyTree::F16(t)) => step(engine, w, t, &nodes, tokens),
            _ => Err(Error::Backend(
                "cuda: decode session tree and weights disagree on the storage type".into(),
            )),
        };
        // Grown or not, failed or not: the cache's size now.
        self.count_cache();
        out
    }

    /// The cache grows to the rows already held plus `rows` at the next `extend` that stays
    /// within them, at once (allocated then, so that errors surface from `extend`).
    fn reserve(&mut self, rows: usize) {
        self.planned = self.tree_rows().saturating_add(rows);
    }

    fn len(&self, sequence: usize) -> usize {
        self.nodes.get(sequence).map_or(0, |&n| self.tree_len(n))
    }
}
