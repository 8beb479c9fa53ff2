//! Shared helpers for the integration tests: fixture paths and the golden cases.
#![allow(dead_code)]

pub mod watched;

use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use toolsift::model::{DType, GptjConfig, GptjWeights};
use toolsift::reference::ReferenceModel;
use toolsift::score::variant_sequence;
use toolsift::util::rng::Rng;
use toolsift::{Model, ScoreOptions, Scores, TokenCandidate, Variant};

/// Runs `cmd` with `input` on its standard input, its stdout and stderr captured. A run refused
/// at the start never reads its input and may close the pipe first: not an error.
pub fn output_with_stdin(cmd: &mut std::process::Command, input: &[u8]) -> std::process::Output {
    use std::io::Write as _;
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(input);
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// A model of `config` with random weights (`GptjWeights::random`) stored as `storage`, and no
/// tokenizer.
pub fn random_model(config: &GptjConfig, seed: u64, storage: DType) -> Model {
    Model::from_parts(
        config.clone(),
        GptjWeights::random(config, seed, storage),
        None,
    )
    .unwrap()
}

/// Property-test case count: `default`, or TOOLSIFT_FUZZ_CASES for a longer fuzz run.
pub fn fuzz_cases(default: u32) -> u32 {
    std::env::var("TOOLSIFT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub fn fixture_dir(name: &str) -> PathBuf {
    // The build's source folder; a test binary run from another copy of the repository (the GPU
    // machine's, carried in gpu-bundle/) finds them from its current folder, the copy's root.
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let base = if built.is_dir() {
        built
    } else {
        PathBuf::from("tests/fixtures")
    };
    base.join(name)
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

/// Random candidates for the engines' property tests: `n_texts` texts of 2..=`max_text` tokens,
/// each with several positions (including the first and last scorable ones),
/// several calls per position, a duplicate, an empty result, an empty call, a call that is a
/// prefix of its call with result, weights of their own with zeros inside, after, and past the
/// end of the text (each with at least one positive weight on a text token).
pub fn random_candidates(
    rng: &mut Rng,
    v: usize,
    n_texts: usize,
    max_text: usize,
) -> Vec<TokenCandidate> {
    let mut out = Vec::new();
    for _ in 0..n_texts {
        let n = rng.range(2, max_text);
        let text: Arc<[u32]> = (0..n).map(|_| rng.range(0, v - 1) as u32).collect();
        let head = [rng.range(0, v - 1) as u32, rng.range(0, v - 1) as u32];
        let mut positions = vec![1, n - 1];
        positions.push(rng.range(1, n - 1));
        for &position in &positions {
            for _ in 0..rng.range(1, 3) {
                let input: Vec<u32> = (0..rng.range(0, 4))
                    .map(|_| rng.range(0, v - 1) as u32)
                    .collect();
                let result: Vec<u32> = (0..rng.range(0, 3))
                    .map(|_| rng.range(0, v - 1) as u32)
                    .collect();
                let mut call_ids = [&head[..], &input, &[1]].concat();
                let call_result_ids = [&head[..], &input, &[2], &result, &[1]].concat();
                match rng.range(0, 7) {
                    0 => call_ids.clear(),
                    1 => call_ids = call_result_ids[..rng.range(1, call_result_ids.len())].to_vec(),
                    _ => {}
                }
                let weights = if rng.range(0, 3) == 0 {
                    let mut w: Vec<f64> = (0..rng.range(1, 9))
                        .map(|_| {
                            if rng.range(0, 2) == 0 {
                                0.0
                            } else {
                                rng.uniform()
                            }
                        })
                        .collect();
                    if w.iter().all(|&x| x == 0.0) {
                        let k = rng.range(0, w.len() - 1);
                        w[k] = rng.uniform();
                    }
                    // At least one positive weight on a text token (`validate` refuses a
                    // candidate with nothing to measure).
                    if w[..w.len().min(n - position)].iter().all(|&x| x == 0.0) {
                        w[0] = 0.5 + 0.5 * rng.uniform();
                    }
                    Some(w)
                } else {
                    None
                };
                out.push(TokenCandidate {
                    text_ids: text.clone(),
                    position,
                    call_ids,
                    call_result_ids,
                    weights,
                });
            }
        }
        let dup = out.last().unwrap().clone();
        out.push(dup);
    }
    out
}

/// The longest sequence any variant of `cands` scores (call or call with result, then the text
/// up to its window's end): the smallest n_positions that fits them all.
pub fn longest_sequence(cands: &[TokenCandidate], options: &ScoreOptions) -> usize {
    cands
        .iter()
        .map(|c| c.call_ids.len().max(c.call_result_ids.len()) + c.text_end(options))
        .max()
        .unwrap_or(1)
}

/// The three losses of a score beside the oracle's, as (variant, name, got, want).
pub fn variant_losses(got: &Scores, want: &Scores) -> [(Variant, &'static str, f64, f64); 3] {
    [
        (Variant::None, "l_none", got.l_none, want.l_none),
        (Variant::Call, "l_call", got.l_call, want.l_call),
        (
            Variant::CallResult,
            "l_call_result",
            got.l_call_result,
            want.l_call_result,
        ),
    ]
}

/// The rounding budget of one loss `loss` of variant `variant` of `c`, for arithmetic whose
/// rounding has unit roundoff `u`: sum_t |w_t| g_t 16u + 4u g_max |loss|, with g_t the oracle's
/// LayerNorm gain at the row that predicts target t (tests/cuda_sampling.rs's `tol` says why).
pub fn rounding_budget(
    reference: &ReferenceModel,
    c: &TokenCandidate,
    variant: Variant,
    options: &ScoreOptions,
    u: f64,
    loss: f64,
) -> f64 {
    let seq = variant_sequence(c, variant, options);
    let gain = reference.layer_norm_gain(&seq.ids);
    let weighted: f64 = seq.targets.iter().map(|&(r, _, w)| w.abs() * gain[r]).sum();
    let most = seq
        .targets
        .iter()
        .map(|&(r, _, _)| gain[r])
        .fold(1.0, f64::max);
    16.0 * u * weighted + 4.0 * u * most * loss.abs()
}
