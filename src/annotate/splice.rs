//! Splicing kept calls into the text: C*'s "annotated_text".
//!
//! Each kept call is written e(c, r) = "[Tool(input) -> result]" at its byte offset. If the text
//! continues there with whitespace (x_i carries a leading space, as most BPE tokens do), the
//! call gets a space in front: "(or [Calculator(400 / 1400) -> 0.29] 29%)"; otherwise it is
//! inserted as is. Several kept calls at one offset are all spliced, in the order given (the
//! driver orders them by delta, best first), each as it would stand alone: one space apart
//! where the text has a space (`"… [A(x) -> 1] [B(y) -> 2] 29"`), side by side where it has
//! none (`"29[A(x) -> 1][B(y) -> 2]%"`), so that C* holds no space that a call's scored sequence
//! lacked.

// In the core, so that an embedder writes C* as it was scored without the driver.
pub use crate::score::text::splice;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splices_with_the_tokens_space() {
        let t = "Out of 1400, 400 (or 29%) passed.";
        let b = t.find(" 29%").unwrap();
        assert_eq!(
            splice(t, &[(b, "[Calculator(400 / 1400) -> 0.29]".into())]),
            "Out of 1400, 400 (or [Calculator(400 / 1400) -> 0.29] 29%) passed."
        );
        let b2 = t.find("%)").unwrap();
        assert_eq!(splice("ab", &[(1, "[X() -> 1]".into())]), "a[X() -> 1]b");
        assert_eq!(
            splice(
                t,
                &[
                    (b2, "[C() -> 2]".into()),
                    (b, "[A() -> 1]".into()),
                    (b, "[B() -> 3]".into()),
                    (b2, "[D() -> 4]".into())
                ]
            ),
            "Out of 1400, 400 (or [A() -> 1] [B() -> 3] 29[C() -> 2][D() -> 4]%) passed."
        );
        assert_eq!(splice(t, &[]), t);
    }
}
