//! The driver's sampling steps on the CPU engine (`Sampler`), on the KV tree of `decode`.

use super::decode::KvTree;
use super::CpuScorer;
use crate::error::{Error, Result};
use crate::plan::Plan;
use crate::sample::{
    draw, sample_rng, DecodeSession, Decoder, Sample, SampleOptions, SampleRequest, Sampler,
};

/// Rows of full log-softmax computed at once (bounds the [rows, vocab] buffer).
const HEAD_CHUNK_ROWS: usize = 64;

impl CpuScorer {
    fn check_ids(&self, what: &str, ids: &[u32]) -> Result<()> {
        let c = &self.config;
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(Error::input(format!(
                "{what}: token id {bad} is outside the vocabulary (vocab_size {})",
                c.vocab_size
            )));
        }
        Ok(())
    }
}

impl Sampler for CpuScorer {
    fn token_log_probs(&self, ids: &[u32], tokens: &[u32]) -> Result<Vec<Vec<f32>>> {
        self.check_ids("sequence", ids)?;
        self.check_ids("queried tokens", tokens)?;
        if ids.len() > self.config.n_positions {
            return Err(Error::input(format!(
                "sequence of {} tokens is longer than n_positions ({})",
                ids.len(),
                self.config.n_positions
            )));
        }
        let d = self.config.n_embd;
        let vocab = self.config.vocab_size;
        let mut tree = KvTree::new(self.config.n_layer);
        let root = tree.root();
        let x = self.extend(&mut tree, &[root], &[ids.to_vec()]);
        let mut out = Vec::with_capacity(ids.len());
        for chunk in x.chunks(HEAD_CHUNK_ROWS * d) {
            let lp = self.log_softmax_rows(chunk);
            out.extend(
                lp.chunks(vocab)
                    .map(|row| tokens.iter().map(|&t| row[t as usize]).collect()),
            );
        }
        Ok(out)
    }

    fn sample(
        &self,
        requests: &[SampleRequest],
        options: &SampleOptions,
    ) -> Result<Vec<Vec<Sample>>> {
        let c = &self.config;
        for (r, req) in requests.iter().enumerate() {
            self.check_ids(&format!("request {r}"), &req.prefix)?;
            if req.prefix.is_empty() {
                return Err(Error::input(format!("request {r}: empty prefix")));
            }
            if req.prefix.len() + options.max_new_tokens > c.n_positions {
                return Err(Error::input(format!(
                    "request {r}: prefix of {} tokens + {} new tokens exceeds n_positions ({})",
                    req.prefix.len(),
                    options.max_new_tokens,
                    c.n_positions
                )));
            }
        }
        let (d, vocab) = (c.n_embd, c.vocab_size);
        // Prefill every prefix once, as a prefix tree.
        let prefixes: Vec<Vec<u32>> = requests.iter().map(|r| r.prefix.clone()).collect();
        let (plan, last_rows) = Plan::from_sequences(&prefixes);
        let mut tree = KvTree::new(c.n_layer);
        let (seg_nodes, x) = self.prefill(&mut tree, &plan);
        let last_rows: Vec<usize> = last_rows
            .into_iter()
            .map(|r| r.expect("non-empty prefix") as usize)
            .collect();
        let first_rows: Vec<f32> = last_rows
            .iter()
            .flat_map(|&row| x[row * d..(row + 1) * d].iter().copied())
            .collect();
        let first = self.log_softmax_rows(&first_rows); // [requests, vocab]

        // One live sample: (request, sample, node, rng, tokens, done).
        struct Live {
            r: usize,
            node: usize,
            rng: crate::util::rng::Rng,
            tokens: Vec<u32>,
            stopped: bool,
        }
        let mut live = Vec::new();
        for (r, req) in requests.iter().enumerate() {
            let row = last_rows[r] as u32;
            let seg = plan.token_segment[row as usize] as usize;
            let ctx_len = (plan.positions[row as usize] + 1) as usize;
            for s in 0..req.n_samples {
                let node = tree.fork(seg_nodes[seg], ctx_len);
                let mut rng = sample_rng(options.seed, r, s);
                let tok = draw(&first[r * vocab..(r + 1) * vocab], options, &mut rng);
                live.push(Live {
                    r,
                    node,
                    rng,
                    stopped: options.stop_tokens.contains(&tok),
                    tokens: vec![tok],
                });
            }
        }
        let active = |l: &Live| !l.stopped && l.tokens.len() < options.max_new_tokens;
        loop {
            let step: Vec<usize> = (0..live.len()).filter(|&i| active(&live[i])).collect();
            if step.is_empty() {
                break;
            }
            let nodes: Vec<usize> = step.iter().map(|&i| live[i].node).collect();
            let toks: Vec<Vec<u32>> = step
                .iter()
                .map(|&i| vec![*live[i].tokens.last().expect("one token")])
                .collect();
            let x = self.extend(&mut tree, &nodes, &toks);
            for (chunk_i, chunk) in x.chunks(HEAD_CHUNK_ROWS * d).enumerate() {
                let lp = self.log_softmax_rows(chunk);
                for (j, row) in lp.chunks(vocab).enumerate() {
                    let l = &mut live[step[chunk_i * HEAD_CHUNK_ROWS + j]];
                    let tok = draw(row, options, &mut l.rng);
                    l.stopped = options.stop_tokens.contains(&tok);
                    l.tokens.push(tok);
                }
            }
        }
        let mut out: Vec<Vec<Sample>> = requests.iter().map(|_| Vec::new()).collect();
        for l in live {
            out[l.r].push(Sample {
                tokens: l.tokens,
                stopped: l.stopped,
            });
        }
        Ok(out)
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
        if sequences.len() != tokens.len() {
            return Err(Error::input("extend: one token list per sequence"));
        }
        let mut nodes = Vec::with_capacity(sequences.len());
        for (&s, t) in sequences.iter().zip(tokens) {
            let &node = self
                .nodes
                .get(s)
                .ok_or_else(|| Error::input(format!("extend: no sequence {s}")))?;
            if t.is_empty() {
                return Err(Error::input(format!("extend: no tokens for sequence {s}")));
            }
            self.engine.check_ids(&format!("sequence {s}"), t)?;
            if self.tree.len(node) + t.len() > c.n_positions {
                return Err(Error::input(format!(
                    "sequence {s} would grow past n_positions ({})",
                    c.n_positions
                )));
            }
            nodes.push(node);
        }
        let d = c.n_embd;
        let x = self.engine.extend(&mut self.tree, &nodes, tokens);
        // Only the last new token of each sequence needs the head.
        let mut last = Vec::with_capacity(sequences.len() * d);
        let mut row = 0;
        for t in tokens {
            row += t.len();
            last.extend_from_slice(&x[(row - 1) * d..row * d]);
        }
        let lp = self.engine.log_softmax_rows(&last);
        Ok(lp.chunks(c.vocab_size).map(<[f32]>::to_vec).collect())
    }

    fn len(&self, sequence: usize) -> usize {
        self.nodes.get(sequence).map_or(0, |&n| self.tree.len(n))
    }
}
