//! A small deterministic generator (SplitMix64) for random weights, workloads and sampling.
//! Hand-rolled so that a seed means the same numbers forever, whatever version of a crate is
//! resolved.

/// SplitMix64's increment (2^64 / the golden ratio).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function: a bijection of u64 that scatters every input bit.
fn finalise(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64: 64 bits of state, one addition and one output mix per draw. The same seed gives
/// the same numbers on every platform and build.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// The generator of `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Self {
        Rng {
            state: seed ^ GOLDEN,
        }
    }

    /// The generator of one stream among many: `seed` with each of `keys` (a request index, a
    /// sample index, ...) hashed in, in order. The state so far is scrambled by SplitMix64's
    /// finaliser before each key is XORed in, and the result again, so distinct (seed, keys) give
    /// unrelated streams. Mixing by XOR with multiples of the generator's own increment would not:
    /// key 1's stream would be key 0's one draw later, and swapped keys would collide.
    pub fn keyed(seed: u64, keys: &[u64]) -> Self {
        let seed = keys
            .iter()
            .fold(seed, |h, &k| finalise(finalise(h.wrapping_add(GOLDEN)) ^ k));
        Rng::new(seed)
    }

    /// The next 64 uniformly distributed bits; every other draw is made from these.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        finalise(self.state)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [lo, hi] (inclusive).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        assert!(lo <= hi);
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// No keyed stream meets another within its first draws: not the old XOR mixing's one-draw
    /// shift (key r + 1 = key r one draw later), nor a swap of two keys or of seed and key.
    #[test]
    fn keyed_streams_do_not_overlap() {
        let draws = 64;
        let mut seen: HashMap<u64, (u64, u64, u64)> = HashMap::new();
        for seed in [0u64, 1, 7] {
            for a in 0..12u64 {
                for b in 0..12u64 {
                    let mut rng = Rng::keyed(seed, &[a, b]);
                    for _ in 0..draws {
                        let v = rng.next_u64();
                        if let Some(other) = seen.insert(v, (seed, a, b)) {
                            panic!("streams {other:?} and {:?} share a draw", (seed, a, b));
                        }
                    }
                }
            }
        }
        assert_ne!(
            Rng::keyed(3, &[1]).next_u64(),
            Rng::keyed(3, &[1, 0]).next_u64()
        );
    }
}
