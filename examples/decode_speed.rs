//! Decoding speed of the KV-cached CPU decoder, as the generate loop drives it: batches of 1 and
//! 32 sequences, a 32-token prompt each (prefilled in one step), then greedy steps of one token per
//! sequence, with the loop's per-step work on every row (top-k rank of the opener, argmax).
//!
//!     cargo run --release --example decode_speed [LAYERS EMBD HEADS VOCAB STEPS]
//!
//! Default model: the bench size (8 layers, d_model 512, 8 heads, vocab 50400), random weights.

use std::time::Instant;

use toolsift::cpu::CpuScorer;
use toolsift::generate::call;
use toolsift::model::{DType, GptjConfig, GptjWeights};
use toolsift::sample::{draw, Decoder, SampleOptions};
use toolsift::util::rng::Rng;

fn main() -> toolsift::Result<()> {
    let arg = |i: usize, default: usize| {
        std::env::args()
            .nth(i)
            .map_or(default, |s| s.parse().expect("a number"))
    };
    let (layers, embd, heads, vocab, steps) =
        (arg(1, 8), arg(2, 512), arg(3, 8), arg(4, 50400), arg(5, 64));
    let config = GptjConfig::small(layers, embd, heads, 32.min(embd / heads), vocab);
    let engine =
        CpuScorer::from_weights(&config, GptjWeights::random(&config, 7, DType::F32)).unwrap();
    let greedy = SampleOptions {
        temperature: 0.0,
        ..Default::default()
    };
    let prompt_len = 32;
    println!(
        "model: {layers} layers, d_model {embd}, {heads} heads, vocab {vocab}; prompt {prompt_len} tokens, {steps} steps; {} threads",
        rayon::current_num_threads()
    );
    for batch in [1usize, 32] {
        let mut rng = Rng::new(batch as u64);
        let mut session = engine.session();
        let seqs: Vec<usize> = (0..batch).map(|_| session.new_sequence()).collect();
        let prompts: Vec<Vec<u32>> = (0..batch)
            .map(|_| {
                (0..prompt_len)
                    .map(|_| rng.range(0, vocab - 1) as u32)
                    .collect()
            })
            .collect();
        let t0 = Instant::now();
        let mut rows = session.extend(&seqs, &prompts)?;
        let prefill = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        for _ in 0..steps {
            let next: Vec<Vec<u32>> = rows
                .iter()
                .map(|row| {
                    // The loop's per-row work: is an opener within the top k, then the draw.
                    std::hint::black_box(call::opener_in_top_k(row, &[58, 685], 10));
                    vec![draw(row, &greedy, &mut rng)]
                })
                .collect();
            rows = session.extend(&seqs, &next)?;
        }
        let decode = t1.elapsed().as_secs_f64();
        println!(
            "batch {batch:>2}: prefill {:.0} tokens/s ({:.3} s); decode {:.1} tokens/s ({:.1} ms/step, {} tokens)",
            (batch * prompt_len) as f64 / prefill,
            prefill,
            (batch * steps) as f64 / decode,
            1e3 * decode / steps as f64,
            batch * steps
        );
    }
    Ok(())
}
