//! Regenerates the generated demo assets: assets/demo/corpus.jsonl (`generate(DEMO_CORPUS_SEED,
//! DEMO_CORPUS_DOCS)`) and assets/demo/annotate.toml (the demo's settings, `DEMO_KNOBS`).
//!
//!     cargo run --example demo_assets -- assets/demo
//!
//! The model files (config.json, model.safetensors, tokenizer.json) come from the trainer.
//! The library embeds the committed files, so rebuild after running this (a unit test,
//! `demo::assets::tests::committed_assets_are_generated`, fails while they are stale).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("assets/demo"));
    match toolsift::demo::assets::write_generated(&dir) {
        Ok(paths) => {
            for p in paths {
                eprintln!("wrote {}", p.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
