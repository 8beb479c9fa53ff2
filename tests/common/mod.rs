//! Shared helpers for the integration tests: fixture paths and the golden cases.
#![allow(dead_code)]

use std::path::PathBuf;

use serde::Deserialize;

/// Property-test case count: `default`, or TOOLSIFT_FUZZ_CASES for a longer fuzz run.
pub fn fuzz_cases(default: u32) -> u32 {
    std::env::var("TOOLSIFT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// The tiny GPT-J fixture: `f32` safetensors, `f16` safetensors, or `bin` (float16
/// pytorch_model.bin with the attn.bias / attn.masked_bias buffers of old GPT-J checkpoints).
pub fn tiny(variant: &str) -> PathBuf {
    match variant {
        "f16" => fixture_dir("tiny-gptj").join("f16"),
        "bin" => fixture_dir("tiny-gptj-bin"),
        _ => fixture_dir("tiny-gptj"),
    }
}

#[derive(Deserialize)]
pub struct Cases {
    pub forward: Vec<ForwardCase>,
    pub weighted_loss: Vec<WeightedLossCase>,
    pub filter: Vec<FilterCase>,
}

#[derive(Deserialize)]
pub struct ForwardCase {
    pub name: String,
    pub ids: Vec<u32>,
    pub log_softmax: Vec<Vec<f64>>,
}

#[derive(Deserialize)]
pub struct WeightedLossCase {
    pub name: String,
    pub prefix_ids: Vec<u32>,
    pub text_ids: Vec<u32>,
    pub position: usize,
    pub weights: Vec<f64>,
    pub expected_loss: f64,
}

#[derive(Deserialize, Clone)]
pub struct FilterCase {
    pub text: String,
    pub call: String,
    pub call_result: String,
    pub text_ids: Vec<u32>,
    pub position: usize,
    pub call_ids: Vec<u32>,
    pub call_result_ids: Vec<u32>,
    pub weights: Vec<f64>,
    #[serde(rename = "L_none")]
    pub l_none: f64,
    #[serde(rename = "L_call")]
    pub l_call: f64,
    #[serde(rename = "L_call_result")]
    pub l_call_result: f64,
    #[serde(rename = "L_minus")]
    pub l_minus: f64,
    #[serde(rename = "L_plus")]
    pub l_plus: f64,
    pub delta: f64,
}

pub fn cases() -> Cases {
    let path = fixture_dir("tiny-gptj").join("cases.json");
    let text = std::fs::read_to_string(&path).expect("fixture cases.json");
    serde_json::from_str(&text).expect("cases.json parses")
}

/// Asserts |got - want| <= tol and says which value and by how much otherwise.
pub fn assert_close(what: &str, got: f64, want: f64, tol: f64) {
    let err = (got - want).abs();
    assert!(
        err <= tol,
        "{what}: got {got}, want {want}, |diff| {err:.3e} > tolerance {tol:.1e} ({:.1}x the budget)",
        err / tol
    );
}

/// An input that yields `data`, then fails (a disk or network error partway through a file).
pub struct FailsAfter {
    data: Vec<u8>,
    pos: usize,
}

impl FailsAfter {
    pub fn new(data: impl Into<Vec<u8>>) -> Self {
        FailsAfter {
            data: data.into(),
            pos: 0,
        }
    }
}

impl std::io::Read for FailsAfter {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.data.len() {
            return Err(std::io::Error::other("the device went away"));
        }
        let n = buf.len().min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
