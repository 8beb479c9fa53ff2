//! clap value parsers: a flag's value checked where it is parsed, so a bad one is a usage
//! error that names the flag.

use std::path::PathBuf;

/// A size given in MiB (at least 1), as bytes: converted where it is parsed, so no caller
/// shifts it.
pub(crate) fn mebibytes(s: &str) -> std::result::Result<usize, String> {
    at_least_one(s)?
        .checked_mul(1 << 20)
        .ok_or_else(|| "too large".to_string())
}

/// A count that must be at least 1.
pub(crate) fn at_least_one(s: &str) -> std::result::Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(v) => Ok(v),
        Err(e) => Err(e.to_string()),
    }
}

/// eval-demo's set size: 1 to 100,000 documents (the set is generated in memory; 100,000 take a
/// few hours to annotate on a CPU).
pub(crate) fn eval_docs(s: &str) -> std::result::Result<usize, String> {
    match at_least_one(s)? {
        v if v <= 100_000 => Ok(v),
        _ => Err("must be at most 100000".into()),
    }
}

/// One of `--weights`' numbers. The flag takes values that start with a hyphen (`-1,2` reaches
/// the weights' own check, which names the weight); a flag is not a number, so
/// `--weights --reference` says the list is missing, not that "--reference" is a bad float.
pub(crate) fn weight(s: &str) -> std::result::Result<f64, String> {
    if s.starts_with("--") {
        return Err(format!(
            "expected a number, got the flag {s}: give the weights right after \
                            --weights (--weights 1,0.5)"
        ));
    }
    s.parse::<f64>().map_err(|e| e.to_string())
}

/// A C* output of annotate or merge: a file, since its rejects, summary (and journal) go next to
/// it, so `-` is not standard output here as it is for score; it is refused rather than written
/// as a file named `-` (`./-` is that file).
pub(crate) fn output_file(s: &str) -> std::result::Result<PathBuf, String> {
    if s == "-" {
        return Err(
            "C* is written to a file, with its rejects and summary next to it, not to \
                    standard output (a file named - is ./-)"
                .into(),
        );
    }
    Ok(PathBuf::from(s))
}

/// A float flag that must be a finite number (NaN would compare false everywhere).
pub(crate) fn finite_f64(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err("must be a finite number".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A sampling temperature: finite and not negative.
pub(crate) fn temperature(s: &str) -> std::result::Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        // "1e39" parses, as f32's infinity.
        Ok(_) => Err("must be a number >= 0 within f32's range, at most 3.4e38 (0: greedy)".into()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each parser's bounds, at and one past them: what a usage error is refused for.
    #[test]
    fn counts_are_refused_outside_their_bounds() {
        assert_eq!(at_least_one("1"), Ok(1));
        assert_eq!(at_least_one("0").unwrap_err(), "must be at least 1");
        assert!(at_least_one("-1").is_err() && at_least_one("1.5").is_err());
        assert_eq!(mebibytes("1"), Ok(1 << 20));
        assert_eq!(mebibytes("3"), Ok(3 << 20));
        assert_eq!(
            mebibytes(&(usize::MAX >> 20).to_string()),
            Ok((usize::MAX >> 20) << 20)
        );
        assert_eq!(
            mebibytes(&((usize::MAX >> 20) + 1).to_string()).unwrap_err(),
            "too large"
        );
        assert_eq!(mebibytes("0").unwrap_err(), "must be at least 1");
        assert_eq!(eval_docs("100000"), Ok(100_000));
        assert_eq!(eval_docs("100001").unwrap_err(), "must be at most 100000");
        assert_eq!(eval_docs("0").unwrap_err(), "must be at least 1");
    }

    /// `--tau-f` and the weights take negative numbers; a flag where a weight belongs is named
    /// as a flag; NaN and infinities are no threshold.
    #[test]
    fn numbers_are_finite_and_flags_are_not_numbers() {
        assert_eq!(finite_f64("-0.5"), Ok(-0.5));
        for bad in ["nan", "inf", "-inf", "1e309"] {
            assert_eq!(
                finite_f64(bad).unwrap_err(),
                "must be a finite number",
                "{bad}"
            );
        }
        assert_eq!(weight("-1"), Ok(-1.0));
        let err = weight("--reference").unwrap_err();
        assert!(err.contains("got the flag --reference"), "{err}");
        assert!(weight("x").is_err());
    }

    /// 0 is greedy decoding, and accepted; a negative temperature or one past f32's range is
    /// not.
    #[test]
    fn temperatures_are_finite_and_not_negative() {
        assert_eq!(temperature("0"), Ok(0.0));
        assert_eq!(temperature("3.4e38"), Ok(3.4e38));
        for bad in ["-0.1", "1e39", "nan", "inf"] {
            assert!(temperature(bad).unwrap_err().contains(">= 0"), "{bad}");
        }
    }

    /// `-` is no C* output (its rejects and summary go next to it); `./-` is the file named -.
    #[test]
    fn a_cstar_output_is_a_file() {
        assert!(output_file("-").unwrap_err().contains("./-"));
        assert_eq!(output_file("./-"), Ok(PathBuf::from("./-")));
    }
}
