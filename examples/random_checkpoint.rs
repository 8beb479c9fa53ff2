//! Writes a GPT-J folder (config.json + model.safetensors) with random weights of any size, for
//! measuring what depends on size without a real checkpoint: loading, memory, the CLI end to end.
//!
//!     cargo run --release --example random_checkpoint -- OUT [LAYERS EMBD HEADS VOCAB DTYPE]
//!
//! Default: 16 layers, d_model 2048, 16 heads (rotary 64), vocab 50400, bf16: ~1 B parameters,
//! 2 GB. DTYPE is f32, f16 or bf16.

use toolsift::model::{checkpoint, DType, GptjConfig, GptjWeights};

fn main() -> toolsift::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(out) = args.first() else {
        eprintln!("usage: random_checkpoint OUT [LAYERS EMBD HEADS VOCAB DTYPE]");
        std::process::exit(2);
    };
    let num = |i: usize, default: usize| {
        args.get(i).map_or(default, |s| {
            s.parse()
                .unwrap_or_else(|_| panic!("argument {i} must be a number: {s}"))
        })
    };
    let (layers, embd, heads, vocab) = (num(1, 16), num(2, 2048), num(3, 16), num(4, 50400));
    let dtype = match args.get(5).map_or("bf16", String::as_str) {
        "f32" => DType::F32,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        other => panic!("DTYPE must be f32, f16 or bf16: {other}"),
    };
    let config = GptjConfig::small(layers, embd, heads, 64.min(embd / heads), vocab);
    let weights = GptjWeights::random(&config, 1, dtype);
    let model = toolsift::Model::from_parts(config, weights, None).unwrap();
    let n = checkpoint::convert(&model, out.as_ref(), None)?;
    println!("wrote {n} tensors to {out}/model.safetensors");
    Ok(())
}
