//! Embedding toolsift: load a model once, score a batch of text-level candidates, print the filter.
//!
//!     cargo run --example score [MODEL_DIR]

use toolsift::{CallForm, Model, Placement, ReferenceScorer, ScoreOptions, Scorer, TextCandidate};

fn main() -> toolsift::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/tiny-gptj").into());
    let model = Model::load(dir.as_ref())?;
    let tokenizer = model.tokenizer()?;
    let text = "Out of 1400 participants, 400 (or 29%) passed the test.";
    let calls = [
        ("400 / 1400", "0.29"),
        ("1400 / 400", "3.5"),
        ("400 - 1400", "-1000"),
    ];
    let candidates = calls
        .iter()
        .map(|(input, result)| {
            TextCandidate {
                text: text.into(),
                position: text.find(" 29%").expect("the call site"),
                tool: "Calculator".into(),
                input: input.to_string(),
                result: result.to_string(),
            }
            .to_tokens(tokenizer, Placement::Prefix, CallForm::Arrow, None)
        })
        .collect::<toolsift::Result<Vec<_>>>()?;
    let scorer = ReferenceScorer::new(&model);
    for ((input, result), s) in calls
        .iter()
        .zip(scorer.score(&candidates, &ScoreOptions::default())?)
    {
        println!(
            "[Calculator({input}) -> {result}]  L- {:.3}  L+ {:.3}  delta {:+.3}  kept {}",
            s.l_minus,
            s.l_plus,
            s.delta,
            s.kept(1.0)
        );
    }
    Ok(())
}
