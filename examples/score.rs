//! Embedding toolsift: load a model once, score a batch of text-level candidates on the fast CPU
//! engine, print the filter. Without an argument it uses the demo model embedded in the crate,
//! with the demo's settings: inline placement (the demo model was trained on calls in the text),
//! tau_f 0.5 for the calculator. One candidate of the batch cannot be scored: `score_texts_each`
//! answers it with its reason, in its place, and scores the others together.
//!
//!     cargo run --release --example score [MODEL_DIR]

use toolsift::{
    score_texts_each, scorer_for, CallForm, Device, Error, InvalidCandidate, Model, Placement,
    ScoreOptions, TextCandidate,
};

fn main() -> toolsift::Result<()> {
    let dir = match std::env::args_os().nth(1) {
        Some(dir) => dir.into(),
        None => toolsift::demo::assets::materialize()?,
    };
    let model = Model::load(&dir)?;
    let scorer = scorer_for(&model, Device::Cpu)?;
    let text = "Each of the boxes costs 25 dollars, so 12 of them cost 300 dollars.";
    let at = text.find(" 300").expect("the call site");
    // The last call's result holds brackets, which a call cannot: it cannot be written.
    let calls = [
        ("25 * 12", "300"),
        ("25 + 12", "37"),
        ("12 / 25", "0.48"),
        ("25 * 12", "[300]"),
    ];
    let candidates: Vec<TextCandidate> = calls
        .iter()
        .map(|(input, result)| TextCandidate::new(text, at, "Calculator", *input, *result))
        .collect();
    let options = ScoreOptions {
        placement: Placement::Inline,
        ..ScoreOptions::default()
    };
    let answers = score_texts_each(
        &*scorer,
        model.tokenizer()?,
        &candidates,
        &options,
        CallForm::Arrow,
    )?;
    for ((input, result), answer) in calls.iter().zip(answers) {
        let call = format!("[Calculator({input}) -> {result}]");
        match answer {
            Ok(s) => println!(
                "{call}  L- {:.3}  L+ {:.3}  delta {:+.3}  kept {}",
                s.l_minus,
                s.l_plus,
                s.delta,
                s.kept(0.5)
            ),
            // The reason is a value: a text too long for the model could be cut and retried.
            Err(Error::Candidate {
                reason: InvalidCandidate::TooLong { .. } | InvalidCandidate::TextTooLong { .. },
                ..
            }) => println!("{call}  too long for the model"),
            Err(Error::Candidate { reason, .. }) => println!("{call}  refused: {reason}"),
            // Anything else (the tokenizer failing on the text) is not about this candidate.
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
