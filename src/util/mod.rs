//! Small helpers shared by several modules.

pub mod fs;
pub mod json;
pub mod jsonl;
pub mod rng;

use std::cell::Cell;
use std::panic::UnwindSafe;

thread_local! {
    /// Set while [`catch_panic_quietly`] runs a closure on this thread.
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f`, and returns a panic in it as the panic's message: for a dependency that panics on
/// input it should refuse (the tokenizers crate on some corrupt tokenizer.json files, tantivy on
/// a damaged index), which the caller reports as an error naming the file. While `f` runs, the
/// hook [`install_quiet_panic_hook`] installs prints nothing for a panic on this thread: its
/// "thread 'main' panicked at ..." before the error would read as a crash.
pub fn catch_panic_quietly<R>(f: impl FnOnce() -> R + UnwindSafe) -> Result<R, String> {
    /// Puts back the flag as it was (calls may nest), on return and on unwind alike.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            QUIET.with(|q| q.set(self.0));
        }
    }
    let _restore = Restore(QUIET.with(|q| q.replace(true)));
    std::panic::catch_unwind(f).map_err(|panic| panic_text(panic.as_ref()))
}

/// Installs, once, a panic hook that prints nothing for the panics [`catch_panic_quietly`]
/// catches and hands every other panic to the hook installed before it. The CLI installs it
/// first thing; the library never does, as a process's panic hook is its application's to set.
pub fn install_quiet_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // A panic while the thread's locals are torn down is not one of ours.
            if !QUIET.try_with(Cell::get).unwrap_or(false) {
                previous(info);
            }
        }));
    });
}

/// The message a caught panic carried.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_panic_is_its_message_and_the_flag_is_put_back() {
        install_quiet_panic_hook();
        assert_eq!(catch_panic_quietly(|| 7), Ok(7));
        let nested = catch_panic_quietly(|| {
            let inner = catch_panic_quietly(|| panic!("inner {}", 1));
            assert!(QUIET.with(Cell::get), "still inside the outer call");
            inner
        });
        assert_eq!(nested, Ok(Err("inner 1".to_string())));
        assert!(!QUIET.with(Cell::get));
        assert_eq!(
            catch_panic_quietly(|| panic!("static")),
            Err::<(), _>("static".into())
        );
        assert!(!QUIET.with(Cell::get));
    }
}
