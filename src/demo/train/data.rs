//! Batches: padded id tensors with their predicting rows and targets, and the epoch order
//! (length buckets, seeded shuffles).

use anyhow::{ensure, Result};
use candle_core::{Device, Tensor};

use crate::util::rng::Rng;

/// One padded batch: ids [B, T] (u32, right-padded), the flat rows that predict and their targets.
pub struct Batch {
    /// `[B, T]` u32: each sequence without its last token, right-padded with the pad id to T,
    /// the longest of those inputs.
    pub ids: Tensor,
    /// Flat indices into `[B * T]` of the positions that have a next token: `[M]` u32.
    pub rows: Tensor,
    /// The next token of each of those positions: `[M]` u32.
    pub targets: Tensor,
    /// M: the predicted positions (targets) of the batch, padding excluded.
    pub tokens: usize,
    /// T: input tokens per row, padding included.
    pub padded_len: usize,
}

impl Batch {
    /// Sequences `seqs[i]` for i in `idx`, inputs `s[..n-1]`, targets `s[1..]`, padded with `pad`.
    pub fn new(seqs: &[Vec<u32>], idx: &[usize], pad: u32) -> Result<Self> {
        ensure!(
            idx.iter().all(|&i| !seqs[i].is_empty()),
            "a batch cannot hold an empty sequence"
        );
        let t = idx.iter().map(|&i| seqs[i].len() - 1).max().unwrap_or(0);
        ensure!(t > 0, "a batch needs sequences of at least 2 tokens");
        let mut ids = Vec::with_capacity(idx.len() * t);
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        for (r, &i) in idx.iter().enumerate() {
            let s = &seqs[i];
            let n = s.len() - 1;
            ids.extend_from_slice(&s[..n]);
            ids.extend(std::iter::repeat_n(pad, t - n));
            rows.extend((0..n).map(|p| (r * t + p) as u32));
            targets.extend_from_slice(&s[1..]);
        }
        let m = rows.len();
        Ok(Batch {
            ids: Tensor::from_vec(ids, (idx.len(), t), &Device::Cpu)?,
            rows: Tensor::from_vec(rows, m, &Device::Cpu)?,
            targets: Tensor::from_vec(targets, m, &Device::Cpu)?,
            tokens: m,
            padded_len: t,
        })
    }
}

fn shuffle<T>(v: &mut [T], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        v.swap(i, rng.range(0, i));
    }
}

/// One epoch's batches: shuffle, cut into buckets of `batch * bucket_batches`, sort each bucket by
/// length (stable) and cut it into batches, shuffle the batches.
pub fn epoch_batches(
    lens: &[usize],
    batch: usize,
    bucket_batches: usize,
    rng: &mut Rng,
) -> Vec<Vec<usize>> {
    let mut idx: Vec<usize> = (0..lens.len()).collect();
    shuffle(&mut idx, rng);
    let mut batches = Vec::new();
    for bucket in idx.chunks(batch * bucket_batches.max(1)) {
        let mut bucket = bucket.to_vec();
        bucket.sort_by_key(|&i| lens[i]);
        batches.extend(bucket.chunks(batch).map(<[usize]>::to_vec));
    }
    shuffle(&mut batches, rng);
    batches
}

/// Pieces tokenized separately (no special tokens) and concatenated.
pub fn encode_pieces(tok: &crate::model::Tokenizer, pieces: &[String]) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for p in pieces {
        ids.extend(tok.encode_ids(p)?);
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::{epoch_batches, shuffle, Batch};
    use crate::util::rng::Rng;

    /// Inputs are each sequence less its last token, right-padded with the pad id; the rows that
    /// predict are each row's own positions in the flat [B * T], their targets the next tokens.
    #[test]
    fn a_batch_pads_with_the_pad_id_and_targets_the_next_tokens() {
        let seqs = vec![vec![1, 2, 3, 4], vec![5, 6]];
        let b = Batch::new(&seqs, &[1, 0], 9).unwrap();
        assert_eq!(b.ids.to_vec2::<u32>().unwrap(), [[5, 9, 9], [1, 2, 3]]);
        assert_eq!(b.rows.to_vec1::<u32>().unwrap(), [0, 3, 4, 5]);
        assert_eq!(b.targets.to_vec1::<u32>().unwrap(), [6, 2, 3, 4]);
        assert_eq!((b.tokens, b.padded_len), (4, 3));
    }

    /// The shuffle is Fisher-Yates (a swap partner from 0 to i inclusive): every permutation
    /// occurs. With 0..i (Sattolo's) only the cycles would, never one leaving an element in place.
    #[test]
    fn the_shuffle_reaches_every_permutation() {
        let mut rng = Rng::new(5);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..2000 {
            let mut v = [0, 1, 2, 3];
            shuffle(&mut v, &mut rng);
            seen.insert(v);
        }
        assert_eq!(seen.len(), 24);
    }

    /// An epoch holds every sequence once; within a bucket (`batch * bucket_batches`) batches are
    /// cut from the length-sorted order, so two batches of one bucket do not overlap in length;
    /// the batches are shuffled, not left shortest first.
    #[test]
    fn an_epoch_sorts_each_bucket_by_length_and_shuffles_the_batches() {
        let lens: Vec<usize> = (0..20).map(|i| 100 + (i * 7) % 20).collect();
        let batches = epoch_batches(&lens, 4, 5, &mut Rng::new(2));
        assert_eq!(batches.len(), 5);
        let mut all: Vec<usize> = batches.concat();
        all.sort();
        assert_eq!(all, (0..20).collect::<Vec<_>>());
        let ranges: Vec<(usize, usize)> = batches
            .iter()
            .map(|b| {
                let l: Vec<usize> = b.iter().map(|&i| lens[i]).collect();
                (*l.iter().min().unwrap(), *l.iter().max().unwrap())
            })
            .collect();
        for (i, a) in ranges.iter().enumerate() {
            for b in &ranges[i + 1..] {
                assert!(a.1 < b.0 || b.1 < a.0, "overlapping batches: {ranges:?}");
            }
        }
        assert!(ranges.windows(2).any(|w| w[0].0 > w[1].0), "{ranges:?}");
        // Buckets of one batch: batches are then the shuffled order, unsorted.
        let small = epoch_batches(&lens, 4, 1, &mut Rng::new(2));
        assert!(small.iter().all(|b| b.len() == 4));
    }

    #[test]
    fn a_batch_refuses_an_empty_sequence_and_one_with_nothing_to_predict() {
        let seqs = vec![vec![], vec![1, 2, 3], vec![4]];
        let err = |idx: &[usize]| Batch::new(&seqs, idx, 0).err().unwrap().to_string();
        assert!(err(&[0, 1]).contains("empty sequence"));
        assert!(err(&[2]).contains("at least 2 tokens"));
        let b = Batch::new(&seqs, &[1, 2], 0).unwrap();
        assert_eq!((b.tokens, b.padded_len), (2, 2));
    }

    /// bucket_batches 0 counts as 1 (buckets of one batch), not as buckets of no sequence.
    #[test]
    fn bucket_batches_0_counts_as_1() {
        let lens: Vec<usize> = (0..10).map(|i| 3 + (i * 5) % 7).collect();
        let zero = epoch_batches(&lens, 3, 0, &mut Rng::new(4));
        assert_eq!(zero, epoch_batches(&lens, 3, 1, &mut Rng::new(4)));
        assert_eq!(zero.len(), 4);
    }
}
