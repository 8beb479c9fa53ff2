//! The loss weights w_t of L_i(z).

use crate::error::{Error, Result};

/// Weights of the future tokens x_i, x_{i+1}, ... in L_i. Cut short (never renormalised) when the
/// text ends first, as in the paper.
#[derive(Debug, Clone, PartialEq)]
pub struct LossWeights(Vec<f64>);

impl Default for LossWeights {
    /// The paper's w_t = max(0, 1 - 0.2 t) / 3: [1, .8, .6, .4, .2] / 3. The division by 3 (their
    /// sum) is the paper's normalisation; dropping it makes tau_f three times more permissive.
    fn default() -> Self {
        // The paper's values as written: (1 - 0.2 t) in floating point is one ulp off at t = 3.
        LossWeights([1.0, 0.8, 0.6, 0.4, 0.2].map(|w| w / 3.0).to_vec())
    }
}

impl LossWeights {
    /// Explicit weights; each must be finite and non-negative, and at least one positive.
    pub fn new(weights: Vec<f64>) -> Result<Self> {
        check(&weights).map_err(Error::input)?;
        Ok(LossWeights(weights))
    }

    /// w_0, w_1, ...
    pub fn as_slice(&self) -> &[f64] {
        &self.0
    }
}

/// Why a weight vector is unusable, if it is.
pub fn check(weights: &[f64]) -> std::result::Result<(), String> {
    if weights.is_empty() {
        return Err("weights must not be empty".into());
    }
    if let Some((t, w)) = weights
        .iter()
        .enumerate()
        .find(|(_, w)| !w.is_finite() || **w < 0.0)
    {
        return Err(format!(
            "weights[{t}] = {w} must be finite and non-negative"
        ));
    }
    if !weights.iter().sum::<f64>().is_finite() {
        // Every weighted loss would overflow: each line would fail as "not finite".
        return Err("weights sum past the largest f64; scale them down".into());
    }
    if !weights.iter().any(|&w| w > 0.0) {
        // Every loss would be 0 and every delta 0: "kept" at tau_f <= 0 with nothing measured.
        return Err("weights must have at least one positive weight".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_weights_are_the_papers() {
        let w = LossWeights::default();
        let expected = [1.0, 0.8, 0.6, 0.4, 0.2].map(|v| v / 3.0);
        for (a, b) in w.as_slice().iter().zip(expected) {
            assert!((a - b).abs() < 1e-15);
        }
        assert!((w.as_slice().iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn bad_weights_are_refused() {
        assert!(LossWeights::new(vec![]).is_err());
        assert!(LossWeights::new(vec![1.0, f64::NAN]).is_err());
        assert!(LossWeights::new(vec![-0.1]).is_err());
        let zero = LossWeights::new(vec![0.0, 0.0]).unwrap_err().to_string();
        assert!(zero.contains("at least one positive weight"), "{zero}");
        assert!(LossWeights::new(vec![0.0, 0.5]).is_ok());
        let huge = LossWeights::new(vec![1e308, 1e308])
            .unwrap_err()
            .to_string();
        assert!(huge.contains("past the largest f64"), "{huge}");
    }

    /// Each refusal says its own reason: an empty vector as empty, a weight that is not finite
    /// (NaN, either infinity) or negative by its index, not as a sum past the largest f64.
    #[test]
    fn each_bad_weight_is_refused_with_its_own_reason_and_index() {
        let refusal = |w: Vec<f64>| LossWeights::new(w).unwrap_err().to_string();
        assert_eq!(refusal(vec![]), "weights must not be empty");
        for (bad, shown) in [
            (f64::NAN, "NaN"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (-0.5, "-0.5"),
        ] {
            assert_eq!(
                refusal(vec![0.4, 0.0, bad, 1.0]),
                format!("weights[2] = {shown} must be finite and non-negative")
            );
        }
    }
}
