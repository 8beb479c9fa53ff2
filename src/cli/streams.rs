//! What the commands share about their files and streams: `-` for standard input or output,
//! the checks before a model loads, resuming, and the exit status.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};

/// Writes a command's result to stdout. A reader that has gone (`| head -1`) ends the output
/// quietly, as a closed pipe ends any Unix tool's; other write errors are errors.
pub(crate) fn emit(text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

/// `-` as a path: standard input for `--input`, standard output for `--output`, as Unix filters
/// take it (neither can be locked, resumed from or read twice).
pub(crate) fn is_std_stream(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// A path as messages name it: `<stdin>` or `<stdout>` for `-`.
pub(crate) fn stream_name(path: &Path, std_name: &str) -> String {
    if is_std_stream(path) {
        std_name.to_string()
    } else {
        path.display().to_string()
    }
}

/// `--resume` goes on from an output file, after checking it against a re-readable input.
pub(crate) fn refuse_resume_on_std_streams<'a>(
    resume: bool,
    paths: impl IntoIterator<Item = &'a PathBuf>,
) -> Result<()> {
    if resume && paths.into_iter().any(|p| is_std_stream(p)) {
        anyhow::bail!(
            "--resume checks the output an earlier run wrote against the input, so both must be \
             files, not `-` (standard input or output)"
        );
    }
    Ok(())
}

/// Checks `--input` and `--output` before the model is loaded (minutes for a 6B checkpoint) and
/// before the output is created (which empties it): the input must not be a folder (it would
/// open, then fail on the first read), the output must be neither the input file nor a file of
/// the model folder (through any path), and its folder must exist.
pub(crate) fn check_io(
    input: Option<&Path>,
    output: Option<&Path>,
    model_dir: Option<&Path>,
) -> Result<()> {
    use toolsift::util::fs::is_same_file;
    if let Some(input) = input {
        let meta = std::fs::metadata(input).with_context(|| format!("{}", input.display()))?;
        if meta.is_dir() {
            anyhow::bail!("{}: is a folder; give a JSONL file", input.display());
        }
        if output.is_some_and(|output| is_same_file(input, output)) {
            anyhow::bail!(
                "{}: the output is the input file; writing it would destroy the input",
                input.display()
            );
        }
    }
    let Some(output) = output else {
        return Ok(());
    };
    if let Some(problem) = toolsift::util::fs::folder_problem(output) {
        anyhow::bail!(
            "{}: {problem}; give a file name for the output",
            output.display()
        );
    }
    if let Some(dir) = output.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.is_dir() {
            anyhow::bail!(
                "{}: the output's folder {} does not exist",
                output.display(),
                dir.display()
            );
        }
    }
    if let Some(model_dir) = model_dir {
        // Not an error here if the folder cannot be listed: the model load says why.
        for entry in std::fs::read_dir(model_dir).into_iter().flatten().flatten() {
            if is_same_file(&entry.path(), output) {
                anyhow::bail!(
                    "{}: is {}, a file of the model folder; writing it would destroy the model",
                    output.display(),
                    entry.path().display()
                );
            }
        }
    }
    Ok(())
}

/// With `--resume`, where an earlier run's `output` leaves off (None: no output yet, or no
/// `--resume`); said on stderr.
pub(crate) fn resume_point(
    resume: bool,
    input: &Path,
    output: &Path,
    answer_key: &str,
) -> Result<Option<toolsift::util::jsonl::ResumePoint>> {
    if !resume {
        return Ok(None);
    }
    let point = toolsift::util::jsonl::resume_point(input, output, answer_key)?;
    // The output exists by now (locking creates it), so an empty one is a fresh start.
    match point {
        Some(p) if p.lines > 0 => note!(
            "resuming: {} lines of {} already answered",
            p.lines,
            output.display()
        ),
        _ => note!(
            "resuming: {} holds no answered line yet; starting from the first",
            output.display()
        ),
    }
    Ok(point)
}

/// Whether a run into stdout ended because its reader went away.
pub(crate) fn is_broken_pipe<T>(result: &toolsift::Result<T>) -> bool {
    matches!(result, Err(toolsift::Error::Io { error, .. })
        if error.kind() == std::io::ErrorKind::BrokenPipe)
}

/// The exit status of a `score` or `generate` run that wrote every line but some failed: not
/// 1, which a run that stopped (an unreadable input, a model that does not load, a full disk)
/// exits with, nor clap's 2 for a usage error.
pub(crate) const LINES_FAILED: u8 = 3;

/// [`LINES_FAILED`] when a line of the output failed, in this run or in the earlier one it
/// resumed (said, since this run's summary does not count those).
pub(crate) fn exit_status(
    failed_now: usize,
    resume_at: Option<toolsift::util::jsonl::ResumePoint>,
) -> ExitCode {
    let failed_before = resume_at.map_or(0, |p| p.failed);
    if failed_before > 0 {
        note!("the run this one resumed failed on {failed_before} of the output's lines");
    }
    if failed_now + failed_before > 0 {
        ExitCode::from(LINES_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

/// What a signal that ends the run prints (annotate and generate watch for them, on Unix).
pub(crate) fn set_stop_note(note: String) {
    #[cfg(unix)]
    toolsift::annotate::tools::set_stop_note(note);
    #[cfg(not(unix))]
    let _ = note;
}
