//! GPT-J's rotary position table, shared by every engine (CPU, CUDA, the demo trainer): the
//! angles are model math, not a backend's.

/// cos/sin of pos * 10000^(-2i / rotary_dim), [max_pos, rotary_dim / 2] each; built in f64.
pub struct RotaryTable {
    /// Pairs rotated per head, `rotary_dim / 2`: the row length of `cos` and `sin`.
    pub half: usize,
    /// cos of the angles, row-major [max_pos, half]: position `p`, pair `i` at `p * half + i`.
    pub cos: Vec<f32>,
    /// sin of the same angles, laid out as `cos`.
    pub sin: Vec<f32>,
}

impl RotaryTable {
    /// The table for positions `0..max_pos` (the engines pass `n_positions`) and an even
    /// `rotary_dim` (`GptjConfig::rotary_dim()`); 0 gives an empty table, no rotation.
    pub fn new(max_pos: usize, rotary_dim: usize) -> Self {
        let half = rotary_dim / 2;
        let mut cos = Vec::with_capacity(max_pos * half);
        let mut sin = Vec::with_capacity(max_pos * half);
        for p in 0..max_pos {
            for i in 0..half {
                let inv_freq = 1.0 / 10000f64.powf((2 * i) as f64 / rotary_dim as f64);
                let (s, c) = (p as f64 * inv_freq).sin_cos();
                cos.push(c as f32);
                sin.push(s as f32);
            }
        }
        RotaryTable { half, cos, sin }
    }
}
