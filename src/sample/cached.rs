//! The KV-cached `Sampler` (`token_log_probs`, `sample`, `propose`), written once. An engine
//! brings only what differs, its KV store and its LM head (`KvEngine`, implemented by the CPU and
//! CUDA engines); the algorithm (prefix trees, forks, memory groups, first draws, the decoding
//! loop of `batch::decode`) is here, so the backends cannot differ in their draws, their budget
//! planning or their errors.

use super::batch::{self, FirstDraws, TokenBytes};
use super::kv_tree::{KvTree, NodeId};
use super::{Branch, Choose, Proposal, Sample, SampleOptions, SampleRequest};
use crate::error::Result;
use crate::model::GptjConfig;
use crate::plan::Plan;

/// What differs between the KV-cached engines. `Hidden` is the final residual stream of the
/// tokens one forward computed (one row per token, in order) wherever the engine keeps it; the
/// heads take it by value, so that it can be freed before the [rows, vocab] buffers exist.
pub(crate) trait KvEngine {
    /// Where the tree's K/V rows live (`KvTree<Self::Store>`).
    type Store;
    type Hidden;

    /// The model's config (vocabulary and positions for the input checks).
    fn config(&self) -> &GptjConfig;

    /// What a token costs (activations, K/V), and the bytes a group of samples may use.
    fn sample_budget(&self) -> (TokenBytes, usize);

    /// An empty tree with room for `rows` rows.
    fn new_tree(&self, rows: usize) -> Result<KvTree<Self::Store>>;

    /// Room for `rows` more rows in `tree` now, instead of growth by growth during the work.
    fn reserve(&self, tree: &mut KvTree<Self::Store>, rows: usize) -> Result<()>;

    /// Prefills `plan` as a prefix tree (`KvTree::add_plan`): the node of each segment, and the
    /// stream of the plan's tokens.
    fn prefill_tree(
        &self,
        tree: &mut KvTree<Self::Store>,
        plan: &Plan,
    ) -> Result<(Vec<NodeId>, Self::Hidden)>;

    /// Runs `tokens[g]` at the end of node `nodes[g]` for every g (`KvTree::append`); the stream
    /// of the new tokens.
    fn extend_tree(
        &self,
        tree: &mut KvTree<Self::Store>,
        nodes: &[NodeId],
        tokens: &[Vec<u32>],
    ) -> Result<Self::Hidden>;

    /// Per row of `x`, the log-probabilities of `tokens`.
    fn head_token_log_probs(&self, x: Self::Hidden, tokens: &[u32]) -> Result<Vec<Vec<f32>>>;

    /// The full log-softmax after rows `rows` of `x`, handed to `each(k, row)` (k: the index in
    /// `rows`, in order) one chunk of rows at a time.
    fn head_log_softmax_each(
        &self,
        x: Self::Hidden,
        rows: &[u32],
        each: impl FnMut(usize, &[f32]),
    ) -> Result<()>;
}

/// `Sampler::token_log_probs`.
pub(crate) fn token_log_probs<E: KvEngine>(
    engine: &E,
    ids: &[u32],
    tokens: &[u32],
) -> Result<Vec<Vec<f32>>> {
    let c = engine.config();
    batch::check_sequence(ids, tokens, c.vocab_size, c.n_positions)?;
    if ids.is_empty() {
        return Ok(Vec::new()); // no positions: no tree either
    }
    let mut tree = engine.new_tree(ids.len())?;
    Ok(forward_sequence(engine, &mut tree, ids, tokens)?.1)
}

/// `Sampler::sample`: groups of requests one after another, each in a tree of its own that is
/// dropped before the next, so that a group's cache and activations fit the budget.
pub(crate) fn sample<E: KvEngine>(
    engine: &E,
    requests: &[SampleRequest],
    options: &SampleOptions,
) -> Result<Vec<Vec<Sample>>> {
    let c = engine.config();
    batch::check_requests("request", requests, options, c.vocab_size, c.n_positions)?;
    if let Some(empty) = batch::nothing_to_draw(requests, options) {
        return Ok(empty);
    }
    let (bytes, budget) = engine.sample_budget();
    let whole = |r: &SampleRequest| r.prefix.len();
    let mut out = Vec::with_capacity(requests.len());
    for group in batch::sample_groups(requests, options, budget, bytes, whole) {
        out.extend(sample_group(
            engine,
            &requests[group.clone()],
            group.start,
            options,
        )?);
    }
    Ok(out)
}

/// `Sampler::propose`: `ids` computed once, its tree kept for the branches `choose` picks, which
/// fork it instead of prefilling their prefixes again.
pub(crate) fn propose<E: KvEngine>(
    engine: &E,
    ids: &[u32],
    tokens: &[u32],
    choose: &mut Choose<'_>,
    options: &SampleOptions,
) -> Result<Proposal> {
    let c = engine.config();
    batch::check_sequence(ids, tokens, c.vocab_size, c.n_positions)?;
    let mut tree = engine.new_tree(ids.len())?;
    let (root, log_probs) = forward_sequence(engine, &mut tree, ids, tokens)?;
    let (branches, requests) = batch::choose_branches(
        ids,
        &log_probs,
        choose,
        options,
        c.vocab_size,
        c.n_positions,
    )?;
    if let Some(samples) = batch::nothing_to_draw(&requests, options) {
        return Ok(Proposal {
            log_probs,
            branches,
            samples,
        });
    }
    // Branches run in groups within the budget less the sequence's cached K/V, each group's
    // rows freed before the next (`scoped`): the same samples in any grouping. One growth to
    // the largest group's size (its branches' tokens and every sample's) serves them all.
    let (bytes, budget) = engine.sample_budget();
    let budget = budget.saturating_sub(ids.len() * bytes.kv);
    let groups = batch::sample_groups(&requests, options, budget, bytes, |_| 1);
    let most = groups
        .iter()
        .map(|g| {
            g.len()
                .saturating_add(decode_rows(&requests[g.clone()], options))
        })
        .max()
        .unwrap_or(0);
    engine.reserve(&mut tree, most)?;
    let mut samples = Vec::with_capacity(requests.len());
    for group in groups {
        samples.extend(tree.scoped(|tree| {
            propose_group(
                engine,
                tree,
                root,
                &branches[group.clone()],
                &requests[group.clone()],
                group.start,
                options,
            )
        })?);
    }
    Ok(Proposal {
        log_probs,
        branches,
        samples,
    })
}

/// `ids` computed at a new root of `tree`: the root, and per position the log-probabilities of
/// `tokens`.
fn forward_sequence<E: KvEngine>(
    engine: &E,
    tree: &mut KvTree<E::Store>,
    ids: &[u32],
    tokens: &[u32],
) -> Result<(NodeId, Vec<Vec<f32>>)> {
    let root = tree.root();
    let log_probs = if ids.is_empty() {
        Vec::new() // `propose` may still branch at 0
    } else {
        let x = engine.extend_tree(tree, &[root], &[ids.to_vec()])?;
        engine.head_token_log_probs(x, tokens)?
    };
    Ok((root, log_probs))
}

/// One group of `sample`'s requests (`first_request`: the first one's batch index) in a tree of
/// its own, sized up front for its prefixes and every sample's tokens: every prefix prefilled
/// once as a prefix tree, each request's first tokens drawn from its row, then the decoding loop.
fn sample_group<E: KvEngine>(
    engine: &E,
    requests: &[SampleRequest],
    first_request: usize,
    options: &SampleOptions,
) -> Result<Vec<Vec<Sample>>> {
    let prefixes: Vec<Vec<u32>> = requests.iter().map(|r| r.prefix.clone()).collect();
    let (plan, last_rows) = Plan::from_sequences(&prefixes);
    let mut tree = engine.new_tree(
        plan.n_tokens()
            .saturating_add(decode_rows(requests, options)),
    )?;
    let (seg_nodes, x) = engine.prefill_tree(&mut tree, &plan)?;
    // `check_requests` refused empty prefixes: every request has a last row.
    let last_rows: Vec<u32> = last_rows
        .into_iter()
        .map(|r| r.expect("non-empty prefix"))
        .collect();
    let mut first = FirstDraws::new(options, first_request);
    engine.head_log_softmax_each(x, &last_rows, |r, row| first.push(r, &requests[r], row))?;
    let nodes = tree.fork_samples(requests, &plan, &seg_nodes, &last_rows);
    decode_samples(engine, &mut tree, requests, first, nodes)
}

/// One group of `propose`'s branches (`first_request`: the first one's index), with `requests`
/// their sample requests: each branch forks the sequence cached at `root` and computes only its
/// own token, then its samples are drawn and decoded.
fn propose_group<E: KvEngine>(
    engine: &E,
    tree: &mut KvTree<E::Store>,
    root: NodeId,
    branches: &[Branch],
    requests: &[SampleRequest],
    first_request: usize,
    options: &SampleOptions,
) -> Result<Vec<Vec<Sample>>> {
    let prefix_nodes: Vec<NodeId> = branches.iter().map(|b| tree.fork(root, b.at)).collect();
    let opens: Vec<Vec<u32>> = branches.iter().map(|b| vec![b.token]).collect();
    let x = engine.extend_tree(tree, &prefix_nodes, &opens)?;
    let mut first = FirstDraws::new(options, first_request);
    engine.head_log_softmax_each(x, &every_row(requests.len()), |r, row| {
        first.push(r, &requests[r], row)
    })?;
    let nodes = tree.fork_each(requests, &prefix_nodes);
    decode_samples(engine, tree, requests, first, nodes)
}

/// The decoding loop of `requests` from their first draws, sample i growing node `nodes[i]` of
/// `tree` by one token per step.
fn decode_samples<E: KvEngine>(
    engine: &E,
    tree: &mut KvTree<E::Store>,
    requests: &[SampleRequest],
    first: FirstDraws<'_>,
    nodes: Vec<NodeId>,
) -> Result<Vec<Vec<Sample>>> {
    batch::decode(requests, first, nodes, |nodes, tokens, each| {
        let x = engine.extend_tree(tree, nodes, tokens)?;
        engine.head_log_softmax_each(x, &every_row(nodes.len()), each)
    })
}

/// Cache rows the decoding of `requests` can add: at most `max_new_tokens` per sample (checked
/// requests keep this within `batch::MAX_SAMPLED_ROWS`; the saturation only guards the sum).
fn decode_rows(requests: &[SampleRequest], options: &SampleOptions) -> usize {
    requests
        .iter()
        .fold(0usize, |n, r| n.saturating_add(r.n_samples))
        .saturating_mul(options.max_new_tokens)
}

/// Rows 0..n: each new token's row goes to the head.
fn every_row(n: usize) -> Vec<u32> {
    (0..n as u32).collect()
}
