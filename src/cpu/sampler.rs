//! The driver's sampling steps on the CPU engine (`Sampler`, `Decoder`), on the KV tree of
//! `decode`: the engine's side of `crate::sample::cached` (its store and its heads), which runs
//! the algorithm for both backends.

use super::decode::{HostKv, KvTree};
use super::head;
use super::CpuScorer;
use crate::error::Result;
use crate::model::GptjConfig;
use crate::plan::Plan;
use crate::sample::cached::{self, KvEngine};
use crate::sample::kv_tree::NodeId;
use crate::sample::{
    batch, Choose, DecodeSession, Decoder, Proposal, Sample, SampleOptions, SampleRequest, Sampler,
};

/// Rows of full log-softmax computed at once (bounds the [rows, vocab] buffer).
const HEAD_CHUNK_ROWS: usize = 64;

impl KvEngine for CpuScorer {
    type Store = HostKv;
    /// [rows, d], before ln_f.
    type Hidden = Vec<f32>;

    fn config(&self) -> &GptjConfig {
        &self.config
    }

    /// A sampled token's memory: its activations, and its K/V (f32, every layer) in the cache;
    /// a group may use the whole memory budget.
    fn sample_budget(&self) -> (batch::TokenBytes, usize) {
        let c = &self.config;
        let bytes = batch::TokenBytes {
            activations: self.bytes_per_token(),
            kv: 2 * 4 * c.n_embd * c.n_layer,
        };
        (bytes, self.memory_budget)
    }

    fn new_tree(&self, rows: usize) -> Result<KvTree> {
        let mut tree = KvTree::new(self.config.n_layer);
        tree.reserve_exact(self.config.n_embd, rows)?;
        Ok(tree)
    }

    fn reserve(&self, tree: &mut KvTree, rows: usize) -> Result<()> {
        tree.reserve_exact(self.config.n_embd, rows)
    }

    fn prefill_tree(&self, tree: &mut KvTree, plan: &Plan) -> Result<(Vec<NodeId>, Vec<f32>)> {
        Ok(self.prefill(tree, plan))
    }

    fn extend_tree(
        &self,
        tree: &mut KvTree,
        nodes: &[NodeId],
        tokens: &[Vec<u32>],
    ) -> Result<Vec<f32>> {
        Ok(self.extend(tree, nodes, tokens))
    }

    /// The scoring head's tiles (`head::log_probs_at`), no full log-softmax rows.
    fn head_token_log_probs(&self, x: Vec<f32>, tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let c = &self.config;
        let n = x.len() / c.n_embd;
        if tokens.is_empty() {
            return Ok(vec![Vec::new(); n]);
        }
        let rows: Vec<u32> = (0..n as u32).collect();
        let targets: Vec<(u32, u32)> = rows
            .iter()
            .flat_map(|&r| tokens.iter().map(move |&t| (r, t)))
            .collect();
        let eps = c.layer_norm_epsilon as f32;
        let dims = [c.n_embd, c.vocab_size];
        let lp = super::on_pool(|| {
            head::log_probs_at(&x, &rows, &targets, &self.weights, dims, eps, head::TILES)
        });
        Ok(lp
            .chunks(tokens.len())
            .map(|row| row.iter().map(|&v| v as f32).collect())
            .collect())
    }

    /// `HEAD_CHUNK_ROWS` rows at a time, from a copy of the rows asked for (the rest of `x` is
    /// freed first).
    fn head_log_softmax_each(
        &self,
        x: Vec<f32>,
        rows: &[u32],
        mut each: impl FnMut(usize, &[f32]),
    ) -> Result<()> {
        let (d, vocab) = (self.config.n_embd, self.config.vocab_size);
        let x = gather_rows(x, rows, d); // [rows.len(), d]
        for (chunk_i, chunk) in x.chunks(HEAD_CHUNK_ROWS * d).enumerate() {
            let lp = self.log_softmax_rows(chunk);
            for (j, row) in lp.chunks(vocab).enumerate() {
                each(chunk_i * HEAD_CHUNK_ROWS + j, row);
            }
        }
        Ok(())
    }
}

/// Rows `rows` of `x` ([n, d]), in order; `x` is dropped, or returned when `rows` is every row
/// (a decoding step).
fn gather_rows(x: Vec<f32>, rows: &[u32], d: usize) -> Vec<f32> {
    let every = rows.len() * d == x.len() && rows.iter().enumerate().all(|(i, &r)| r as usize == i);
    if every {
        return x;
    }
    rows.iter()
        .flat_map(|&r| x[r as usize * d..(r as usize + 1) * d].iter().copied())
        .collect()
}

impl Sampler for CpuScorer {
    fn token_log_probs(&self, ids: &[u32], tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        cached::token_log_probs(self, ids, tokens)
    }

    fn sample(
        &self,
        requests: &[SampleRequest],
        options: &SampleOptions,
    ) -> Result<Vec<Vec<Sample>>> {
        cached::sample(self, requests, options)
    }

    fn propose(
        &self,
        ids: &[u32],
        tokens: &[u32],
        choose: &mut Choose<'_>,
        options: &SampleOptions,
    ) -> Result<Proposal> {
        cached::propose(self, ids, tokens, choose, options)
    }
}

/// A decode session on the CPU: a KV tree with one node per sequence.
pub struct CpuDecodeSession<'a> {
    engine: &'a CpuScorer,
    tree: KvTree,
    nodes: Vec<usize>,
}

impl Decoder for CpuScorer {
    fn session(&self) -> Box<dyn DecodeSession + Send + '_> {
        Box::new(CpuDecodeSession {
            engine: self,
            tree: KvTree::new(self.config.n_layer),
            nodes: Vec::new(),
        })
    }
}

impl DecodeSession for CpuDecodeSession<'_> {
    fn new_sequence(&mut self) -> usize {
        self.nodes.push(self.tree.root());
        self.nodes.len() - 1
    }

    fn extend(&mut self, sequences: &[usize], tokens: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.engine.config;
        let tree = &self.tree;
        let nodes = batch::check_extend(
            sequences,
            tokens,
            &self.nodes,
            |n| tree.len(n),
            c.vocab_size,
            c.n_positions,
        )?;
        // Pieces within the budget's activations; only the last new token of each sequence
        // needs the head.
        let max_tokens = (self.engine.memory_budget / self.engine.bytes_per_token()).max(1);
        let (engine, tree) = (self.engine, &mut self.tree);
        batch::extend_in_pieces(&nodes, tokens, max_tokens, |nodes, tokens, last| {
            let x = engine.extend(tree, nodes, tokens);
            if last.is_empty() {
                return Ok(Vec::new());
            }
            // The rows returned are the caller's; the [rows, vocab] block they are copied from
            // exists one head chunk at a time, not beside all of them.
            let x = gather_rows(x, last, c.n_embd);
            let mut rows = Vec::with_capacity(last.len());
            for chunk in x.chunks(HEAD_CHUNK_ROWS * c.n_embd) {
                let lp = engine.log_softmax_rows(chunk);
                rows.extend(lp.chunks(c.vocab_size).map(<[f32]>::to_vec));
            }
            Ok(rows)
        })
    }

    /// Allocated now (the host store has no budget count to keep); a cache that cannot be is
    /// left to grow as it goes.
    fn reserve(&mut self, rows: usize) {
        let _ = self.tree.reserve_exact(self.engine.config.n_embd, rows);
    }

    fn len(&self, sequence: usize) -> usize {
        self.nodes.get(sequence).map_or(0, |&n| self.tree.len(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{DType, GptjWeights};

    /// No tokens asked for: a row per position, each empty (as the oracle's sampler gives them),
    /// not a split of the head's output into rows of zero.
    #[test]
    fn token_log_probs_of_no_tokens_are_empty_rows() {
        let config = GptjConfig::small(1, 8, 2, 4, 37);
        let weights = GptjWeights::random(&config, 3, DType::F32);
        let cpu = CpuScorer::from_weights(&config, weights).unwrap();
        let got = cpu.token_log_probs(&[3, 1, 4], &[]).unwrap();
        assert_eq!(got, vec![Vec::<f32>::new(); 3]);
    }

    /// Exactly the rows asked for, in their order: the first rows of more (not all of them),
    /// every row out of order, one row twice; every row in order is `x` itself.
    #[test]
    fn gather_rows_gives_the_rows_asked_for() {
        let x: Vec<f32> = (0..6).map(|v| v as f32).collect(); // 3 rows of 2
        assert_eq!(gather_rows(x.clone(), &[0, 1], 2), [0.0, 1.0, 2.0, 3.0]);
        assert_eq!(
            gather_rows(x.clone(), &[2, 0, 1], 2),
            [4.0, 5.0, 0.0, 1.0, 2.0, 3.0]
        );
        assert_eq!(gather_rows(x.clone(), &[1, 1], 2), [2.0, 3.0, 2.0, 3.0]);
        assert_eq!(gather_rows(x.clone(), &[0, 1, 2], 2), x);
    }
}
