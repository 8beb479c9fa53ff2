//! Small helpers shared by several modules.

pub mod fs;
pub mod json;
pub mod jsonl;
pub mod rng;

/// The message a caught panic carried.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}
