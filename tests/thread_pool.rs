//! The CPU engine runs on the caller's rayon pool: an embedder's own pool (`ThreadPool::install`)
//! keeps its work off rayon's global pool. One test in its own process, so that nothing else
//! starts the global pool first.

mod common;

use toolsift::cpu::CpuScorer;
use toolsift::score::{ScoreOptions, Scorer};
use toolsift::Model;

#[test]
fn scoring_inside_an_embedders_pool_never_starts_the_global_pool() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let (scores, alone) = pool.install(|| {
        let model = Model::load(common::tiny("f32")).unwrap();
        let scorer = CpuScorer::new(&model);
        let mut rng = toolsift::util::rng::Rng::new(7);
        let cands = common::random_candidates(&mut rng, model.config().vocab_size, 3, 24);
        let options = ScoreOptions::default();
        let alone = scorer.score(&cands[..1], &options).unwrap();
        (scorer.score(&cands, &options).unwrap(), alone)
    });
    assert!(scores.len() >= 3);
    assert!(alone[0].l_none.is_finite());
    // The global pool was never built: building it now succeeds.
    assert!(rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build_global()
        .is_ok());
}
