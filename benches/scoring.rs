//! Criterion: toolsift against the candle baselines on one random GPT-J and one slice of the
//! standard workload (one text, one position, five calls), both placements, in one group so the
//! report compares like with like. Random non-zero weights, peaked outputs.
//!
//!     cargo bench --features baselines --bench scoring
//!
//! The whole standard workload with the default bench model is `toolsift bench`
//! (docs/benchmarks.md).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use toolsift::baselines::{naive_losses, tuned_kv_losses, tuned_losses, CandleGptj};
use toolsift::cpu::CpuScorer;
use toolsift::model::{DType, GptjConfig, GptjWeights};
use toolsift::score::{LossWeights, Placement, ScoreOptions, Scorer};
use toolsift::workload::Workload;

fn scoring(c: &mut Criterion) {
    let config = GptjConfig::small(4, 256, 4, 32, 50400);
    let weights = GptjWeights::random(&config, 1, DType::F32);
    let engine = CpuScorer::from_weights(&config, weights.clone()).unwrap();
    let candle = CandleGptj::new(&config, &weights).expect("candle model");
    let mut group = c.benchmark_group("scoring");
    group.sample_size(10);
    for placement in [Placement::Prefix, Placement::Inline] {
        let workload = Workload {
            positions_per_text: 1,
            ..Workload::standard(1, 7)
        };
        let candidates = workload.generate(config.vocab_size, placement);
        let options = ScoreOptions {
            placement,
            weights: LossWeights::default(),
        };
        let name = format!("{placement:?}").to_lowercase();
        group.bench_with_input(
            BenchmarkId::new("toolsift", &name),
            &candidates,
            |b, cands| {
                b.iter(|| {
                    engine
                        .variant_losses_unchecked(cands, &options)
                        .expect("toolsift")
                })
            },
        );
        group.bench_with_input(
            BenchmarkId::new("candle-tuned", &name),
            &candidates,
            |b, cands| b.iter(|| tuned_losses(&candle, cands, &options, 8).expect("tuned")),
        );
        group.bench_with_input(
            BenchmarkId::new("candle-tuned-kv", &name),
            &candidates,
            |b, cands| b.iter(|| tuned_kv_losses(&candle, cands, &options, 8).expect("tuned-kv")),
        );
        group.bench_with_input(
            BenchmarkId::new("candle-naive", &name),
            &candidates,
            |b, cands| b.iter(|| naive_losses(&candle, cands, &options, 8).expect("naive")),
        );
    }
    group.finish();
}

criterion_group!(benches, scoring);
criterion_main!(benches);
