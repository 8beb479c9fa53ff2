//! train-demo: trains the demo GPT-J and its tokenizer on the synthetic corpus and writes a model
//! folder that `toolsift` loads (docs/demo-model.md). The work is in `toolsift::demo::train`.

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use toolsift::demo::train::{self, TrainOptions};

#[derive(Parser)]
#[command(about = "Train the demo GPT-J (candle autograd, CPU) and write a toolsift model folder")]
struct Cli {
    /// Output folder: config.json, model.safetensors, tokenizer.json, training.json.
    #[arg(long, required_unless_present_any = ["profile_len", "check"])]
    out: Option<PathBuf>,
    /// Seed of the weights and of the batch order (and of the corpus unless --data-seed). The demo
    /// model uses 1: the embedded corpus (`DEMO_CORPUS_SEED`) and eval-demo's set (2) are held out.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Seed of the corpus generator (default: --seed).
    #[arg(long)]
    data_seed: Option<u64>,
    /// Documents generated for training.
    #[arg(long, default_value_t = 20_000)]
    docs: usize,
    #[arg(long, default_value_t = 3000)]
    steps: usize,
    /// Sequences per batch.
    #[arg(long, default_value_t = 32, value_parser = at_least(1))]
    batch: usize,
    /// Peak learning rate (finite, above 0).
    #[arg(long, default_value_t = 3e-3, value_parser = positive)]
    lr: f64,
    #[arg(long, default_value_t = 100)]
    warmup: usize,
    /// Final learning rate as a fraction of the peak (cosine decay), 0 to 1.
    #[arg(long, default_value_t = 0.1, value_parser = fraction)]
    final_lr_frac: f64,
    /// AdamW's decoupled weight decay (finite, 0 or more).
    #[arg(long, default_value_t = 0.01, value_parser = non_negative)]
    weight_decay: f64,
    /// Global gradient-norm clip (0: none).
    #[arg(long, default_value_t = 1.0, value_parser = non_negative)]
    grad_clip: f64,
    /// Threads for candle's matrix products (default: all cores; at least 1, so that the
    /// count training.json records is the one that ran).
    #[arg(long, value_parser = at_least(1))]
    threads: Option<usize>,
    /// Tokenizer size, <|endoftext|> included (the model's vocabulary is padded to a multiple of
    /// 8): more than the 256 bytes and <|endoftext|>.
    #[arg(long, default_value_t = 512, value_parser = at_least(258))]
    vocab_size: usize,
    #[arg(long, default_value_t = 4)]
    n_layer: usize,
    #[arg(long, default_value_t = 128)]
    n_embd: usize,
    #[arg(long, default_value_t = 4)]
    n_head: usize,
    #[arg(long, default_value_t = 16)]
    rotary_dim: usize,
    #[arg(long, default_value_t = 256)]
    n_positions: usize,
    /// Print (and record) the mean loss and step time every N steps.
    #[arg(long, default_value_t = 50)]
    log_every: usize,
    /// Training sequences compared against toolsift's f64 reference after training (at least one:
    /// a check of none would pass having compared nothing).
    #[arg(long, default_value_t = 4, value_parser = at_least(1))]
    check_sequences: usize,
    /// Only time training steps on random ids of this length (no corpus, nothing written).
    #[arg(long)]
    profile_len: Option<usize>,
    /// Only check an existing folder: the candle forward of its weights against toolsift's f64
    /// reference on --check-sequences training sequences of the data seed (nothing trained).
    #[arg(long, conflicts_with = "profile_len")]
    check: Option<PathBuf>,
    /// Steps timed by --profile-len (after one warm-up step).
    #[arg(long, default_value_t = 5)]
    profile_steps: usize,
}

impl Cli {
    /// The run's options: the flags, the rest of the demo model's recipe, and `threads` (the
    /// count that runs, `--threads` or all cores).
    fn options(&self, threads: usize) -> TrainOptions {
        TrainOptions {
            seed: self.seed,
            data_seed: self.data_seed.unwrap_or(self.seed),
            docs: self.docs,
            steps: self.steps,
            batch: self.batch,
            lr: self.lr,
            warmup: self.warmup,
            final_lr_frac: self.final_lr_frac,
            weight_decay: self.weight_decay,
            grad_clip: self.grad_clip,
            vocab_size: self.vocab_size,
            n_layer: self.n_layer,
            n_embd: self.n_embd,
            n_head: self.n_head,
            rotary_dim: self.rotary_dim,
            n_positions: self.n_positions,
            log_every: self.log_every,
            check_sequences: self.check_sequences,
            threads,
            ..TrainOptions::default()
        }
    }
}

/// Keeps freed tensor buffers in the heap instead of returning them to the kernel: a training
/// step allocates and frees the same large buffers over and over, and glibc's default (buffers of
/// 128 KiB and more are fresh mmaps) made a step almost twice as long in page faults.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn keep_freed_memory() {
    extern "C" {
        fn mallopt(param: i32, value: i32) -> i32;
    }
    const M_TRIM_THRESHOLD: i32 = -1;
    const M_MMAP_THRESHOLD: i32 = -3;
    // SAFETY: mallopt only changes glibc's allocation thresholds; called before any other thread.
    unsafe {
        mallopt(M_MMAP_THRESHOLD, 32 << 20); // glibc's maximum
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn keep_freed_memory() {}

fn main() -> Result<()> {
    keep_freed_memory();
    let cli = Cli::parse();
    let threads = cli.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    // candle sizes its GEMM parallelism from RAYON_NUM_THREADS, read at each product; set it
    // before any thread exists. candle's elementwise ops run on a second, spinning pool
    // (CANDLE_NUM_THREADS): on a small machine its spinning workers fight the GEMM threads and the
    // fused ops' rayon tasks (2 cores: a step took twice as long), so it stays at one thread.
    std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()?;
    let o = cli.options(threads);
    if let Some(len) = cli.profile_len {
        let t = train::profile(&o, len, cli.profile_steps)?;
        println!(
            "profile: batch {} x {len} tokens, {threads} threads: {:.3}s/step = batch {:.3} + \
             forward {:.3} + backward {:.3} + optimizer {:.3}; {} steps would take {:.0} min",
            o.batch,
            t.total(),
            t.batch,
            t.forward,
            t.backward,
            t.optimizer,
            o.steps,
            t.total() * o.steps as f64 / 60.0
        );
        return Ok(());
    }
    if let Some(dir) = &cli.check {
        let check = train::check_folder(dir, &o)?;
        let vocab = toolsift::GptjConfig::from_file(&dir.join("config.json"))?.vocab_size;
        println!("{}: {}", dir.display(), check.describe(vocab));
        anyhow::ensure!(
            check.passes(),
            "candle and toolsift's reference disagree by more than 1e-4 (and more than twice the \
             engine's own f32 error)"
        );
        return Ok(());
    }
    let out = cli.out.expect("clap requires --out");
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let report = train::run(&out, &o, &command, &mut |line| println!("{line}"))?;
    println!(
        "wrote {} ({} steps in {:.0}s, {:.3}s/step; final loss {:.4}; reference max diff {:.2e})",
        out.display(),
        report.steps,
        report.train_s,
        report.mean_step_s,
        report.losses.last().map_or(f64::NAN, |e| e.loss),
        report.reference.max_abs_diff
    );
    Ok(())
}

/// A clap parser of integers no smaller than `min` (0 would divide by zero or check nothing).
fn at_least(min: u64) -> impl clap::builder::TypedValueParser<Value = usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(min..)
}

/// A float flag within `ok`, described by `what`.
fn float_in(s: &str, ok: impl Fn(f64) -> bool, what: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && ok(v) {
        Ok(v)
    } else {
        Err(format!("{v} is not {what}"))
    }
}

fn positive(s: &str) -> Result<f64, String> {
    float_in(s, |v| v > 0.0, "a finite number above 0")
}

fn non_negative(s: &str) -> Result<f64, String> {
    float_in(s, |v| v >= 0.0, "a finite number of 0 or more")
}

fn fraction(s: &str) -> Result<f64, String> {
    float_in(s, |v| (0.0..=1.0).contains(&v), "a fraction from 0 to 1")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::{Cli, TrainOptions};

    fn parses(args: &[&str]) -> bool {
        let argv = ["train-demo", "--out", "x"].iter().chain(args);
        Cli::try_parse_from(argv).is_ok()
    }

    /// The float flags at their bounds: --lr above 0, --weight-decay and --grad-clip 0 or more,
    /// --final-lr-frac 0 to 1 inclusive, none infinite or NaN.
    #[test]
    fn float_flags_are_checked_at_their_bounds() {
        assert!(parses(&["--lr", "1e-9"]) && !parses(&["--lr", "0"]));
        assert!(!parses(&["--lr", "inf"]) && !parses(&["--lr", "NaN"]));
        assert!(parses(&["--weight-decay", "0"]) && !parses(&["--weight-decay", "-0.1"]));
        assert!(parses(&["--grad-clip", "0"]) && !parses(&["--grad-clip", "inf"]));
        assert!(parses(&["--final-lr-frac", "0"]) && parses(&["--final-lr-frac", "1"]));
        assert!(!parses(&["--final-lr-frac", "1.01"]) && !parses(&["--final-lr-frac", "-0.01"]));
    }

    /// With no flags, train-demo trains the demo model's recipe (`TrainOptions::default()`, which
    /// docs/demo-model.md gives); the corpus seed follows --seed unless --data-seed is given.
    #[test]
    fn no_flags_train_the_default_recipe() {
        let cli = |args: &[&str]| {
            Cli::try_parse_from(["train-demo", "--out", "x"].iter().chain(args)).unwrap()
        };
        let recipe = TrainOptions::default();
        assert_eq!(cli(&[]).options(recipe.threads), recipe);
        let o = cli(&["--seed", "7"]).options(1);
        assert_eq!((o.seed, o.data_seed), (7, 7));
        let o = cli(&["--seed", "7", "--data-seed", "9"]).options(1);
        assert_eq!((o.seed, o.data_seed), (7, 9));
    }

    /// --vocab-size leaves room for a merge (258 and up); --check-sequences, --batch and
    /// --threads at least 1 (a check of none would pass having compared nothing).
    #[test]
    fn integer_flags_are_checked_at_their_bounds() {
        assert!(parses(&["--vocab-size", "258"]) && !parses(&["--vocab-size", "257"]));
        assert!(parses(&["--check-sequences", "1"]) && !parses(&["--check-sequences", "0"]));
        assert!(parses(&["--batch", "1"]) && !parses(&["--batch", "0"]));
        assert!(parses(&["--threads", "1"]) && !parses(&["--threads", "0"]));
    }
}
