//! The driver's sampling steps on the CPU engine (`Sampler`), on the KV tree of `decode`.

use super::decode::KvTree;
use super::head;
use super::CpuScorer;
use crate::error::Result;
use crate::plan::Plan;
use crate::sample::{
    batch, Branch, Choose, DecodeSession, Decoder, Proposal, Sample, SampleOptions, SampleRequest,
    Sampler,
};

/// Rows of full log-softmax computed at once (bounds the [rows, vocab] buffer).
const HEAD_CHUNK_ROWS: usize = 64;

impl CpuScorer {
    /// Per row of `x` (final residual stream, [rows, d]), the log-probabilities of `tokens`:
    /// the scoring head's tiles (`head::log_probs_at`), no full log-softmax rows.
    fn token_rows(&self, x: &[f32], tokens: &[u32]) -> Vec<Vec<f32>> {
        let c = &self.config;
        let n = x.len() / c.n_embd;
        if tokens.is_empty() {
            return vec![Vec::new(); n];
        }
        let rows: Vec<u32> = (0..n as u32).collect();
        let targets: Vec<(u32, u32)> = rows
            .iter()
            .flat_map(|&r| tokens.iter().map(move |&t| (r, t)))
            .collect();
        let eps = c.layer_norm_epsilon as f32;
        let dims = [c.n_embd, c.vocab_size];
        let lp = super::on_pool(|| {
            head::log_probs_at(x, &rows, &targets, &self.weights, dims, eps, head::TILES)
        });
        lp.chunks(tokens.len())
            .map(|row| row.iter().map(|&v| v as f32).collect())
            .collect()
    }

    /// The full log-softmax after each row of `x` (final residual stream), handed to
    /// `each(row index, row)` in order and computed `HEAD_CHUNK_ROWS` rows at a time.
    fn each_log_softmax_row(&self, x: &[f32], mut each: impl FnMut(usize, &[f32])) {
        let (d, vocab) = (self.config.n_embd, self.config.vocab_size);
        for (chunk_i, chunk) in x.chunks(HEAD_CHUNK_ROWS * d).enumerate() {
            let lp = self.log_softmax_rows(chunk);
            for (j, row) in lp.chunks(vocab).enumerate() {
                each(chunk_i * HEAD_CHUNK_ROWS + j, row);
            }
        }
    }

    /// Draws the first tokens of `requests` from the rows of `x`, one row per request.
    fn draw_first(&self, x: &[f32], requests: &[SampleRequest], draws: &mut batch::FirstDraws<'_>) {
        self.each_log_softmax_row(x, |k, row| draws.push(k, &requests[k], row));
    }

    /// A sampled token's memory: its activations, and its K/V (f32, every layer) in the cache.
    fn sample_token_bytes(&self) -> batch::TokenBytes {
        let c = &self.config;
        batch::TokenBytes {
            activations: self.bytes_per_token(),
            kv: 2 * 4 * c.n_embd * c.n_layer,
        }
    }

    /// One group of `sample`'s requests (`first_request`: the first one's batch index) in a KV
    /// tree of its own: every prefix prefilled once as a prefix tree, each request's first
    /// tokens drawn from its row, then the decoding loop.
    fn sample_group(
        &self,
        requests: &[SampleRequest],
        first_request: usize,
        options: &SampleOptions,
    ) -> Result<Vec<Vec<Sample>>> {
        let d = self.config.n_embd;
        let mut tree = KvTree::new(self.config.n_layer);
        let prefixes: Vec<Vec<u32>> = requests.iter().map(|r| r.prefix.clone()).collect();
        let (plan, last_rows) = Plan::from_sequences(&prefixes);
        let (seg_nodes, x) = self.prefill(&mut tree, &plan);
        let last_rows: Vec<usize> = last_rows
            .into_iter()
            .map(|r| r.expect("non-empty prefix") as usize)
            .collect();
        let first_rows: Vec<f32> = last_rows
            .iter()
            .flat_map(|&row| x[row * d..(row + 1) * d].iter().copied())
            .collect();
        drop(x);
        let mut first = batch::FirstDraws::new(options, first_request);
        self.draw_first(&first_rows, requests, &mut first);
        let nodes = tree.fork_samples(requests, &plan, &seg_nodes, &last_rows);
        self.decode_samples(&mut tree, requests, first, nodes)
    }

    /// One group of `propose`'s branches (`first_request`: the first one's index), with
    /// `requests` their sample requests: each branch forks the sequence cached at `root` and
    /// computes only its own token, then its samples are drawn and decoded.
    fn propose_group(
        &self,
        tree: &mut KvTree,
        root: usize,
        branches: &[Branch],
        requests: &[SampleRequest],
        first_request: usize,
        options: &SampleOptions,
    ) -> Result<Vec<Vec<Sample>>> {
        let prefix_nodes: Vec<usize> = branches.iter().map(|b| tree.fork(root, b.at)).collect();
        let opens: Vec<Vec<u32>> = branches.iter().map(|b| vec![b.token]).collect();
        let x = self.extend(tree, &prefix_nodes, &opens);
        let mut first = batch::FirstDraws::new(options, first_request);
        self.draw_first(&x, requests, &mut first);
        drop(x);
        let nodes = tree.fork_each(requests, &prefix_nodes);
        self.decode_samples(tree, requests, first, nodes)
    }

    /// The decoding loop of `requests` from their first draws, sample i growing node
    /// `nodes[i]` of `tree`.
    fn decode_samples(
        &self,
        tree: &mut KvTree,
        requests: &[SampleRequest],
        first: batch::FirstDraws<'_>,
        nodes: Vec<usize>,
    ) -> Result<Vec<Vec<Sample>>> {
        batch::decode(requests, first, nodes, |nodes, tokens, each| {
            let x = self.extend(tree, nodes, tokens);
            self.each_log_softmax_row(&x, each);
            Ok(())
        })
    }
}

impl Sampler for CpuScorer {
    fn token_log_probs(&self, ids: &[u32], tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        let c = &self.config;
        batch::check_sequence(ids, tokens, c.vocab_size, c.n_positions)?;
        let mut tree = KvTree::new(c.n_layer);
        let root = tree.root();
        let x = self.extend(&mut tree, &[root], &[ids.to_vec()]);
        Ok(self.token_rows(&x, tokens))
    }

    fn sample(
        &self,
        requests: &[SampleRequest],
        options: &SampleOptions,
    ) -> Result<Vec<Vec<Sample>>> {
        let c = &self.config;
        batch::check_requests("request", requests, options, c.vocab_size, c.n_positions)?;
        if let Some(empty) = batch::nothing_to_draw(requests, options) {
            return Ok(empty);
        }
        // Groups of requests run one after another, each within the memory budget.
        let bytes = self.sample_token_bytes();
        let mut out = Vec::with_capacity(requests.len());
        let whole = |r: &SampleRequest| r.prefix.len();
        for group in batch::sample_groups(requests, options, self.memory_budget, bytes, whole) {
            out.extend(self.sample_group(&requests[group.clone()], group.start, options)?);
        }
        Ok(out)
    }

    fn propose(
        &self,
        ids: &[u32],
        tokens: &[u32],
        choose: &mut Choose<'_>,
        options: &SampleOptions,
    ) -> Result<Proposal> {
        let c = &self.config;
        batch::check_sequence(ids, tokens, c.vocab_size, c.n_positions)?;
        let mut tree = KvTree::new(c.n_layer);
        let root = tree.root();
        let x = self.extend(&mut tree, &[root], &[ids.to_vec()]);
        let log_probs = self.token_rows(&x, tokens);
        drop(x);
        let (branches, requests) = batch::choose_branches(
            ids,
            &log_probs,
            choose,
            options,
            c.vocab_size,
            c.n_positions,
        )?;
        let samples = match batch::nothing_to_draw(&requests, options) {
            Some(empty) => empty,
            None => {
                // Branches run in groups within the budget (less the sequence's cached K/V),
                // each group's rows freed before the next: the same samples in any grouping.
                let bytes = self.sample_token_bytes();
                let budget = self.memory_budget.saturating_sub(ids.len() * bytes.kv);
                let mut samples = Vec::with_capacity(requests.len());
                for group in batch::sample_groups(&requests, options, budget, bytes, |_| 1) {
                    samples.extend(tree.scoped(|tree| {
                        self.propose_group(
                            tree,
                            root,
                            &branches[group.clone()],
                            &requests[group.clone()],
                            group.start,
                            options,
                        )
                    })?);
                }
                samples
            }
        };
        Ok(Proposal {
            log_probs,
            branches,
            samples,
        })
    }
}

/// A decode session on the CPU: a KV tree with one node per sequence.
pub struct CpuDecodeSession<'a> {
    engine: &'a CpuScorer,
    tree: KvTree,
    nodes: Vec<usize>,
}

impl Decoder for CpuScorer {
    fn session(&self) -> Box<dyn DecodeSession + '_> {
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
        let d = c.n_embd;
        let x = self.engine.extend(&mut self.tree, &nodes, tokens);
        // Only the last new token of each sequence needs the head.
        let last: Vec<f32> = batch::last_rows(tokens)
            .into_iter()
            .flat_map(|r| x[r as usize * d..(r as usize + 1) * d].iter().copied())
            .collect();
        let lp = self.engine.log_softmax_rows(&last);
        Ok(lp.chunks(c.vocab_size).map(<[f32]>::to_vec).collect())
    }

    fn len(&self, sequence: usize) -> usize {
        self.nodes.get(sequence).map_or(0, |&n| self.tree.len(n))
    }
}
