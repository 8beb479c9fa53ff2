//! `toolsift convert`: a checkpoint into model.safetensors, without Python.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use toolsift::model::DType;
use toolsift::Model;

#[derive(clap::Args)]
pub(crate) struct ConvertArgs {
    /// Source checkpoint folder (pytorch_model.bin or safetensors, with config.json).
    #[arg(long)]
    model: PathBuf,
    /// Destination folder: config.json, model.safetensors and tokenizer.json (if any). A model
    /// already there is replaced, as by an earlier conversion (its tokenizer.json removed when
    /// the source has none).
    #[arg(long)]
    out: PathBuf,
    /// Storage type of the written weights; default keeps each tensor's own.
    #[arg(long, value_parser = ["f32", "f16", "bf16"])]
    dtype: Option<String>,
}

/// `convert`: the checkpoint loaded (and checked) as for scoring, written as safetensors.
pub(crate) fn run(args: ConvertArgs) -> Result<ExitCode> {
    let model = Model::load(&args.model)?;
    let dtype = args.dtype.as_deref().map(|d| match d {
        "f32" => DType::F32,
        "f16" => DType::F16,
        _ => DType::BF16,
    });
    let n = toolsift::model::checkpoint::convert(&model, &args.out, dtype)?;
    note!(
        "wrote {n} tensors to {}",
        args.out.join("model.safetensors").display()
    );
    Ok(ExitCode::SUCCESS)
}
