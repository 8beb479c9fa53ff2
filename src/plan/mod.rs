//! The scoring plan: a batch of candidates -> a prefix tree of unique token segments -> a flat
//! token schedule that every backend (cpu, cuda) executes.
//!
//! Every variant of every candidate is one causal sequence (`score::variant_sequence`, already cut
//! after its last weighted token), fed up to the token before that one: the last weighted token
//! is only a target, no row predicts from it. Inserting all of them into one token trie computes
//! each distinct prefix once, whatever produced the sharing: the no-call variant of a text serves
//! all of that text's candidates; in prefix placement e(c, eps) and e(c, r) share their head
//! ("[Tool(input) ->") and calls of one tool share "[Tool("; in inline placement x_1..x_{i-1} is
//! shared by the three variants and by every later position of the text; identical candidates
//! collapse entirely.
//!
//! The trie is then compressed into segments (maximal chains without branching). A token attends to
//! every token of its segment's ancestors and causally to its own segment: tree (cascade)
//! attention.
//!
//! Weighted targets name the row whose hidden state predicts them; the LM head runs only at the
//! unique such rows, and each target adds `weight * log p(token | row)` into its (candidate,
//! variant).

use rustc_hash::FxHashMap;

use crate::score::{variant_sequence, ScoreOptions, TokenCandidate, Variant};

/// A maximal chain of trie nodes: tokens `start..start + len` of the flat schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// First token of the segment in the flat schedule.
    pub start: u32,
    /// Tokens in the segment, at least 1.
    pub len: u32,
    /// Position id of the first token (the number of ancestor tokens).
    pub depth: u32,
    /// The segment this one continues, if any.
    pub parent: Option<u32>,
}

/// One weighted term of a loss: `weight * log p(token | hidden state of row)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    /// Index into `Plan::head_rows` (not a token index: rows are deduplicated).
    pub head_row: u32,
    /// The token id whose log-probability the term reads (x_{i+t}).
    pub token: u32,
    /// The term's weight w_t (`LossWeights`), > 0 (a zero weight makes no target); the loss is
    /// minus the weighted sum.
    pub weight: f64,
    /// `candidate * 3 + variant`: the loss this term adds into.
    pub slot: u32,
}

/// A flat token schedule with its tree structure and weighted targets.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Token ids, `[n_tokens]`; segments are contiguous, parents before children (DFS order).
    pub tokens: Vec<u32>,
    /// Position id (depth in its sequence) of every token, `[n_tokens]`.
    pub positions: Vec<u32>,
    /// Segment of every token, `[n_tokens]`.
    pub token_segment: Vec<u32>,
    /// The trie's maximal chains, in the order their tokens appear in `tokens`: a parent's
    /// index is below its children's.
    pub segments: Vec<Segment>,
    /// CSR: segment s attends to `ancestors[ancestor_offsets[s]..ancestor_offsets[s + 1]]`, root
    /// first, then causally to itself.
    pub ancestors: Vec<u32>,
    /// (usize: in inline placement, candidates at many positions of one long text give each
    /// of its one-token segments a list as long as its depth, past 2^32 entries in all for a
    /// text of ~53k tokens.)
    pub ancestor_offsets: Vec<usize>,
    /// Token indices whose hidden state feeds the LM head, ascending and unique.
    pub head_rows: Vec<u32>,
    /// Every weighted term of every candidate's three losses, in the order the candidates and
    /// their variants were added (`reduce` takes their log-probabilities in this order).
    pub targets: Vec<Target>,
    /// Candidates planned: `reduce` returns one `[L_none, L_call, L_call_result]` per candidate,
    /// in the order they were added; 0 for `from_sequences`' plans.
    pub n_candidates: usize,
    /// Tokens of all variant sequences before sharing (what a no-sharing engine would compute).
    pub naive_tokens: usize,
}

impl Plan {
    /// Builds the plan of `candidates` (already validated) under `options`.
    ///
    /// # Panics
    /// On a candidate `score::validate` refuses (position 0, inline past the text, ...).
    pub fn build(candidates: &[TokenCandidate], options: &ScoreOptions) -> Plan {
        let mut builder = PlanBuilder::new(options);
        for cand in candidates {
            builder.push(cand);
        }
        builder.finish()
    }

    /// The prefix tree of raw sequences (no targets): returns the plan and, per sequence, the flat
    /// index of its last token (`None` for an empty sequence). The driver's sampling prefill.
    pub fn from_sequences(sequences: &[Vec<u32>]) -> (Plan, Vec<Option<u32>>) {
        let mut trie = Trie::default();
        let mut nodes = Vec::new();
        let last: Vec<Option<u32>> = sequences
            .iter()
            .map(|s| {
                nodes.clear();
                trie.insert(s, &mut nodes);
                nodes.last().copied()
            })
            .collect();
        let plan = trie.flatten();
        let rows = last
            .into_iter()
            .map(|node| node.map(|n| trie.flat_index[n as usize]))
            .collect();
        (plan, rows)
    }

    /// Unique tokens of the plan: the length of `tokens`, the rows every layer computes.
    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    /// Ancestor segments of segment `s`, root first.
    pub fn ancestors_of(&self, s: usize) -> &[u32] {
        &self.ancestors[self.ancestor_offsets[s]..self.ancestor_offsets[s + 1]]
    }

    /// Sums per-target contributions into [L_none, L_call, L_call_result] per candidate:
    /// `log_probs[k]` is `log p(targets[k].token | row)`.
    ///
    /// # Panics
    /// When `log_probs` is not one value per target.
    pub fn reduce(&self, log_probs: &[f64]) -> Vec<[f64; 3]> {
        assert_eq!(log_probs.len(), self.targets.len());
        let mut losses = vec![[0.0; 3]; self.n_candidates];
        for (t, lp) in self.targets.iter().zip(log_probs) {
            losses[t.slot as usize / 3][t.slot as usize % 3] -= t.weight * lp;
        }
        losses
    }

    fn attach_targets(&mut self, trie: &Trie, raw: Vec<(u32, u32, f64, u32)>) {
        // node -> flat token index, then deduplicate rows.
        let mut rows: Vec<u32> = raw
            .iter()
            .map(|&(n, ..)| trie.flat_index[n as usize])
            .collect();
        rows.sort_unstable();
        rows.dedup();
        // flat token index -> head row (dense: rows are token indices of this plan)
        let mut row_index = vec![u32::MAX; self.tokens.len()];
        for (k, &r) in rows.iter().enumerate() {
            row_index[r as usize] = k as u32;
        }
        self.targets = raw
            .into_iter()
            .map(|(node, token, weight, slot)| Target {
                head_row: row_index[trie.flat_index[node as usize] as usize],
                token,
                weight,
                slot,
            })
            .collect();
        self.head_rows = rows;
    }
}

/// No node: the end of a sibling list, or a leaf's children.
const NONE: u32 = u32::MAX;

/// A token trie; node 0 is the (token-less) root. Children are singly linked lists in insertion
/// order (first, last, next sibling): no allocation per node.
#[derive(Default)]
struct Trie {
    /// (parent node, token) -> child node.
    children: FxHashMap<(u32, u32), u32>,
    /// Per node (index 0 is the root): its token and parent, its first and last child, its next
    /// sibling.
    token: Vec<u32>,
    parent: Vec<u32>,
    first_child: Vec<u32>,
    last_child: Vec<u32>,
    next_sibling: Vec<u32>,
    /// Per node: its index in the flat schedule (filled by `flatten`).
    flat_index: Vec<u32>,
    /// A bound on the entries of the flattened plan's ancestor lists (`Plan::ancestors`): the
    /// sum of every segment's depth in tokens, which its ancestor segments, of one token at
    /// least each, cannot outnumber. Kept as nodes are inserted; `truncate` leaves it to the
    /// caller to restore.
    ancestors_bound: usize,
}

impl Trie {
    /// Inserts `ids`; appends the node of every position to `nodes`.
    fn insert(&mut self, ids: &[u32], nodes: &mut Vec<u32>) {
        if self.token.is_empty() {
            self.push_node(NONE, NONE);
        }
        let mut node = 0u32;
        // Once a node is new, so is the rest of the sequence: a new node has no children to find.
        let mut new = false;
        nodes.extend(ids.iter().enumerate().map(|(depth, &id)| {
            let found = if new {
                None
            } else {
                self.children.get(&(node, id)).copied()
            };
            node = match found {
                Some(child) => child,
                None => {
                    new = true;
                    // A second child makes its parent a branch: the first child starts a
                    // segment, and so does every child from then on (the root's children start
                    // segments without ancestors; a first child continues its parent's).
                    let parent = node as usize;
                    if parent != 0 && self.first_child[parent] != NONE {
                        let starts = if self.first_child[parent] == self.last_child[parent] {
                            2
                        } else {
                            1
                        };
                        self.ancestors_bound += starts * depth;
                    }
                    let child = self.push_node(id, node);
                    match self.last_child[node as usize] {
                        NONE => self.first_child[node as usize] = child,
                        last => self.next_sibling[last as usize] = child,
                    }
                    self.last_child[node as usize] = child;
                    self.children.insert((node, id), child);
                    child
                }
            };
            node
        }));
    }

    fn push_node(&mut self, token: u32, parent: u32) -> u32 {
        let node = self.token.len() as u32;
        self.token.push(token);
        self.parent.push(parent);
        self.first_child.push(NONE);
        self.last_child.push(NONE);
        self.next_sibling.push(NONE);
        node
    }

    /// Nodes, the root included (0 before the first insert).
    fn n_nodes(&self) -> usize {
        self.token.len()
    }

    /// Unique tokens: every node but the root.
    fn n_tokens(&self) -> usize {
        self.token.len().saturating_sub(1)
    }

    /// Removes every node from `n_nodes` on: undoes the inserts made since the trie had that many.
    /// New nodes are appended, and appended to their parent's children, so in reverse order each
    /// one is the last child of its parent. The root (node 0) has no parent to detach from.
    fn truncate(&mut self, n_nodes: usize) {
        for node in (n_nodes.max(1)..self.token.len()).rev() {
            let parent = self.parent[node] as usize;
            self.children.remove(&(parent as u32, self.token[node]));
            debug_assert_eq!(self.last_child[parent], node as u32);
            if self.first_child[parent] == node as u32 {
                self.first_child[parent] = NONE;
                self.last_child[parent] = NONE;
            } else {
                // The one walk of a sibling list: once per refused candidate's new branch.
                let mut prev = self.first_child[parent];
                while self.next_sibling[prev as usize] != node as u32 {
                    prev = self.next_sibling[prev as usize];
                }
                self.next_sibling[prev as usize] = NONE;
                self.last_child[parent] = prev;
            }
        }
        for v in [
            &mut self.token,
            &mut self.parent,
            &mut self.first_child,
            &mut self.last_child,
            &mut self.next_sibling,
        ] {
            v.truncate(n_nodes);
        }
    }

    /// Pushes the children of `node` onto `stack` so that they pop in insertion order.
    fn push_children(
        &self,
        node: u32,
        segment: Option<u32>,
        depth: u32,
        stack: &mut Vec<(u32, Option<u32>, u32)>,
    ) {
        let at = stack.len();
        let mut child = self.first_child[node as usize];
        while child != NONE {
            stack.push((child, segment, depth));
            child = self.next_sibling[child as usize];
        }
        stack[at..].reverse();
    }

    /// Compresses chains into segments and lays tokens out in DFS order.
    fn flatten(&mut self) -> Plan {
        let mut plan = Plan {
            ancestor_offsets: vec![0],
            ..Default::default()
        };
        self.flat_index = vec![u32::MAX; self.token.len()];
        if self.token.is_empty() {
            return plan;
        }
        // Stack of (first node of a segment, parent segment, depth).
        let mut stack: Vec<(u32, Option<u32>, u32)> = Vec::new();
        self.push_children(0, None, 0, &mut stack);
        while let Some((first, parent, depth)) = stack.pop() {
            let s = plan.segments.len() as u32;
            let start = plan.tokens.len() as u32;
            let mut node = first;
            loop {
                self.flat_index[node as usize] = plan.tokens.len() as u32;
                plan.positions
                    .push(depth + plan.tokens.len() as u32 - start);
                plan.tokens.push(self.token[node as usize]);
                plan.token_segment.push(s);
                let child = self.first_child[node as usize];
                if child == NONE || self.next_sibling[child as usize] != NONE {
                    break; // a leaf or a branch ends the segment
                }
                node = child;
            }
            let len = plan.tokens.len() as u32 - start;
            plan.segments.push(Segment {
                start,
                len,
                depth,
                parent,
            });
            if let Some(p) = parent {
                let range =
                    plan.ancestor_offsets[p as usize]..plan.ancestor_offsets[p as usize + 1];
                plan.ancestors.extend_from_within(range);
                plan.ancestors.push(p);
            }
            plan.ancestor_offsets.push(plan.ancestors.len());
            self.push_children(node, Some(s), depth + len, &mut stack);
        }
        plan
    }
}

/// Host bytes per unique token while a chunk is planned (trie, then the plan itself), less the
/// ancestor lists (`PLANNER_BYTES_PER_ANCESTOR`) and the targets (`PLANNER_BYTES_PER_TARGET`).
pub const PLANNER_BYTES_PER_TOKEN: usize = 256;

/// Host bytes per target (weighted term) while a chunk is planned and scored: the builder's raw
/// target (24, in a Vec that may hold twice its length as it grows), the plan's `Target` (24)
/// and an engine's gather and log-prob (24). Counted apart from the tokens since targets grow
/// with candidates times their window, not with unique tokens: the same call at every position
/// of one text, with a long `--weights` window, is millions of targets over a few thousand
/// tokens.
pub const PLANNER_BYTES_PER_TARGET: usize = 96;

/// Host bytes per entry of a plan's ancestor lists (`Plan::ancestors`): a u32, in a Vec that
/// may hold up to twice its length as it grows. Counted apart from the tokens since the lists
/// grow with depth times branches: inline candidates at every position of one text of n tokens
/// make ~2n^2 entries for ~15n tokens.
pub const PLANNER_BYTES_PER_ANCESTOR: usize = 8;

/// Builds a plan one candidate at a time, so that a caller can stop before a token limit.
pub struct PlanBuilder<'o> {
    options: &'o ScoreOptions,
    trie: Trie,
    /// (node predicting the target, token, weight, slot)
    raw_targets: Vec<(u32, u32, f64, u32)>,
    naive_tokens: usize,
    n_candidates: usize,
    /// The node of every position of the sequence being inserted (reused).
    nodes: Vec<u32>,
}

impl<'o> PlanBuilder<'o> {
    /// An empty plan whose candidates will be scored under `options` (placement and loss
    /// weights decide each variant's sequence and targets).
    pub fn new(options: &'o ScoreOptions) -> Self {
        PlanBuilder {
            options,
            trie: Trie::default(),
            raw_targets: Vec::new(),
            naive_tokens: 0,
            n_candidates: 0,
            nodes: Vec::new(),
        }
    }

    /// Candidates added so far.
    pub fn n_candidates(&self) -> usize {
        self.n_candidates
    }

    /// Unique tokens of the plan so far.
    pub fn n_tokens(&self) -> usize {
        self.trie.n_tokens()
    }

    /// A bound on the entries of the plan's ancestor lists so far (`Plan::ancestors`): each
    /// segment's depth in tokens. Exact where every ancestor segment is one token long (the
    /// adversarial case); loose where they are long (a text that a chunk's inline candidates
    /// share counts its tokens, not its one segment), which can only make chunks smaller.
    pub fn ancestors_bound(&self) -> usize {
        self.trie.ancestors_bound
    }

    /// Host bytes the planner may need for the plan so far, at its peak: the tokens at
    /// `PLANNER_BYTES_PER_TOKEN`, the ancestor lists at `PLANNER_BYTES_PER_ANCESTOR` an entry,
    /// the targets at `PLANNER_BYTES_PER_TARGET`.
    pub fn planner_bytes(&self) -> usize {
        self.n_tokens()
            .saturating_mul(PLANNER_BYTES_PER_TOKEN)
            .saturating_add(
                self.ancestors_bound()
                    .saturating_mul(PLANNER_BYTES_PER_ANCESTOR),
            )
            .saturating_add(
                self.raw_targets
                    .len()
                    .saturating_mul(PLANNER_BYTES_PER_TARGET),
            )
    }

    /// Adds `cand` (already validated) as the next candidate.
    ///
    /// # Panics
    /// On a candidate `score::validate` refuses (position 0, inline past the text, ...).
    pub fn push(&mut self, cand: &TokenCandidate) {
        let c = self.n_candidates;
        for variant in Variant::ALL {
            let seq = variant_sequence(cand, variant, self.options);
            if seq.targets.is_empty() {
                continue; // no weighted token (`validate` refuses such a candidate): nothing to run
            }
            self.naive_tokens += seq.ids.len();
            // The last token is only ever a target: no row predicts from it, so it is not fed.
            let fed = &seq.ids[..seq.ids.len() - 1];
            debug_assert!(seq.targets.iter().all(|&(row, _, _)| row < fed.len()));
            self.nodes.clear();
            self.trie.insert(fed, &mut self.nodes);
            let slot = (c * 3 + variant as usize) as u32;
            for &(row, token, weight) in &seq.targets {
                self.raw_targets
                    .push((self.nodes[row], token, weight, slot));
            }
        }
        self.n_candidates += 1;
    }

    /// Adds `cand` unless that would take the plan past `max_tokens` unique tokens; returns
    /// whether it was added. The first candidate is always added, however large, and so is one
    /// that adds no token (a duplicate of what the plan holds) to a plan already past the limit
    /// (an oversized first candidate): it would otherwise start a chunk of its own and be
    /// computed again.
    pub fn push_within(&mut self, cand: &TokenCandidate, max_tokens: usize) -> bool {
        self.push_if(cand, |b| b.n_tokens() <= max_tokens, usize::MAX)
    }

    /// `push_within` for a limit in bytes: adds `cand` unless the plan's activations,
    /// `activation_bytes_per_token` per unique token, and the planner's own memory
    /// (`planner_bytes`) would then pass `budget` bytes.
    pub fn push_within_bytes(
        &mut self,
        cand: &TokenCandidate,
        budget: usize,
        activation_bytes_per_token: usize,
    ) -> bool {
        self.push_if(
            cand,
            |b| {
                let activations = b.n_tokens().saturating_mul(activation_bytes_per_token);
                activations.saturating_add(b.planner_bytes()) <= budget
            },
            budget,
        )
    }

    /// Adds `cand` if the plan with it `fits`, or if it is the first candidate, or adds no
    /// token to a plan that did not fit already (`push_within`) while the targets' bytes
    /// (`PLANNER_BYTES_PER_TARGET` each) stay within `max_target_bytes`; else undoes it. A
    /// candidate that adds no token can still take a plan past a byte limit by its targets:
    /// the same call at every position of an oversized text, prefixed, adds no token after the
    /// first, and each brings its window's targets.
    fn push_if(
        &mut self,
        cand: &TokenCandidate,
        fits: impl Fn(&Self) -> bool,
        max_target_bytes: usize,
    ) -> bool {
        let fitted = fits(self);
        let (nodes, targets, naive, tokens, bound) = (
            self.trie.n_nodes(),
            self.raw_targets.len(),
            self.naive_tokens,
            self.n_tokens(),
            self.trie.ancestors_bound,
        );
        self.push(cand);
        let duplicate_of_oversized = self.n_tokens() == tokens
            && !fitted
            && self
                .raw_targets
                .len()
                .saturating_mul(PLANNER_BYTES_PER_TARGET)
                <= max_target_bytes;
        if fits(self) || self.n_candidates == 1 || duplicate_of_oversized {
            return true;
        }
        self.trie.truncate(nodes);
        self.trie.ancestors_bound = bound;
        self.raw_targets.truncate(targets);
        self.naive_tokens = naive;
        self.n_candidates -= 1;
        false
    }

    /// The plan of every candidate added: the trie flattened into segments, targets bound to
    /// deduplicated head rows.
    pub fn finish(mut self) -> Plan {
        let mut plan = self.trie.flatten();
        plan.n_candidates = self.n_candidates;
        plan.naive_tokens = self.naive_tokens;
        plan.attach_targets(&self.trie, self.raw_targets);
        plan
    }
}

/// Plans `candidates` in consecutive chunks of at most `max_tokens` unique tokens each (a single
/// candidate larger than that still gets a chunk, with the candidates after it that add no
/// token), lazily: one chunk's plan and trie exist
/// at a time, so the planner's memory follows the budget, not the batch. Each chunk takes
/// candidates in order until the next one would not fit, so sharing is lost only at chunk
/// borders, and a batch that fits is one chunk, planned exactly as `Plan::build` plans it.
pub fn chunked<'a>(
    candidates: &'a [TokenCandidate],
    options: &'a ScoreOptions,
    max_tokens: usize,
) -> Chunks<'a> {
    Chunks {
        candidates,
        options,
        limit: Limit::Tokens(max_tokens),
        next: 0,
        done: false,
    }
}

/// `chunked` for a memory budget: each chunk's activations (`activation_bytes_per_token` per
/// unique token) and planner memory (`PlanBuilder::planner_bytes`, whose ancestor lists can
/// outgrow the tokens) stay within `budget` bytes, but for a first candidate over it.
pub fn chunked_in_bytes<'a>(
    candidates: &'a [TokenCandidate],
    options: &'a ScoreOptions,
    budget: usize,
    activation_bytes_per_token: usize,
) -> Chunks<'a> {
    Chunks {
        candidates,
        options,
        limit: Limit::Bytes {
            budget,
            activation_bytes_per_token,
        },
        next: 0,
        done: false,
    }
}

/// `chunked` for a device's memory: each chunk's activations (`bytes_per_token` per unique
/// token) and the attention's context map (`bytes_per_ancestor` per entry of its ancestor
/// lists, `PlanBuilder::ancestors_bound`, which a deep tree's can make outgrow the tokens) stay
/// within `budget` bytes, but for a first candidate over it. The planner's own memory is the
/// host's, not counted here.
pub fn chunked_on_device<'a>(
    candidates: &'a [TokenCandidate],
    options: &'a ScoreOptions,
    budget: usize,
    bytes_per_token: usize,
    bytes_per_ancestor: usize,
) -> Chunks<'a> {
    Chunks {
        candidates,
        options,
        limit: Limit::Device {
            budget,
            bytes_per_token,
            bytes_per_ancestor,
        },
        next: 0,
        done: false,
    }
}

/// What a chunk of `Chunks` must stay within.
#[derive(Debug, Clone, Copy)]
enum Limit {
    Tokens(usize),
    Bytes {
        budget: usize,
        activation_bytes_per_token: usize,
    },
    Device {
        budget: usize,
        bytes_per_token: usize,
        bytes_per_ancestor: usize,
    },
}

/// The chunks of `chunked`: (candidate range, its plan), in order. An empty batch is one empty
/// chunk.
pub struct Chunks<'a> {
    candidates: &'a [TokenCandidate],
    options: &'a ScoreOptions,
    limit: Limit,
    next: usize,
    done: bool,
}

impl Iterator for Chunks<'_> {
    type Item = (std::ops::Range<usize>, Plan);

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let start = self.next;
        let mut builder = PlanBuilder::new(self.options);
        while let Some(cand) = self.candidates.get(self.next) {
            let added = match self.limit {
                Limit::Tokens(max_tokens) => builder.push_within(cand, max_tokens),
                Limit::Bytes {
                    budget,
                    activation_bytes_per_token,
                } => builder.push_within_bytes(cand, budget, activation_bytes_per_token),
                Limit::Device {
                    budget,
                    bytes_per_token,
                    bytes_per_ancestor,
                } => builder.push_if(
                    cand,
                    |b| {
                        let tokens = b.n_tokens().saturating_mul(bytes_per_token);
                        let map = b.ancestors_bound().saturating_mul(bytes_per_ancestor);
                        tokens.saturating_add(map) <= budget
                    },
                    // The targets are the host's, not the device's budget.
                    usize::MAX,
                ),
            };
            if !added {
                break;
            }
            self.next += 1;
        }
        self.done = self.next == self.candidates.len();
        Some((start..self.next, builder.finish()))
    }
}

#[cfg(test)]
mod tests;
