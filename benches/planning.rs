//! Criterion: the scoring planner alone (no model), on the standard workload: one plan of the
//! whole batch (`Plan::build`), and the same batch cut into chunks of a tenth of its unique tokens
//! (`plan::chunked`, as a memory budget cuts it). Both placements.
//!
//!     cargo bench --bench planning

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use toolsift::plan::{chunked, Plan};
use toolsift::score::{LossWeights, Placement, ScoreOptions};
use toolsift::workload::Workload;

fn planning(c: &mut Criterion) {
    let mut group = c.benchmark_group("planning");
    group.sample_size(10);
    for placement in [Placement::Prefix, Placement::Inline] {
        // 40 texts: 1,000 candidates.
        let candidates = Workload::standard(40, 1).generate(50400, placement);
        let options = ScoreOptions {
            placement,
            weights: LossWeights::default(),
        };
        let name = format!("{placement:?}").to_lowercase();
        let tenth = Plan::build(&candidates, &options).n_tokens() / 10;
        group.bench_with_input(BenchmarkId::new("build", &name), &candidates, |b, cands| {
            b.iter(|| Plan::build(cands, &options).n_tokens())
        });
        group.bench_with_input(
            BenchmarkId::new("chunked-tenth", &name),
            &candidates,
            |b, cands| {
                b.iter(|| {
                    chunked(cands, &options, tenth)
                        .map(|(_, plan)| plan.n_tokens())
                        .sum::<usize>()
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, planning);
criterion_main!(benches);
