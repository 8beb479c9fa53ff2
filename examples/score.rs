//! Embedding toolsift: load a model once, score a batch of text-level candidates on the fast CPU
//! engine, print the filter. Without an argument it uses the demo model embedded in the crate,
//! with the demo's settings: inline placement (the demo model was trained on calls in the text),
//! tau_f 0.5 for the calculator.
//!
//!     cargo run --release --example score [MODEL_DIR]

use toolsift::{
    score_texts, scorer_for, CallForm, Device, Model, Placement, ScoreOptions, TextCandidate,
};

fn main() -> toolsift::Result<()> {
    let dir = match std::env::args_os().nth(1) {
        Some(dir) => dir.into(),
        None => toolsift::demo::assets::materialize()?,
    };
    let model = Model::load(&dir)?;
    let scorer = scorer_for(&model, Device::Cpu)?;
    let text = "Each of the boxes costs 25 dollars, so 12 of them cost 300 dollars.";
    let calls = [("25 * 12", "300"), ("25 + 12", "37"), ("12 / 25", "0.48")];
    let candidates: Vec<TextCandidate> = calls
        .iter()
        .map(|(input, result)| TextCandidate {
            text: text.into(),
            position: text.find(" 300").expect("the call site"),
            tool: "Calculator".into(),
            input: input.to_string(),
            result: result.to_string(),
            weights: None,
        })
        .collect();
    let options = ScoreOptions {
        placement: Placement::Inline,
        ..ScoreOptions::default()
    };
    let scores = score_texts(
        &*scorer,
        model.tokenizer()?,
        &candidates,
        &options,
        CallForm::Arrow,
    )?;
    for ((input, result), s) in calls.iter().zip(scores) {
        println!(
            "[Calculator({input}) -> {result}]  L- {:.3}  L+ {:.3}  delta {:+.3}  kept {}",
            s.l_minus,
            s.l_plus,
            s.delta,
            s.kept(0.5)
        );
    }
    Ok(())
}
