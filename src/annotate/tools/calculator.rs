//! Calculator: the four operations over decimal numbers, parsed by hand and never
//! evaluated as code, so a sampled call like `Calculator(__import__('os'))` is only ever a
//! syntax error.
//!
//! Accepted input (anything else is [`ToolError::InvalidInput`]):
//! - numbers: `12`, `0.5`, `.5`, and thousands separators in well-formed groups (`1,400`,
//!   `12,345,678.9`) because numbers copied from text carry them; a comma anywhere else
//!   (`1,40`, `1234,567`, `1,`, and `0,400`, a decimal comma) is an error. No exponents
//!   (`1e5`), no `5.`.
//! - binary `+ - * /` (usual precedence, left-associative), unary `-` and `+`, parentheses;
//! - any Unicode whitespace between tokens.
//!
//! Limits: at most [`MAX_INPUT_LEN`] bytes, nesting (parentheses plus unary signs) at most
//! [`MAX_DEPTH`] deep. Arithmetic is f64; division by zero and a non-finite intermediate
//! or final value are [`ToolError::Failed`].
//!
//! The result is rounded to two decimals, half away from zero (exactly, on the f64 value),
//! then trailing zeros and a
//! trailing dot are dropped, as in the paper's examples: 400/1400 → "0.29", 1400 → "1400",
//! 27/2 → "13.5"; negative zero prints as "0". See [`format_result`].

use super::{DocContext, Tool, ToolError};

/// Longest accepted input, in bytes; sampled calls are short, longer ones are noise.
pub const MAX_INPUT_LEN: usize = 200;
/// Deepest accepted nesting of parentheses and unary signs; bounds the parser's recursion.
pub const MAX_DEPTH: usize = 32;

/// The Calculator tool.
#[derive(Debug, Clone, Copy, Default)]
pub struct Calculator;

impl Calculator {
    /// A calculator (it has no settings).
    pub fn new() -> Self {
        Self
    }
}

impl Tool for Calculator {
    fn name(&self) -> &str {
        "Calculator"
    }

    fn call(&self, input: &str, _doc: &DocContext<'_>) -> Result<String, ToolError> {
        let value = evaluate(input)?;
        format_result(value).ok_or_else(|| ToolError::Failed("result out of range".into()))
    }
}

/// Formats `value` rounded to two decimals with trailing zeros removed; None if not finite.
///
/// The rounding is exact, half away from zero, on the f64's own value (0.125 is "0.13", and
/// 123456789012345.67, stored as ...345.671875, is "123456789012345.67"): integer arithmetic on
/// its mantissa, since `(value * 100).round()` loses the cents above ~4.5e13 (value * 100 past
/// 2^53) and `{:.2}` rounds ties to even.
pub fn format_result(value: f64) -> Option<String> {
    if !value.is_finite() {
        return None;
    }
    if value.fract() == 0.0 {
        // Every f64 from 2^52 up is an integer: printed whole, exactly.
        let text = format!("{value:.0}");
        return Some(if text == "-0" { "0".into() } else { text });
    }
    // |value| < 2^52 here, value = m * 2^-shift with 0 < shift <= 1074.
    let bits = value.abs().to_bits();
    let (biased, fraction) = ((bits >> 52) as i32 & 0x7ff, bits & ((1 << 52) - 1));
    let (m, exp) = match biased {
        0 => (fraction, -1074),
        _ => (fraction | 1 << 52, biased - 1075),
    };
    let shift = exp.unsigned_abs();
    let scaled = u128::from(m) * 100; // < 2^60
    let cents = if shift >= 120 {
        0 // scaled / 2^shift < 2^-60: nowhere near half a cent
    } else {
        let whole = scaled >> shift;
        let rest = scaled - (whole << shift);
        whole + u128::from(rest >= 1 << (shift - 1))
    };
    let sign = if value < 0.0 && cents > 0 { "-" } else { "" };
    let mut text = format!("{sign}{}.{:02}", cents / 100, cents % 100);
    while text.ends_with('0') {
        text.pop();
    }
    if text.ends_with('.') {
        text.pop();
    }
    Some(text)
}

/// Parses and evaluates `input`; see the module docs for what is accepted.
pub fn evaluate(input: &str) -> Result<f64, ToolError> {
    if input.len() > MAX_INPUT_LEN {
        return Err(invalid(format!(
            "expression is {} bytes long, more than the {MAX_INPUT_LEN} allowed",
            input.len()
        )));
    }
    let tokens = lex(input)?;
    if tokens.is_empty() {
        return Err(invalid("empty expression".into()));
    }
    let mut parser = Parser {
        tokens: &tokens,
        pos: 0,
        depth: 0,
        end: input.len(),
    };
    let value = parser.expr()?;
    if let Some(tok) = parser.peek() {
        return Err(invalid(format!(
            "unexpected {} at byte {}",
            tok.kind.describe(),
            tok.at
        )));
    }
    Ok(value)
}

fn invalid(message: String) -> ToolError {
    ToolError::InvalidInput(message)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Num(f64),
    Plus,
    Minus,
    Star,
    Slash,
    Open,
    Close,
}

impl Kind {
    fn describe(&self) -> String {
        match self {
            Kind::Num(v) => format!("number {v}"),
            Kind::Plus => "'+'".into(),
            Kind::Minus => "'-'".into(),
            Kind::Star => "'*'".into(),
            Kind::Slash => "'/'".into(),
            Kind::Open => "'('".into(),
            Kind::Close => "')'".into(),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Token {
    kind: Kind,
    /// Byte offset in the input, for error messages.
    at: usize,
}

fn lex(input: &str) -> Result<Vec<Token>, ToolError> {
    let bytes = input.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let kind = match b {
            b'+' => Kind::Plus,
            b'-' => Kind::Minus,
            b'*' => Kind::Star,
            b'/' => Kind::Slash,
            b'(' => Kind::Open,
            b')' => Kind::Close,
            b'0'..=b'9' | b'.' => {
                let (value, next) = lex_number(input, i)?;
                tokens.push(Token {
                    kind: Kind::Num(value),
                    at: i,
                });
                i = next;
                continue;
            }
            _ => {
                // `i` is always on a char boundary: every other branch advances by whole
                // ASCII bytes or by a whole char.
                let c = input[i..].chars().next().unwrap_or('\u{FFFD}');
                if c.is_whitespace() {
                    i += c.len_utf8();
                    continue;
                }
                return Err(invalid(format!("unexpected character {c:?} at byte {i}")));
            }
        };
        tokens.push(Token { kind, at: i });
        i += 1;
    }
    Ok(tokens)
}

/// Reads the number starting at byte `start`; returns its value and the byte after it.
fn lex_number(input: &str, start: usize) -> Result<(f64, usize), ToolError> {
    let bytes = input.as_bytes();
    let digits_from = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    let mut plain = String::new();
    let mut i = digits_from(start);
    plain.push_str(&input[start..i]);
    let first_group = i - start;
    // Thousands groups: ",ddd" not followed by another digit.
    while i < bytes.len() && bytes[i] == b',' {
        let group_end = digits_from(i + 1);
        // "0,400" is a decimal comma (0.4), never a thousands group.
        let leading_zero = bytes[start] == b'0';
        if first_group == 0 || first_group > 3 || leading_zero || group_end - (i + 1) != 3 {
            return Err(invalid(format!(
                "malformed thousands separator at byte {i} (groups must be 1-3 digits not \
                 starting with 0, then exactly 3)"
            )));
        }
        plain.push_str(&input[i + 1..group_end]);
        i = group_end;
    }
    if i < bytes.len() && bytes[i] == b'.' {
        let frac_end = digits_from(i + 1);
        if frac_end == i + 1 {
            return Err(invalid(format!("expected digits after '.' at byte {i}")));
        }
        plain.push_str(&input[i..frac_end]);
        i = frac_end;
    }
    if plain.is_empty() {
        return Err(invalid(format!("expected a number at byte {start}")));
    }
    // A leading '.' needs a zero for Rust's parser to be unambiguous about intent.
    if plain.starts_with('.') {
        plain.insert(0, '0');
    }
    let value = plain
        .parse::<f64>()
        .map_err(|e| invalid(format!("bad number {plain:?} at byte {start}: {e}")))?;
    if !value.is_finite() {
        return Err(invalid(format!("number at byte {start} is too large")));
    }
    Ok((value, i))
}

struct Parser<'t> {
    tokens: &'t [Token],
    pos: usize,
    depth: usize,
    /// Input length, reported as the position of "end of input".
    end: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<Token> {
        self.tokens.get(self.pos).copied()
    }

    fn bump(&mut self) -> Option<Token> {
        let tok = self.peek();
        if tok.is_some() {
            self.pos += 1;
        }
        tok
    }

    /// expr := term (('+' | '-') term)*
    fn expr(&mut self) -> Result<f64, ToolError> {
        let mut acc = self.term()?;
        while let Some(tok) = self.peek() {
            let op = tok.kind;
            if op != Kind::Plus && op != Kind::Minus {
                break;
            }
            self.pos += 1;
            let rhs = self.term()?;
            acc = finite(if op == Kind::Plus {
                acc + rhs
            } else {
                acc - rhs
            })?;
        }
        Ok(acc)
    }

    /// term := unary (('*' | '/') unary)*
    fn term(&mut self) -> Result<f64, ToolError> {
        let mut acc = self.unary()?;
        while let Some(tok) = self.peek() {
            let op = tok.kind;
            if op != Kind::Star && op != Kind::Slash {
                break;
            }
            self.pos += 1;
            let rhs = self.unary()?;
            acc = if op == Kind::Star {
                finite(acc * rhs)?
            } else if rhs == 0.0 {
                return Err(ToolError::Failed("division by zero".into()));
            } else {
                finite(acc / rhs)?
            };
        }
        Ok(acc)
    }

    /// unary := ('+' | '-') unary | '(' expr ')' | number
    fn unary(&mut self) -> Result<f64, ToolError> {
        let Some(tok) = self.bump() else {
            return Err(invalid(format!(
                "expression ends early at byte {}: expected a number or '('",
                self.end
            )));
        };
        match tok.kind {
            Kind::Num(v) => Ok(v),
            Kind::Plus | Kind::Minus | Kind::Open => {
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    return Err(invalid(format!(
                        "nesting deeper than {MAX_DEPTH} at byte {}",
                        tok.at
                    )));
                }
                let value = if tok.kind == Kind::Open {
                    let inner = self.expr()?;
                    match self.bump() {
                        Some(Token {
                            kind: Kind::Close, ..
                        }) => inner,
                        Some(other) => {
                            return Err(invalid(format!(
                                "expected ')' at byte {} for '(' at byte {}, found {}",
                                other.at,
                                tok.at,
                                other.kind.describe()
                            )))
                        }
                        None => {
                            return Err(invalid(format!("unclosed '(' at byte {}", tok.at)));
                        }
                    }
                } else {
                    let operand = self.unary()?;
                    if tok.kind == Kind::Minus {
                        -operand
                    } else {
                        operand
                    }
                };
                self.depth -= 1;
                Ok(value)
            }
            other => Err(invalid(format!(
                "unexpected {} at byte {}: expected a number or '('",
                other.describe(),
                tok.at
            ))),
        }
    }
}

fn finite(value: f64) -> Result<f64, ToolError> {
    if value.is_finite() {
        Ok(value)
    } else {
        Err(ToolError::Failed("result out of range".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn calc(input: &str) -> Result<String, ToolError> {
        Calculator::new().call(input, &DocContext::default())
    }

    #[test]
    fn paper_examples() {
        assert_eq!(calc("400 / 1400").as_deref(), Ok("0.29"));
        assert_eq!(calc("1400").as_deref(), Ok("1400"));
        assert_eq!(calc("27 / 2").as_deref(), Ok("13.5"));
        assert_eq!(calc("18 + 12 * 3").as_deref(), Ok("54"));
        assert_eq!(calc("(18 + 12) * 3").as_deref(), Ok("90"));
    }

    #[test]
    fn syntax_features() {
        assert_eq!(calc("-3 * -(2 + 1)").as_deref(), Ok("9"));
        assert_eq!(calc("+2 - +1").as_deref(), Ok("1"));
        assert_eq!(calc("2--3").as_deref(), Ok("5"));
        assert_eq!(calc(".5 + 0.25").as_deref(), Ok("0.75"));
        assert_eq!(calc("1,400 + 12,345,678.5").as_deref(), Ok("12347078.5"));
        assert_eq!(calc("\t 7\u{a0}/\n7 ").as_deref(), Ok("1"));
        assert_eq!(calc("10 - 4 - 3").as_deref(), Ok("3"), "left-associative");
        assert_eq!(calc("64 / 4 / 2").as_deref(), Ok("8"), "left-associative");
    }

    #[test]
    fn formatting() {
        assert_eq!(format_result(0.285714).as_deref(), Some("0.29"));
        assert_eq!(
            format_result(0.125).as_deref(),
            Some("0.13"),
            "half away from zero"
        );
        assert_eq!(format_result(-0.125).as_deref(), Some("-0.13"));
        assert_eq!(
            format_result(-0.001).as_deref(),
            Some("0"),
            "no negative zero"
        );
        assert_eq!(format_result(-0.0).as_deref(), Some("0"));
        assert_eq!(format_result(2.50).as_deref(), Some("2.5"));
        assert_eq!(
            format_result(1e20).as_deref(),
            Some("100000000000000000000")
        );
        assert_eq!(format_result(f64::INFINITY), None);
        assert_eq!(format_result(f64::NAN), None);
        // Exact on the stored value where value * 100 has lost the cents (values as a text
        // writes them, parsed to the nearest f64).
        let text = |t: &str| t.parse::<f64>().unwrap();
        assert_eq!(
            format_result(text("123456789012345.67")).as_deref(),
            Some("123456789012345.67") // stored as ...345.671875
        );
        assert_eq!(
            format_result(text("734141393493265.37")).as_deref(),
            Some("734141393493265.38") // stored as ...265.375: a tie, away from zero
        );
        assert_eq!(
            format_result(text("-999999999999999.9")).as_deref(),
            Some("-999999999999999.88") // stored as ...999.875
        );
        assert_eq!(
            format_result(text("1000000000000000.125")).as_deref(),
            Some("1000000000000000.13")
        );
        assert_eq!(
            format_result(text("4503599627370495.5")).as_deref(),
            Some("4503599627370495.5")
        );
        assert_eq!(format_result(0.005).as_deref(), Some("0.01")); // stored above 0.005
        assert_eq!(format_result(1.005).as_deref(), Some("1")); // stored below 1.005
        assert_eq!(format_result(5e-324).as_deref(), Some("0"));
        assert_eq!(format_result(-1e-300).as_deref(), Some("0"));
    }

    proptest::proptest! {
        /// Against exact decimal arithmetic: the stored value's decimal expansion (Rust prints
        /// it exactly) rounded half away from zero by hand.
        #[test]
        fn rounding_is_exact_half_away_from_zero(value in proptest::prop_oneof![
            -1e3..1e3f64,
            -1e16..1e16f64,
            // Three decimals, many of them near a tie ("x.xx5").
            (-10_000_000_000i64..10_000_000_000).prop_map(|m| m as f64 / 1000.0),
            proptest::num::f64::NORMAL.prop_map(|v| v % 1e17),
        ]) {
            let exact = format!("{:.1100}", value.abs());
            let (int, frac) = exact.split_once('.').unwrap();
            let mut cents: u128 = format!("{int}{}", &frac[..2]).parse().unwrap();
            if frac.as_bytes()[2] >= b'5' {
                cents += 1;
            }
            let sign = if value < 0.0 && cents > 0 { "-" } else { "" };
            let mut want = format!("{sign}{}.{:02}", cents / 100, cents % 100);
            while want.ends_with('0') {
                want.pop();
            }
            if want.ends_with('.') {
                want.pop();
            }
            proptest::prop_assert_eq!(format_result(value), Some(want));
        }
    }

    #[test]
    fn failures() {
        assert!(matches!(calc("1/0"), Err(ToolError::Failed(_))));
        assert!(matches!(calc("1/(2-2)"), Err(ToolError::Failed(_))));
        assert!(matches!(calc("1/-0"), Err(ToolError::Failed(_))));
        // 200 bytes cannot spell a number past f64's range (no exponent or power), so the
        // range check is a safety net: exercise it directly.
        assert!(matches!(finite(f64::INFINITY), Err(ToolError::Failed(_))));
        assert!(matches!(finite(f64::NAN), Err(ToolError::Failed(_))));
        let huge = "9".repeat(66);
        let product = calc(&format!("{huge}*{huge}*{huge}")).unwrap();
        assert!(
            product.len() > 190 && product.starts_with("9999"),
            "{product}"
        );
        let tiny = format!("0.{}1", "0".repeat(95));
        assert_eq!(calc(&format!("{tiny}*{tiny}")).as_deref(), Ok("0"));
    }

    #[test]
    fn rejected_inputs_are_invalid_input() {
        let max_nesting = format!("{}1{}", "(".repeat(MAX_DEPTH), ")".repeat(MAX_DEPTH));
        assert_eq!(calc(&max_nesting).as_deref(), Ok("1"));
        for bad in [
            "",
            "   ",
            "2 ** 3",
            "2 ^ 3",
            "1e5",
            "5.",
            "1,40",
            "1234,567",
            "0,400",
            "00,400",
            "1,",
            ",5",
            "1..2",
            "2 3",
            "(1 + 2",
            "1 + 2)",
            "()",
            "+",
            "3 +",
            "abs(3)",
            "x + 1",
            "__import__('os').system('rm -rf /')",
            "1 + 1; 2",
            "２ + ２",
            "3 × 4",
            "1 = 1",
            &format!(
                "{}1{}",
                "(".repeat(MAX_DEPTH + 1),
                ")".repeat(MAX_DEPTH + 1)
            ),
            &format!("{}1", "-".repeat(MAX_DEPTH + 1)),
            &"1+".repeat(101),
            &"(".repeat(5000),
        ] {
            let got = calc(bad);
            assert!(
                matches!(got, Err(ToolError::InvalidInput(_))),
                "{bad:?} gave {got:?}"
            );
        }
    }

    #[test]
    fn errors_say_where() {
        let err = calc("2 + x").unwrap_err().to_string();
        assert!(err.contains("'x'") && err.contains("byte 4"), "{err}");
        let err = calc("(1 + 2").unwrap_err().to_string();
        assert!(err.contains("unclosed '(' at byte 0"), "{err}");
    }

    /// The reference: an expression tree, evaluated directly.
    #[derive(Debug, Clone)]
    enum Expr {
        Num(f64, String),
        Neg(Box<Expr>),
        Bin(char, Box<Expr>, Box<Expr>),
        Paren(Box<Expr>),
    }

    fn reference_eval(e: &Expr) -> Option<f64> {
        let v = match e {
            Expr::Num(v, _) => *v,
            Expr::Neg(x) => -reference_eval(x)?,
            Expr::Paren(x) => reference_eval(x)?,
            Expr::Bin(op, a, b) => {
                let (a, b) = (reference_eval(a)?, reference_eval(b)?);
                match op {
                    '+' => a + b,
                    '-' => a - b,
                    '*' => a * b,
                    _ if b == 0.0 => return None,
                    _ => a / b,
                }
            }
        };
        v.is_finite().then_some(v)
    }

    fn prec(op: char) -> u8 {
        if op == '+' || op == '-' {
            1
        } else {
            2
        }
    }

    /// Renders with just the parentheses the tree needs (plus the explicit Paren nodes).
    fn render(e: &Expr, out: &mut String) {
        match e {
            Expr::Num(_, text) => out.push_str(text),
            Expr::Paren(x) => {
                out.push('(');
                render(x, out);
                out.push(')');
            }
            Expr::Neg(x) => {
                out.push('-');
                render_wrapped(x, matches!(**x, Expr::Bin(..)), out);
            }
            Expr::Bin(op, a, b) => {
                let left_wrap = matches!(**a, Expr::Bin(o, ..) if prec(o) < prec(*op));
                // Same precedence on the right changes f64 evaluation order: wrap.
                let right_wrap = matches!(**b, Expr::Bin(o, ..) if prec(o) <= prec(*op));
                render_wrapped(a, left_wrap, out);
                out.push(' ');
                out.push(*op);
                out.push(' ');
                render_wrapped(b, right_wrap, out);
            }
        }
    }

    fn render_wrapped(e: &Expr, wrap: bool, out: &mut String) {
        if wrap {
            out.push('(');
        }
        render(e, out);
        if wrap {
            out.push(')');
        }
    }

    fn number() -> impl Strategy<Value = Expr> {
        (
            0u64..2_000_000,
            proptest::option::of(0u32..1000),
            any::<bool>(),
        )
            .prop_map(|(int, frac, commas)| {
                let frac_text = frac.map(|f| format!(".{f:03}")).unwrap_or_default();
                let value: f64 = format!("{int}{frac_text}").parse().unwrap();
                let int_text = if commas {
                    let digits = int.to_string();
                    let mut grouped = String::new();
                    for (i, c) in digits.chars().enumerate() {
                        if i > 0 && (digits.len() - i) % 3 == 0 {
                            grouped.push(',');
                        }
                        grouped.push(c);
                    }
                    grouped
                } else {
                    int.to_string()
                };
                Expr::Num(value, format!("{int_text}{frac_text}"))
            })
    }

    fn expr() -> impl Strategy<Value = Expr> {
        number().prop_recursive(5, 24, 2, |inner| {
            prop_oneof![
                inner.clone().prop_map(|e| Expr::Neg(Box::new(e))),
                inner.clone().prop_map(|e| Expr::Paren(Box::new(e))),
                (
                    prop_oneof![Just('+'), Just('-'), Just('*'), Just('/')],
                    inner.clone(),
                    inner
                )
                    .prop_map(|(op, a, b)| Expr::Bin(op, Box::new(a), Box::new(b))),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn agrees_with_reference(e in expr()) {
            let mut text = String::new();
            render(&e, &mut text);
            let got = evaluate(&text);
            if text.len() > MAX_INPUT_LEN {
                prop_assert!(matches!(got, Err(ToolError::InvalidInput(_))));
            } else {
                match reference_eval(&e) {
                    Some(want) => prop_assert_eq!(got, Ok(want), "{}", text),
                    None => prop_assert!(matches!(got, Err(ToolError::Failed(_))), "{}: {:?}", text, got),
                }
            }
        }

        #[test]
        fn arbitrary_strings_never_panic(s in "\\PC{0,300}") {
            let _ = calc(&s);
        }

        #[test]
        fn operator_soup_never_panics(s in "[0-9 .,()+*/\\-]{0,250}") {
            match calc(&s) {
                Ok(text) => prop_assert!(!text.is_empty()),
                Err(ToolError::Timeout { .. }) => prop_assert!(false, "calculator cannot time out"),
                Err(_) => {}
            }
        }
    }
}
