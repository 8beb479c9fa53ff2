//! Shared helpers of the CUDA tests: open the GPU or say why the test is skipped, case counts,
//! and a comparison that reports the worst element and how much of its budget it used.
#![allow(dead_code)]

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use toolsift::cuda::Gpu;

/// Runs the ignored test `child` of this test binary in a process of its own, on an emulated
/// device of `bytes` (`TOOLSIFT_EMU_DEVICE_BYTES`, read once per process), and asserts that it
/// passed. Skipped (returns) where `gpu()` is a real GPU, whose memory cannot be made small.
pub fn run_child_on_a_small_device(child: &str, bytes: u64) {
    let Some(g) = gpu() else { return };
    if !g.name.contains("emulated") {
        eprintln!("SKIPPED: needs the emulated device, whose memory can be made small");
        return;
    }
    run_child(child, &[("TOOLSIFT_EMU_DEVICE_BYTES", bytes.to_string())]);
}

/// Panics unless this process is the child `run_child_on_a_small_device` started (an ignored
/// child test run by hand would see the whole device).
pub fn assert_run_by_its_parent() {
    assert!(
        std::env::var_os("TOOLSIFT_EMU_DEVICE_BYTES").is_some(),
        "run by its parent test, with a small emulated device"
    );
}

/// The GPU, for a test that reads its memory pool's accounting (`Gpu::pool_memory`); None
/// after saying why where there is no GPU or it has no memory pools.
pub fn gpu_with_memory_pool() -> Option<Gpu> {
    let g = gpu()?;
    if g.pool_memory().unwrap().is_none() {
        eprintln!("SKIPPED: the device has no memory pools, whose accounting this reads");
        return None;
    }
    Some(g)
}

/// What one call did to the device memory pool (`device_memory_of`), in bytes.
#[derive(Debug, Clone, Copy)]
pub struct CallMemory {
    /// The most it held at once beyond what was held before it.
    pub allocated: u64,
    /// Held before and after it.
    pub held: [u64; 2],
}

/// Runs `call` and measures its device memory on `gpu`'s pool (which has one: see
/// `gpu_with_memory_pool`).
pub fn device_memory_of<R>(gpu: &Gpu, call: impl FnOnce() -> R) -> (R, CallMemory) {
    gpu.reset_peak_memory().unwrap();
    let before = gpu.pool_memory().unwrap().unwrap();
    let out = call();
    let after = gpu.pool_memory().unwrap().unwrap();
    let memory = CallMemory {
        allocated: after.peak_since(&before) - before.in_use,
        held: [before.in_use, after.in_use],
    };
    (out, memory)
}

/// What a device's memory pool may count beyond the bytes asked for (`Gpu::pool_memory`), in
/// bytes: none on the emulated device, which counts exactly those; on a GPU the pool rounds
/// each allocation up by an amount CUDA does not document (2 MiB pages at most), and a call
/// holds a few dozen buffers at once, so a bound there is checked with this much to spare.
pub fn pool_rounding_margin(gpu: &Gpu) -> u64 {
    if gpu.name.contains("emulated") {
        0
    } else {
        256 << 20
    }
}

/// Runs the ignored test `child` of this test binary in a process of its own (on the device
/// `gpu()` opens, with the variables `env` added) and asserts that it passed: for a test that
/// reads the device's memory accounting, which the tests running beside it in one process
/// would move.
pub fn run_child(child: &str, env: &[(&str, String)]) {
    let run = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", child, "--ignored", "--nocapture"])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&run.stdout);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success() && out.contains("1 passed"),
        "{out}\n{err}"
    );
}

/// The GPU, or None after printing why the test is skipped (never a silent pass). Built with
/// `emu` on a machine without a CUDA driver, the emulated device (toolsift::emu::device); an
/// `emu` build never skips: a driver that is installed but opens no device (NVIDIA's libraries
/// on a machine without a GPU) fails the test, since the emulated device only stands in for a
/// missing driver and every CUDA test would otherwise pass unrun.
pub fn gpu() -> Option<Gpu> {
    #[cfg(feature = "emu")]
    let emulated = match toolsift::emu::device::use_unless_gpu() {
        Ok(emulated) => emulated,
        Err(e) => panic!("the emulated device does not load: {e}"),
    };
    match Gpu::new(0) {
        Ok(g) => {
            eprintln!("running on {} ({} SMs)", g.name, g.sm_count);
            Some(g)
        }
        Err(e) => {
            #[cfg(feature = "emu")]
            panic!(
                "{}: {e}",
                if emulated {
                    "the emulated device does not open"
                } else {
                    "a CUDA driver is installed but opens no device, and the emulated device \
                     stands in only for a missing driver: run the emu suites where there is none"
                }
            );
            #[cfg(not(feature = "emu"))]
            {
                eprintln!("SKIPPED: no CUDA device: {e}");
                None
            }
        }
    }
}

/// Proptest cases: `default`, or TOOLSIFT_FUZZ_CASES (the GPU session turns it up).
pub fn cases(default: u32) -> u32 {
    std::env::var("TOOLSIFT_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Which multi-query attention kernels a run covers (TOOLSIFT_TEST_MMA): `0` leaves the
/// register-resident tensor-core kernel (`tree_attention_mma`) out, `only` runs it alone, unset or
/// anything else both. The GPU script runs the suites without it, then it alone in processes of
/// its own: a device fault poisons the context every test of a process shares, and that kernel
/// is the one never run on a card yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaCases {
    Without,
    Only,
    Both,
}

pub fn mma_cases() -> MmaCases {
    match std::env::var("TOOLSIFT_TEST_MMA").as_deref() {
        Ok("0") => MmaCases::Without,
        Ok("only") => MmaCases::Only,
        _ => MmaCases::Both,
    }
}

impl MmaCases {
    /// Whether a case that runs (`mma`) or does not run the mma kernel belongs to this run.
    pub fn covers(self, mma: bool) -> bool {
        match self {
            MmaCases::Without => !mma,
            MmaCases::Only => mma,
            MmaCases::Both => true,
        }
    }
}

/// A kernel suite's default case count: `default` on a GPU, a quarter of it on the emulated
/// device, which is slow and whose kernels tests/emu_kernels.rs already fuzzes on that many.
pub fn kernel_cases(default: u32) -> u32 {
    #[cfg(feature = "emu")]
    if toolsift::emu::device::is_active() {
        return (default / 4).max(4);
    }
    default
}

/// Runs `check` on `cases(default)` values of `strategy`; panics with the minimal failing input.
pub fn fuzz<S: Strategy>(
    name: &str,
    default: u32,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let n = cases(default);
    let mut runner = TestRunner::new(Config {
        cases: n,
        failure_persistence: None,
        ..Config::default()
    });
    if let Err(e) = runner.run(&strategy, check) {
        panic!("{name}: {e}");
    }
    eprintln!("{name}: {n} cases passed");
}

/// Compares element-wise: |got - want| <= abs + rel * |want| (or the per-element `abs_each`).
/// On failure names the worst element, both values and the fraction of its budget used.
pub fn compare(
    what: &str,
    got: &[f64],
    want: &[f64],
    abs: f64,
    rel: f64,
    abs_each: Option<&[f64]>,
) -> Result<f64, TestCaseError> {
    if got.len() != want.len() {
        return Err(TestCaseError::fail(format!(
            "{what}: {} values, expected {}",
            got.len(),
            want.len()
        )));
    }
    let mut worst = (0usize, 0f64);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let budget = abs_each.map_or(abs, |a| a[i] + abs) + rel * w.abs();
        // Equal infinities (a masked token's -inf) match exactly; any other value where one
        // side is not finite is a miss (its budget would be inf, and inf / inf passes as NaN).
        let used = if g == w {
            0.0
        } else if !g.is_finite() || !w.is_finite() {
            f64::INFINITY
        } else {
            (g - w).abs() / budget
        };
        if used > worst.1 || i == 0 {
            worst = (i, used.max(worst.1));
            if used > 1.0 {
                return Err(TestCaseError::fail(format!(
                    "{what}: element {i}: got {g}, want {w}, |diff| {:.3e} = {:.1}x the budget \
                     {budget:.3e} (abs {abs:.1e}, rel {rel:.1e})",
                    (g - w).abs(),
                    used
                )));
            }
        }
    }
    Ok(worst.1)
}

/// Deterministic random values in [-scale, scale) (non-zero almost surely).
pub fn random_vec(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut rng = toolsift::util::rng::Rng::new(seed);
    (0..n)
        .map(|_| scale * (2.0 * rng.uniform() as f32 - 1.0))
        .collect()
}
