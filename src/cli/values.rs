//! clap value parsers: a flag's value checked where it is parsed, so a bad one is a usage
//! error that names the flag.

use std::path::PathBuf;

/// A size in MiB: at least 1, and small enough to count in bytes.
pub(crate) fn mebibytes(s: &str) -> std::result::Result<usize, String> {
    let v = at_least_one(s)?;
    v.checked_mul(1 << 20)
        .map(|_| v)
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
