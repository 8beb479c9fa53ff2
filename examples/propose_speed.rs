//! The driver's sampling steps on the CPU engine, two ways, in one run: `token_log_probs` then
//! `sample` (the branches' shared prefix prefilled a second time) against one `propose` call
//! (the branches fork the cache of the position forward). The driver's shape: a sequence of LEN
//! tokens (P(x) ++ x), 5 branches in its second half (positions in x), 5 samples each, up to 16
//! new tokens (temperature 1, no stop token: every sample runs to the cap). Prints the median of
//! REPS runs of each and their ratio.
//!
//!     cargo run --release --example propose_speed [LAYERS EMBD HEADS VOCAB LEN REPS]
//!
//! Default model: the bench size (8 layers, d_model 512, 8 heads, vocab 50400), random weights.

use std::time::Instant;

use toolsift::cpu::CpuScorer;
use toolsift::model::{DType, GptjConfig, GptjWeights};
use toolsift::sample::{branch_requests, Branch, SampleOptions, Sampler};
use toolsift::util::rng::Rng;

fn main() -> toolsift::Result<()> {
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .map_or(default, |s| s.parse().expect("a number"))
    };
    let (layers, embd, heads, vocab, len, reps) = (
        arg(1, 8),
        arg(2, 512),
        arg(3, 8),
        arg(4, 50400),
        arg(5, 512),
        arg(6, 3),
    );
    let mut config = GptjConfig::small(layers, embd, heads, 32.min(embd / heads), vocab);
    config.n_positions = config.n_positions.max(len + 32);
    let engine =
        CpuScorer::from_weights(&config, GptjWeights::random(&config, 7, DType::F32)).unwrap();
    let mut rng = Rng::new(3);
    let ids: Vec<u32> = (0..len).map(|_| rng.range(0, vocab - 1) as u32).collect();
    let open = [1u32, 2];
    let branches: Vec<Branch> = (0..5)
        .map(|k| Branch {
            at: len / 2 + (k + 1) * len / 12,
            token: open[k % 2],
            n_samples: 5,
        })
        .collect();
    let options = SampleOptions {
        max_new_tokens: 16,
        ..Default::default()
    };
    println!(
        "model: {layers} layers, d_model {embd}, {heads} heads, vocab {vocab}; sequence {len} tokens, \
         branches at {:?} x 5 samples x 16 tokens; {} threads",
        branches.iter().map(|b| b.at).collect::<Vec<_>>(),
        rayon::current_num_threads()
    );
    let median = |f: &mut dyn FnMut() -> toolsift::Result<()>| -> toolsift::Result<f64> {
        let mut t = Vec::with_capacity(reps);
        for _ in 0..reps.max(1) {
            let s = Instant::now();
            f()?;
            t.push(s.elapsed().as_secs_f64());
        }
        t.sort_by(f64::total_cmp);
        Ok(t[t.len() / 2])
    };
    let mut two = None;
    let two_calls = median(&mut || {
        let log_probs = engine.token_log_probs(&ids, &open)?;
        let requests = branch_requests(&ids, &branches)?;
        two = Some((log_probs, engine.sample(&requests, &options)?));
        Ok(())
    })?;
    let mut one = None;
    let propose = median(&mut || {
        one = Some(engine.propose(&ids, &open, &mut |_| branches.clone(), &options)?);
        Ok(())
    })?;
    let (two, one) = (two.expect("ran"), one.expect("ran"));
    let same = two.0 == one.log_probs && two.1 == one.samples;
    println!("token_log_probs + sample: {two_calls:.3} s (median of {reps})");
    println!("propose:                  {propose:.3} s (median of {reps})");
    println!(
        "ratio: {:.2}x (two calls / propose); results identical: {same}",
        two_calls / propose
    );
    Ok(())
}
