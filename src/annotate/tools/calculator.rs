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
//! [`MAX_DEPTH`] deep.
//!
//! Arithmetic is exact: every accepted number is a finite decimal, and `+ - * /` keep values
//! rational, so they are computed as fractions of 128-bit integers ([`Rational`]), with no
//! binary rounding anywhere (`123,456,789 * 987,654,321` is 121932631112635269, and
//! `9007199254740993 - 9007199254740992` is 1, where f64 gives ...264 and 0). Division by zero,
//! and a numerator or denominator past 128 bits (about 38 digits), are [`ToolError::Failed`].
//!
//! The result is rounded to two decimals, half away from zero on the exact value (a text's
//! 5.35 / 2 is "2.68", 23 / 160 * 100 is "14.38", where rounding the nearest binary value
//! would give 2.67 and 14.37), then trailing zeros and a trailing dot are dropped, as in the
//! paper's examples: 400/1400 → "0.29", 1400 → "1400", 27/2 → "13.5"; negative zero prints as
//! "0". See [`format_result`].

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
        Ok(format_result(evaluate(input)?))
    }
}

/// An exact rational number `num / den`, `den > 0`, in lowest terms: what the calculator
/// computes with. Operations return None when a numerator or denominator would pass i128.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rational {
    num: i128,
    den: i128,
}

impl Rational {
    /// `num / den` in lowest terms; None for a zero denominator (or one that cannot be made
    /// positive).
    pub fn new(num: i128, den: i128) -> Option<Self> {
        if den == 0 {
            return None;
        }
        let (num, den) = if den < 0 {
            (num.checked_neg()?, den.checked_neg()?)
        } else {
            (num, den)
        };
        // g divides den, so it fits i128; g >= 1 as den >= 1.
        let g = gcd(num.unsigned_abs(), den.unsigned_abs()) as i128;
        Some(Rational {
            num: num / g,
            den: den / g,
        })
    }

    pub fn integer(n: i128) -> Self {
        Rational { num: n, den: 1 }
    }

    pub fn numerator(self) -> i128 {
        self.num
    }

    pub fn denominator(self) -> i128 {
        self.den
    }

    /// The nearest f64 (for display; the calculator never computes with it).
    pub fn to_f64(self) -> f64 {
        self.num as f64 / self.den as f64
    }

    pub fn checked_neg(self) -> Option<Self> {
        Some(Rational {
            num: self.num.checked_neg()?,
            den: self.den,
        })
    }

    /// Over the least common denominator, so that values of one scale (cents, thousandths)
    /// never multiply their denominators.
    pub fn checked_add(self, o: Self) -> Option<Self> {
        let g = gcd(self.den.unsigned_abs(), o.den.unsigned_abs()) as i128;
        let (b, d) = (self.den / g, o.den / g);
        let num = self
            .num
            .checked_mul(d)?
            .checked_add(o.num.checked_mul(b)?)?;
        Rational::new(num, b.checked_mul(o.den)?)
    }

    pub fn checked_sub(self, o: Self) -> Option<Self> {
        self.checked_add(o.checked_neg()?)
    }

    /// Cross-reduced first, so that only the result's own size can overflow.
    pub fn checked_mul(self, o: Self) -> Option<Self> {
        let g1 = gcd(self.num.unsigned_abs(), o.den.unsigned_abs()) as i128;
        let g2 = gcd(o.num.unsigned_abs(), self.den.unsigned_abs()) as i128;
        let num = (self.num / g1).checked_mul(o.num / g2)?;
        let den = (self.den / g2).checked_mul(o.den / g1)?;
        Rational::new(num, den)
    }

    /// None for a zero divisor too (the caller tells that case apart).
    pub fn checked_div(self, o: Self) -> Option<Self> {
        self.checked_mul(Rational::new(o.den, o.num)?)
    }
}

/// Greatest common divisor; gcd(0, b) = b.
fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

fn too_large() -> ToolError {
    ToolError::Failed(
        "too many digits for exact arithmetic (a numerator or denominator past 38 digits)".into(),
    )
}

/// Formats `value` rounded to two decimals (half away from zero, exactly) with trailing zeros
/// removed.
pub fn format_result(value: Rational) -> String {
    if value.den == 1 {
        return value.num.to_string();
    }
    let (n, d) = (value.num.unsigned_abs(), value.den.unsigned_abs());
    let (mut whole, rem) = (n / d, n % d);
    // Two decimal digits by long division, then the rest against half: exact for any
    // denominator (no product of the remainder can overflow, `tenfold`).
    let (tens, rem) = tenfold(rem, d);
    let (units, rem) = tenfold(rem, d);
    let mut cents = 10 * tens + units;
    // A tie (rem == d / 2 exactly) goes away from zero.
    if rem >= d - rem {
        cents += 1;
        if cents == 100 {
            // whole < i128::MAX: no overflow.
            (whole, cents) = (whole + 1, 0);
        }
    }
    let sign = if value.num < 0 && (whole > 0 || cents > 0) {
        "-"
    } else {
        ""
    };
    let mut text = format!("{sign}{whole}.{cents:02}");
    while text.ends_with('0') {
        text.pop();
    }
    if text.ends_with('.') {
        text.pop();
    }
    text
}

/// `(10 r) / d` and `(10 r) % d` for `r < d <= i128::MAX`, adding `r` ten times modulo `d`:
/// every sum stays below 2d, within u128, where `10 r` itself may not be.
fn tenfold(r: u128, d: u128) -> (u128, u128) {
    let (mut digit, mut acc) = (0, 0u128);
    for _ in 0..10 {
        if acc >= d - r {
            (digit, acc) = (digit + 1, acc - (d - r));
        } else {
            acc += r;
        }
    }
    (digit, acc)
}

/// Parses and evaluates `input`; see the module docs for what is accepted.
pub fn evaluate(input: &str) -> Result<Rational, ToolError> {
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
        input,
        tokens: &tokens,
        pos: 0,
        depth: 0,
        end: input.len(),
    };
    let value = parser.expr()?;
    if let Some(tok) = parser.peek() {
        return Err(invalid(format!(
            "unexpected {} at byte {}",
            tok.describe(input),
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
    Num(Rational),
    Plus,
    Minus,
    Star,
    Slash,
    Open,
    Close,
}

impl Token {
    /// The token for an error message: a number as written in `input` (its value printed
    /// through f64 would not be what the input says).
    fn describe(&self, input: &str) -> String {
        match self.kind {
            Kind::Num(_) => format!("number {}", &input[self.at..self.end]),
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
    /// Byte offset after it.
    end: usize,
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
                    end: next,
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
        tokens.push(Token {
            kind,
            at: i,
            end: i + 1,
        });
        i += 1;
    }
    Ok(tokens)
}

/// Reads the number starting at byte `start`; returns its value and the byte after it.
fn lex_number(input: &str, start: usize) -> Result<(Rational, usize), ToolError> {
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
    // The digits over 10^(digits after the dot), less the dot's trailing zeros ("2.50" is 25/10):
    // "1.000..." with 40 zeros is 1, not a denominator past i128.
    let (int, frac) = plain.split_once('.').unwrap_or((&plain, ""));
    let frac = frac.trim_end_matches('0');
    // A leading 0: ".0" leaves no digit otherwise.
    let digits = format!("0{int}{frac}");
    let num = digits.parse::<i128>().map_err(|_| too_large())?;
    let den = 10i128
        .checked_pow(frac.len() as u32)
        .ok_or_else(too_large)?;
    let value = Rational::new(num, den).ok_or_else(too_large)?;
    Ok((value, i))
}

struct Parser<'t> {
    input: &'t str,
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
    fn expr(&mut self) -> Result<Rational, ToolError> {
        let mut acc = self.term()?;
        while let Some(tok) = self.peek() {
            let op = tok.kind;
            if op != Kind::Plus && op != Kind::Minus {
                break;
            }
            self.pos += 1;
            let rhs = self.term()?;
            acc = if op == Kind::Plus {
                acc.checked_add(rhs)
            } else {
                acc.checked_sub(rhs)
            }
            .ok_or_else(too_large)?;
        }
        Ok(acc)
    }

    /// term := unary (('*' | '/') unary)*
    fn term(&mut self) -> Result<Rational, ToolError> {
        let mut acc = self.unary()?;
        while let Some(tok) = self.peek() {
            let op = tok.kind;
            if op != Kind::Star && op != Kind::Slash {
                break;
            }
            self.pos += 1;
            let rhs = self.unary()?;
            acc = if op == Kind::Star {
                acc.checked_mul(rhs)
            } else if rhs.num == 0 {
                return Err(ToolError::Failed("division by zero".into()));
            } else {
                acc.checked_div(rhs)
            }
            .ok_or_else(too_large)?;
        }
        Ok(acc)
    }

    /// unary := ('+' | '-') unary | '(' expr ')' | number
    fn unary(&mut self) -> Result<Rational, ToolError> {
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
                                other.describe(self.input)
                            )))
                        }
                        None => {
                            return Err(invalid(format!("unclosed '(' at byte {}", tok.at)));
                        }
                    }
                } else {
                    let operand = self.unary()?;
                    if tok.kind == Kind::Minus {
                        operand.checked_neg().ok_or_else(too_large)?
                    } else {
                        operand
                    }
                };
                self.depth -= 1;
                Ok(value)
            }
            _ => Err(invalid(format!(
                "unexpected {} at byte {}: expected a number or '('",
                tok.describe(self.input),
                tok.at
            ))),
        }
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
        for (input, want) in [
            ("2 / 7", "0.29"),
            ("1 / 8", "0.13"), // half away from zero
            ("-1 / 8", "-0.13"),
            ("-1 / 1000", "0"), // no negative zero
            ("0 * -1", "0"),
            ("2.50", "2.5"),
            ("1 / 3", "0.33"),
            ("2 / 3", "0.67"),
            ("-2 / 3", "-0.67"),
            ("100000000000000000000", "100000000000000000000"),
            // Ties of the exact value, which the nearest binary value would round down.
            ("5.35 / 2", "2.68"),
            ("23 / 160 * 100", "14.38"),
            ("1.005", "1.01"),
            ("2.675", "2.68"),
            ("-2.675", "-2.68"),
            // Past 2^53, where f64 arithmetic is not exact.
            ("123,456,789 * 987,654,321", "121932631112635269"),
            ("9007199254740993 - 9007199254740992", "1"),
            ("1000000000000000.12 + 0", "1000000000000000.12"),
            ("734141393493265.375", "734141393493265.38"),
            ("-999999999999999.9", "-999999999999999.9"),
            // The largest values: 38 digits, and the cents of a 35-digit whole part.
            (
                "99999999999999999999999999999999999999",
                "99999999999999999999999999999999999999",
            ),
            (
                "99999999999999999999999999999999999.995",
                "100000000000000000000000000000000000",
            ),
            (
                "9999999999999999999999999999999999999 + 0.5",
                "9999999999999999999999999999999999999.5",
            ),
            (
                "-99999999999999999999999999999999999 - 0.995",
                "-100000000000000000000000000000000000",
            ),
            // A denominator near 2^122, where 100 times a remainder does not fit 128 bits.
            ("1 / 5474401089420219382077155933569751763", "0"),
            (
                "5474401089420219382077155933569751762 / 5474401089420219382077155933569751763",
                "1",
            ),
            ("-1 / 3 * 2", "-0.67"),
        ] {
            assert_eq!(calc(input).as_deref(), Ok(want), "{input}");
        }
    }

    proptest::proptest! {
        /// a / b against cents computed another way: floor((200 |a| + |b|) / (2 |b|)), exact in
        /// 128 bits for 64-bit a and b.
        #[test]
        fn quotients_round_exactly_half_away_from_zero(
            a in proptest::prop_oneof![-2000i64..2000, any::<i64>()],
            b in proptest::prop_oneof![1i64..2000, -2000i64..-1, any::<i64>()],
        ) {
            proptest::prop_assume!(b != 0);
            let (n, d) = (i128::from(a).unsigned_abs(), i128::from(b).unsigned_abs());
            let cents = (200 * n + d) / (2 * d);
            let negative = (a < 0) != (b < 0);
            let sign = if negative && cents > 0 { "-" } else { "" };
            let mut want = format!("{sign}{}.{:02}", cents / 100, cents % 100);
            while want.ends_with('0') {
                want.pop();
            }
            if want.ends_with('.') {
                want.pop();
            }
            let got = calc(&format!("{a} / {b}")).unwrap();
            proptest::prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn failures() {
        assert!(matches!(calc("1/0"), Err(ToolError::Failed(_))));
        assert!(matches!(calc("1/(2-2)"), Err(ToolError::Failed(_))));
        assert!(matches!(calc("1/-0"), Err(ToolError::Failed(_))));
        // Past 128 bits: a literal, a product, a decimal with too many places.
        let huge = "9".repeat(66);
        for input in [
            huge.clone(),
            format!("{huge}*{huge}*{huge}"),
            "99999999999999999999 * 99999999999999999999".into(),
            format!("0.{}1", "0".repeat(95)),
        ] {
            let got = calc(&input);
            assert!(
                matches!(&got, Err(ToolError::Failed(m)) if m.contains("too many digits")),
                "{input}: {got:?}"
            );
        }
        // Trailing zeros after the dot are not places that count.
        let one = format!("1.{}", "0".repeat(60));
        assert_eq!(calc(&format!("{one} + 0.50")).unwrap(), "1.5");
        assert_eq!(calc(".0 + 1").unwrap(), "1");
        assert_eq!(calc(".00").unwrap(), "0");
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
        // A number is named as written, not as f64 prints its value.
        for (input, named) in [
            (
                "1 12345678901234567890123",
                "unexpected number 12345678901234567890123 at byte 2",
            ),
            ("(1 2,400.50)", "found number 2,400.50"),
            ("* 0.10", "unexpected '*' at byte 0"),
        ] {
            let err = calc(input).unwrap_err().to_string();
            assert!(err.contains(named), "{input}: {err}");
        }
    }

    /// The reference: an expression tree, evaluated directly.
    #[derive(Debug, Clone)]
    enum Expr {
        /// numerator, denominator (a power of ten), as written.
        Num(i128, i128, String),
        Neg(Box<Expr>),
        Bin(char, Box<Expr>, Box<Expr>),
        Paren(Box<Expr>),
    }

    /// What the reference makes of an expression.
    #[derive(Debug, PartialEq)]
    enum Reference {
        /// The exact value, as (numerator, denominator) in lowest terms, denominator > 0.
        Value(i128, i128),
        DivisionByZero,
        /// The schoolbook formulas (a/b + c/d = (ad + cb) / bd, no cross-reduction) passed
        /// i128: the calculator may or may not manage.
        Overflow,
    }

    /// Schoolbook fractions, reduced after each operation (by a gcd of its own).
    fn reference_eval(e: &Expr) -> Reference {
        fn reduce(n: i128, d: i128) -> Reference {
            let (mut a, mut b) = (n.unsigned_abs(), d.unsigned_abs());
            while b != 0 {
                (a, b) = (b, a % b);
            }
            let g = a as i128;
            let sign = if d < 0 { -1 } else { 1 };
            Reference::Value(sign * n / g, sign * d / g)
        }
        let value = |e| match reference_eval(e) {
            Reference::Value(n, d) => Ok((n, d)),
            other => Err(other),
        };
        let result = (|| {
            Ok(match e {
                Expr::Num(n, d, _) => reduce(*n, *d),
                Expr::Paren(x) => reference_eval(x),
                Expr::Neg(x) => {
                    let (n, d) = value(x)?;
                    reduce(-n, d)
                }
                Expr::Bin(op, a, b) => {
                    let ((p, q), (r, s)) = (value(a)?, value(b)?);
                    let of = |v: Option<i128>| v.ok_or(Reference::Overflow);
                    match op {
                        '+' | '-' => {
                            let r = if *op == '-' { -r } else { r };
                            let n = of(of(p.checked_mul(s))?.checked_add(of(r.checked_mul(q))?))?;
                            reduce(n, of(q.checked_mul(s))?)
                        }
                        '*' => reduce(of(p.checked_mul(r))?, of(q.checked_mul(s))?),
                        _ if r == 0 => Reference::DivisionByZero,
                        _ => reduce(of(p.checked_mul(s))?, of(q.checked_mul(r))?),
                    }
                }
            })
        })();
        result.unwrap_or_else(|e| e)
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
            Expr::Num(_, _, text) => out.push_str(text),
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
                // Same precedence on the right changes the meaning of - and /: wrap.
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
                let (num, den) = match frac {
                    Some(f) => (i128::from(int) * 1000 + i128::from(f), 1000),
                    None => (i128::from(int), 1),
                };
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
                Expr::Num(num, den, format!("{int_text}{frac_text}"))
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
                // The calculator cross-reduces, so it manages whatever the schoolbook does.
                match reference_eval(&e) {
                    Reference::Value(n, d) => {
                        let got = got.map(|v| (v.numerator(), v.denominator()));
                        prop_assert_eq!(got, Ok((n, d)), "{}", text)
                    }
                    Reference::DivisionByZero => prop_assert!(
                        matches!(&got, Err(ToolError::Failed(m)) if m.contains("division by zero")),
                        "{}: {:?}", text, got
                    ),
                    Reference::Overflow => prop_assert!(
                        matches!(got, Ok(_) | Err(ToolError::Failed(_))), "{}: {:?}", text, got
                    ),
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
