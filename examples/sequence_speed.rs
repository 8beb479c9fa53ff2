//! One sequence's forward on the CPU engine: `token_log_probs` over LEN tokens, the driver's
//! first step on a document (P(x) ++ x, one segment: the case where attention has no segments
//! to spread over threads and runs its heads as parallel tasks instead). Prints the median of
//! REPS runs.
//!
//!     cargo run --release --example sequence_speed [LAYERS EMBD HEADS VOCAB LEN REPS]
//!
//! Default model: the bench size (8 layers, d_model 512, 8 heads, vocab 50400), random weights,
//! and a 2048-token sequence.

use std::time::Instant;

use toolsift::cpu::CpuScorer;
use toolsift::model::{DType, GptjConfig, GptjWeights};
use toolsift::sample::Sampler;
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
        arg(5, 2048),
        arg(6, 5),
    );
    let mut config = GptjConfig::small(layers, embd, heads, 32.min(embd / heads), vocab);
    config.n_positions = config.n_positions.max(len + 1);
    let engine = CpuScorer::from_weights(&config, GptjWeights::random(&config, 7, DType::F32))?;
    let mut rng = Rng::new(3);
    let ids: Vec<u32> = (0..len).map(|_| rng.range(0, vocab - 1) as u32).collect();
    let tokens = [1u32, 2];
    println!(
        "model: {layers} layers, d_model {embd}, {heads} heads, vocab {vocab}; one sequence of \
         {len} tokens; {} threads",
        rayon::current_num_threads()
    );
    let mut times = Vec::with_capacity(reps.max(1));
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        let rows = engine.token_log_probs(&ids, &tokens)?;
        times.push(start.elapsed().as_secs_f64());
        assert_eq!(rows.len(), len);
    }
    times.sort_by(f64::total_cmp);
    println!("token_log_probs median {:.3} s", times[times.len() / 2]);
    Ok(())
}
