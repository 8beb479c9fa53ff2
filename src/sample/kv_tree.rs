//! A KV tree: cached keys and values of every computed token, and the sequences (nodes) that read
//! them. A node is the list of cache-row ranges of its context, so a fork shares its prefix rows
//! for free and a batch of sequences with common prefixes stores each prefix once.
//!
//! The structure is the same on every backend; only where the rows live differs, so the tree is
//! generic over its store (`cpu::decode::HostKv`: host vectors; `cuda::decode::DeviceKv`: device
//! buffers). A forward over new tokens goes: `append` (or `add_plan`) records which rows the new
//! tokens will take and returns the attention groups; the backend computes the tokens, writing
//! their K/V at rows `rows()..rows() + n` of its store; `commit(n)` counts them as cached.

use std::ops::Range;

use super::{batch, SampleRequest};
use crate::plan::Plan;

/// Index of a sequence in a `KvTree`.
pub type NodeId = usize;

/// The attention context of one group of new tokens (one node's, in one forward).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Store rows of the node's context, in order; the new tokens' rows are the last `n_new`.
    pub ranges: Vec<Range<usize>>,
    /// New tokens of the group.
    pub n_new: usize,
    /// Row of the group's first new token among the forward's new tokens (its queries).
    pub first_query: usize,
}

/// A sequence in the tree: the store rows of its context, in order (ancestors' rows first).
#[derive(Debug, Clone, Default)]
pub(crate) struct Node {
    pub(crate) ranges: Vec<Range<usize>>,
    pub(crate) len: usize,
}

impl Node {
    /// Appends store row `row` to the context.
    pub(crate) fn push(&mut self, row: usize) {
        match self.ranges.last_mut() {
            Some(r) if r.end == row => r.end += 1,
            _ => self.ranges.push(row..row + 1),
        }
        self.len += 1;
    }

    /// The first `len` rows of this context.
    pub(crate) fn prefix(&self, len: usize) -> Node {
        let mut out = Node::default();
        for r in &self.ranges {
            if out.len >= len {
                break;
            }
            let take = (r.end - r.start).min(len - out.len);
            out.ranges.push(r.start..r.start + take);
            out.len += take;
        }
        out
    }
}

/// What `KvTree::restore` puts back: the row count, the node count, and the nodes a call was
/// about to grow, as they were: a failed forward is undone (CUDA's), and a group of `propose`'s
/// branches frees its rows for the next.
pub(crate) struct Checkpoint {
    rows: usize,
    n_nodes: usize,
    nodes: Vec<(NodeId, Node)>,
}

/// The nodes, the number of cached rows, and the backend's store of those rows.
pub struct KvTree<S> {
    pub(crate) store: S,
    nodes: Vec<Node>,
    rows: usize,
}

impl<S> KvTree<S> {
    /// An empty tree over `store`.
    pub(crate) fn with_store(store: S) -> Self {
        KvTree {
            store,
            nodes: Vec::new(),
            rows: 0,
        }
    }

    /// A new empty sequence.
    pub fn root(&mut self) -> NodeId {
        self.nodes.push(Node::default());
        self.nodes.len() - 1
    }

    /// A new sequence that continues the first `len` tokens of `node` (sharing their rows).
    pub fn fork(&mut self, node: NodeId, len: usize) -> NodeId {
        let n = self.nodes[node].prefix(len);
        self.nodes.push(n);
        self.nodes.len() - 1
    }

    /// Tokens in the context of `node`.
    pub fn len(&self, node: NodeId) -> usize {
        self.nodes[node].len
    }

    /// Cached rows in the whole tree.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Records `tokens[g]` at the end of sequence `nodes[g]` for every group g, as the rows after
    /// the cached ones; returns the new tokens' ids and positions, in order, and the groups. A
    /// group may continue a node that another group of the same call adds tokens to only if it
    /// was forked from it beforehand (prefill of a prefix tree does exactly that).
    pub(crate) fn append(
        &mut self,
        nodes: &[NodeId],
        tokens: &[Vec<u32>],
    ) -> (Vec<u32>, Vec<u32>, Vec<Group>) {
        let n: usize = tokens.iter().map(Vec::len).sum();
        let mut ids = Vec::with_capacity(n);
        let mut positions = Vec::with_capacity(n);
        let mut groups = Vec::with_capacity(nodes.len());
        for (&node, toks) in nodes.iter().zip(tokens) {
            let first = ids.len();
            for &t in toks {
                positions.push(self.nodes[node].len as u32);
                self.nodes[node].push(self.rows + ids.len());
                ids.push(t);
            }
            groups.push(Group {
                ranges: self.nodes[node].ranges.clone(),
                n_new: toks.len(),
                first_query: first,
            });
        }
        (ids, positions, groups)
    }

    /// Records every segment of `plan` as a node holding its ancestors' rows and its own (the
    /// plan's tokens taking the rows after the cached ones); returns the node of each segment
    /// and the groups.
    pub(crate) fn add_plan(&mut self, plan: &Plan) -> (Vec<NodeId>, Vec<Group>) {
        let base = self.rows;
        let seg_range = |s: usize| {
            let seg = plan.segments[s];
            base + seg.start as usize..base + (seg.start + seg.len) as usize
        };
        let mut groups = Vec::with_capacity(plan.segments.len());
        let mut ids = Vec::with_capacity(plan.segments.len());
        for (s, seg) in plan.segments.iter().enumerate() {
            let mut node = Node::default();
            for &a in plan.ancestors_of(s) {
                for row in seg_range(a as usize) {
                    node.push(row);
                }
            }
            for row in seg_range(s) {
                node.push(row);
            }
            groups.push(Group {
                ranges: node.ranges.clone(),
                n_new: seg.len as usize,
                first_query: seg.start as usize,
            });
            self.nodes.push(node);
            ids.push(self.nodes.len() - 1);
        }
        (ids, groups)
    }

    /// One node per sample of `requests` (in `batch::sample_requests` order), each a fork of its
    /// request's prefix: prefix r ends at row `last_rows[r]` of `plan`, the prefix tree whose
    /// segments are the nodes `seg_nodes` (`add_plan`).
    pub(crate) fn fork_samples(
        &mut self,
        requests: &[SampleRequest],
        plan: &Plan,
        seg_nodes: &[NodeId],
        last_rows: &[u32],
    ) -> Vec<NodeId> {
        batch::sample_requests(requests)
            .map(|r| {
                let row = last_rows[r] as usize;
                let seg = plan.token_segment[row] as usize;
                self.fork(seg_nodes[seg], plan.positions[row] as usize + 1)
            })
            .collect()
    }

    /// One node per sample of `requests` (in `batch::sample_requests` order), each a fork of the
    /// whole of `prefix_nodes[r]`, its request's prefix.
    pub(crate) fn fork_each(
        &mut self,
        requests: &[SampleRequest],
        prefix_nodes: &[NodeId],
    ) -> Vec<NodeId> {
        batch::sample_requests(requests)
            .map(|r| {
                let node = prefix_nodes[r];
                self.fork(node, self.len(node))
            })
            .collect()
    }

    /// Counts the `n` rows after the cached ones as computed.
    pub(crate) fn commit(&mut self, n: usize) {
        self.rows += n;
    }

    /// The tree as it is, for `restore` to return to: after a group of work whose rows are no
    /// longer needed, or if the forward that grows `nodes` fails (a node left extended over rows
    /// that were never computed, and that the next call would compute for other tokens, would
    /// read another sequence's keys).
    pub(crate) fn checkpoint(&self, nodes: &[NodeId]) -> Checkpoint {
        Checkpoint {
            rows: self.rows,
            n_nodes: self.nodes.len(),
            nodes: nodes.iter().map(|&n| (n, self.nodes[n].clone())).collect(),
        }
    }

    /// Runs `work` on the tree, then frees the rows and nodes it added (`checkpoint` /
    /// `restore`): a group of work whose cache is not needed afterwards.
    pub(crate) fn scoped<R, E>(
        &mut self,
        work: impl FnOnce(&mut Self) -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        let checkpoint = self.checkpoint(&[]);
        let out = work(self);
        self.restore(checkpoint);
        out
    }

    /// Undoes everything since `checkpoint`: the nodes it saved get their contexts back, nodes
    /// added since are dropped and rows counted since are free again.
    pub(crate) fn restore(&mut self, checkpoint: Checkpoint) {
        self.rows = checkpoint.rows;
        self.nodes.truncate(checkpoint.n_nodes);
        for (id, node) in checkpoint.nodes {
            self.nodes[id] = node;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restore_undoes_an_append_and_its_commit() {
        let mut tree = KvTree::with_store(());
        let a = tree.root();
        let (ids, _, _) = tree.append(&[a], &[vec![1, 2, 3]]);
        tree.commit(ids.len());
        let b = tree.fork(a, 2);
        let before = (
            tree.rows(),
            tree.len(a),
            tree.len(b),
            tree.nodes[b].ranges.clone(),
        );

        let checkpoint = tree.checkpoint(&[a, b]);
        let (ids, _, _) = tree.append(&[a, b], &[vec![4], vec![5, 6]]);
        tree.commit(ids.len());
        tree.fork(b, 1);
        tree.restore(checkpoint);

        let after = (
            tree.rows(),
            tree.len(a),
            tree.len(b),
            tree.nodes[b].ranges.clone(),
        );
        assert_eq!(before, after);
        assert_eq!(tree.nodes.len(), 2);
        // The next append takes the rows the undone one had taken.
        let (_, positions, groups) = tree.append(&[b], &[vec![7]]);
        assert_eq!(positions, [2]);
        assert_eq!(groups[0].ranges, [0..2, 3..4]);
    }

    /// A fork that ends where one of its node's ranges ends holds that node's ranges up to
    /// there and no empty range after them (a group's context is exactly its rows).
    #[test]
    fn a_fork_at_a_range_end_holds_no_empty_range() {
        let mut tree = KvTree::with_store(());
        let a = tree.root();
        let b = tree.root();
        for node in [a, b, a] {
            let (ids, _, _) = tree.append(&[node], &[vec![1, 2]]);
            tree.commit(ids.len());
        }
        assert_eq!(tree.nodes[a].ranges, [0..2, 4..6]);
        let c = tree.fork(a, 2);
        assert_eq!(tree.nodes[c].ranges, tree.nodes[a].ranges[..1]);
        let (_, _, groups) = tree.append(&[c], &[vec![3]]);
        assert_eq!(groups[0].ranges, [0..2, 6..7]);
    }
}
