//! `toolsift merge`: the outputs of every shard of one run joined into one C* and one rejects
//! file, in input-line order, by a streaming k-way merge (docs/annotate.md, docs/scaling.md).

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::document::CStarRecord;
use super::shard::Shard;
use super::summary::Summary;
use super::writer::{self, OutputKind, OutputPaths};
use crate::error::{Error, Result};
use crate::util::fs::{
    is_same_file, output_file_problem, remove_if_exists, strip_ext, with_suffix, AtomicFile,
};
use crate::util::jsonl::JsonlLines;

/// The largest summary.json a merge reads, in bytes. A run's is a few KB, its examples' calls
/// included (a command tool's result can be 1 MiB, and each tool keeps six); a larger file is
/// refused unread.
const MAX_SUMMARY_BYTES: u64 = 256 << 20;

/// What `merge` joined.
#[derive(Debug, Clone, PartialEq)]
pub struct MergeReport {
    /// C* lines written to the merged C* (annotated documents of every shard).
    pub documents: u64,
    /// Lines written to the merged rejects file.
    pub rejects: u64,
    /// The shards joined (all of them: a missing one is an error).
    pub shards: u64,
    /// The corpus's line count; every line is in exactly one output.
    pub corpus_lines: u64,
    /// The shards' summaries joined (`Summary::merge_shards`), as written beside the merged C*.
    pub summary: Summary,
}

/// Joins the outputs of every shard of one run into one C* in input-line order, their rejects
/// into `<out stem>.rejects.jsonl` and their summaries into `<out stem>.summary.json`, each
/// written atomically: the rejects, then C*, then the summary; an earlier summary there is
/// removed before them, so a summary beside the merged C* always describes it. Each input is a
/// C* file (`*.shard-I-of-C.jsonl`); its rejects and summary are read from beside it (a rejects
/// or summary file given as an input too, as a shell glob may, is skipped). The summaries say
/// which shard each output is and how many lines the corpus has: a missing or repeated shard, a
/// line in two outputs or in none is an error, and nothing is written then; so are shards whose
/// runs had other settings (config, tools, corpus content, model content, device; not the
/// paths' spellings: `run_differences`), and a rejects file or summary at `out`'s names that is
/// not toolsift's. Streams: memory does not grow with the corpus, but every shard's C* (and its
/// rejects, when not empty) is open at once.
pub fn merge(out: &Path, inputs: &[PathBuf]) -> Result<MergeReport> {
    if let Some(problem) = output_file_problem(out) {
        return Err(Error::input(format!(
            "output {} (--out) {problem}: give a file name for the merged C*",
            out.display()
        )));
    }
    let outputs = merge_inputs(inputs)?;
    let shards = check_shards(&outputs)?;
    let out_paths = check_merge_outputs(out, &outputs)?;
    write_merged(out, &out_paths, outputs, &shards)
}

/// What the inputs of a merge are, once checked to be every shard of one run.
struct ShardSet {
    /// Shards of the run.
    count: u64,
    /// Lines of the corpus the run annotated.
    corpus_lines: u64,
    /// Shard index -> its C*; a map, so that a corrupt count allocates nothing.
    cstar: BTreeMap<u64, PathBuf>,
}

/// Checks that `outputs` are every shard of one run, each once: refuses none at all, a shard
/// index past its count, runs with other settings, another shard count or corpus length, a
/// shard given twice, and a missing shard (naming what is where its output would be).
fn check_shards(outputs: &[MergeInput]) -> Result<ShardSet> {
    let Some(first) = outputs.first() else {
        return Err(Error::input("merge: no C* files given"));
    };
    let (count, corpus_lines) = (first.shard.count, first.corpus_lines);
    let mut seen = BTreeMap::new();
    for o in outputs {
        if o.shard.index >= o.shard.count {
            return Err(Error::input(format!(
                "{}: shard {}/{} is not a shard",
                o.paths.summary.display(),
                o.shard.index,
                o.shard.count
            )));
        }
        let differing = writer::run_differences(&first.run, &o.run);
        if !differing.is_empty() {
            return Err(Error::input(format!(
                "{} and {} come from runs with other settings (in their summaries, {}): not \
                 shards of one run",
                first.paths.out.display(),
                o.paths.out.display(),
                differing.join("; ")
            )));
        }
        if o.shard.count != count || o.corpus_lines != corpus_lines {
            return Err(Error::input(format!(
                "{} is shard {}/{} of a {}-line corpus, but {} is shard {}/{} of a {}-line \
                 corpus: not outputs of one run",
                o.paths.out.display(),
                o.shard.index,
                o.shard.count,
                o.corpus_lines,
                first.paths.out.display(),
                first.shard.index,
                count,
                corpus_lines
            )));
        }
        if let Some(other) = seen.insert(o.shard.index, o.paths.out.clone()) {
            return Err(Error::input(format!(
                "shard {}/{count} is given twice: {} and {}",
                o.shard.index,
                other.display(),
                o.paths.out.display()
            )));
        }
    }
    if seen.len() as u64 != count {
        let first_missing = (0..count).find(|i| !seen.contains_key(i)).unwrap_or(0);
        return Err(Error::input(format!(
            "{} of {count} shards missing, e.g. shard {first_missing}/{count}{} (merge needs \
             every shard's output)",
            count - seen.len() as u64,
            missing_shard_state(&first.paths.out, first.shard.index, first_missing, count)
        )));
    }
    Ok(ShardSet {
        count,
        corpus_lines,
        cstar: seen,
    })
}

/// Checks that the merge's output names (`out`'s C*, rejects and summary) are free to write,
/// and returns them. Refuses an input among them, a run in progress on `out`, a temporary name
/// that is another run's output, files there of another kind than the merge writes, and a C*
/// or run in progress on the other spelling of `out`: the merge would replace or strand files
/// that are not its own.
fn check_merge_outputs(out: &Path, outputs: &[MergeInput]) -> Result<OutputPaths> {
    let out_paths = OutputPaths::new(out);
    let written = [
        out_paths.out.clone(),
        out_paths.rejects.clone(),
        out_paths.summary.clone(),
        AtomicFile::tmp_path(&out_paths.out),
        AtomicFile::tmp_path(&out_paths.rejects),
        AtomicFile::tmp_path(&out_paths.summary),
    ];
    for o in outputs {
        for input in [&o.paths.out, &o.paths.rejects, &o.paths.summary] {
            // Compared as files, not spellings: "dir/../x" and a symlink are the same input.
            if let Some(w) = written.iter().find(|w| is_same_file(input, w)) {
                return Err(Error::input(format!(
                    "output {} (--out): writing {} would overwrite the input {}",
                    out.display(),
                    w.display(),
                    input.display()
                )));
            }
        }
    }

    // A run in progress on this --out would replace the merge's output when it finishes.
    if out_paths.journal.is_file() {
        return Err(Error::input(format!(
            "output {} (--out): a run on it is in progress (its journal {} exists); let it finish \
             or delete its journal, or give another output",
            out.display(),
            out_paths.journal.display()
        )));
    }
    if let Some(why) = out_paths.temporary_clash() {
        return Err(super::temporary_clash(out, &why));
    }
    // A merge replaces an earlier C* (a merge's or a run's), never a file of another kind.
    if let Some(what) = writer::not_a_cstar(&out_paths.out)? {
        return Err(Error::input(format!(
            "output {} (--out) exists and is not a C* file ({what}); merge would replace it: \
             give another output, or delete it first",
            out.display()
        )));
    }
    // Nor is a rejects file or summary of another kind: a user's file there is not replaced.
    for (path, kind) in [
        (&out_paths.rejects, OutputKind::Rejects),
        (&out_paths.summary, OutputKind::Summary),
    ] {
        if let Some(what) = writer::not_of_kind(path, kind)? {
            return Err(Error::input(format!(
                "output {} (--out): {} exists and is not a toolsift {} ({what}); merge would \
                 replace it: give another output, or delete it first",
                out.display(),
                path.display(),
                kind.name()
            )));
        }
    }
    // "x" and "x.jsonl" share their rejects and summary names: a C* (or a run in progress) of
    // the other spelling would be left beside rejects and a summary that are not its own.
    let other = out_paths.other_spelling();
    let other_cstar = other.out.is_file() && writer::not_a_cstar(&other.out)?.is_none();
    if let Some(there) = [
        (&other.out, other_cstar),
        (&other.journal, other.journal.is_file()),
    ]
    .into_iter()
    .find_map(|(p, held)| held.then_some(p))
    {
        return Err(Error::input(format!(
            "output {} (--out): {} exists, and its rejects and summary are the ones this merge \
             would write ({}, {}); delete it or give another output",
            out.display(),
            there.display(),
            out_paths.rejects.display(),
            out_paths.summary.display()
        )));
    }
    Ok(out_paths)
}

/// Writes the merged C*, rejects and summary (`out_paths`) from the checked shards `outputs`,
/// by a k-way merge; a line in two outputs, in none, out of order or past the corpus's end is
/// refused before any of the files is committed.
fn write_merged(
    out: &Path,
    out_paths: &OutputPaths,
    outputs: Vec<MergeInput>,
    shards: &ShardSet,
) -> Result<MergeReport> {
    let (count, corpus_lines) = (shards.count, shards.corpus_lines);
    // One stream per file; a k-way merge on the input line number.
    let mut streams = Vec::new();
    for o in &outputs {
        streams.push(MergeStream::open(&o.paths.out, o.shard, false)?);
        let rejects_len = std::fs::metadata(&o.paths.rejects)
            .map_err(|e| Error::io(&o.paths.rejects, e))?
            .len();
        if rejects_len > 0 {
            streams.push(MergeStream::open(&o.paths.rejects, o.shard, true)?);
        }
    }
    let mut heap = std::collections::BinaryHeap::new();
    for (k, s) in streams.iter_mut().enumerate() {
        if let Some(line) = s.advance()? {
            heap.push(std::cmp::Reverse((line, k)));
        }
    }
    // As annotate does: a fresh output folder is made.
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    // Again, just before writing: a run on a clashing name may have started since.
    if let Some(why) = out_paths.temporary_clash() {
        return Err(super::temporary_clash(out, &why));
    }
    let mut docs_file = AtomicFile::create(&out_paths.out)?;
    let mut rejects_file = AtomicFile::create(&out_paths.rejects)?;
    let (mut documents, mut rejects, mut next) = (0u64, 0u64, 1u64);
    while let Some(std::cmp::Reverse((line, k))) = heap.pop() {
        let s = &mut streams[k];
        if line != next || line > corpus_lines {
            let msg = if line < next {
                format!(
                    "input line {line} is in two outputs (the second: {})",
                    s.path.display()
                )
            } else if next <= corpus_lines {
                let owner = (next - 1) % count;
                // Later lines came first: `next` is missing, or comes after them there.
                format!(
                    "input line {next} is missing from its shard's output (shard \
                     {owner}/{count}, {}), or out of order there",
                    shards.cstar[&owner].display()
                )
            } else {
                format!(
                    "{}: input line {line} is beyond the corpus's {corpus_lines} lines",
                    s.path.display()
                )
            };
            return Err(Error::input(msg));
        }
        let (w, path) = if s.rejects {
            rejects += 1;
            (&mut rejects_file, &out_paths.rejects)
        } else {
            documents += 1;
            (&mut docs_file, &out_paths.out)
        };
        writeln!(w, "{}", s.current).map_err(|e| Error::io(path, e))?;
        next += 1;
        if let Some(line) = s.advance()? {
            heap.push(std::cmp::Reverse((line, k)));
        }
    }
    if next <= corpus_lines {
        let owner = (next - 1) % count;
        // Named as above: which shard's files lost their last lines (a cut copy, say).
        return Err(Error::input(format!(
            "input line {next} is missing from its shard's output (shard {owner}/{count}, {})",
            shards.cstar[&owner].display()
        )));
    }
    let shard_summaries: Vec<Summary> = outputs.into_iter().map(|o| o.summary).collect();
    let summary = Summary::merge_shards(&shard_summaries);
    // Gone before the new C* lands: a summary beside it is this merge's or none.
    remove_if_exists(&out_paths.summary)?;
    rejects_file.commit()?;
    docs_file.commit()?;
    writer::write_summary(&out_paths.summary, &summary)?;
    Ok(MergeReport {
        documents,
        rejects,
        shards: count,
        corpus_lines,
        summary,
    })
}

/// One shard's output as `merge` sees it.
struct MergeInput {
    paths: OutputPaths,
    shard: Shard,
    corpus_lines: u64,
    /// The run's settings less the shard (`Summary::run`).
    run: Value,
    summary: Summary,
}

/// The C* files among `inputs` with their summaries; rejects and summary files are skipped
/// when their C* file is among the inputs too.
fn merge_inputs(inputs: &[PathBuf]) -> Result<Vec<MergeInput>> {
    let given: std::collections::HashSet<&PathBuf> = inputs.iter().collect();
    let mut outputs = Vec::new();
    for path in inputs {
        if path.is_dir() {
            return Err(Error::input(format!(
                "{}: is a folder; give merge the shards' C* files (e.g. {})",
                path.display(),
                path.join("cstar.shard-*.jsonl").display()
            )));
        }
        let name = path.file_name().unwrap_or_default();
        // A rejects or summary file belongs to "<stem>.jsonl", or to "<stem>" when C*'s name
        // had no ".jsonl" (`OutputPaths::new`).
        let companion_of = [("jsonl", "rejects"), ("json", "summary")]
            .iter()
            .find_map(|(ext, kind)| strip_ext(strip_ext(name, ext)?, kind))
            .map(|stem| {
                [with_suffix(stem, ".jsonl"), stem.to_owned()].map(|n| path.with_file_name(n))
            });
        if let Some(cstars) = companion_of {
            if cstars.iter().any(|c| given.contains(c)) {
                continue;
            }
            let cstar = cstars.iter().find(|c| c.is_file()).unwrap_or(&cstars[0]);
            return Err(Error::input(format!(
                "{}: give merge the C* files ({} here); their rejects and summaries are read \
                 from beside them",
                path.display(),
                cstar.display()
            )));
        }
        let paths = OutputPaths::new(path);
        // A journal beside it: that shard's run is going on, or died after writing some of
        // its outputs, so they (and the summary describing them) may be of different runs.
        if paths.journal.exists() {
            return Err(Error::input(format!(
                "{}: {} exists, so a run of this shard is in progress or did not finish; rerun \
                 that shard's annotate to completion, then merge",
                path.display(),
                paths.journal.display()
            )));
        }
        for companion in [&paths.out, &paths.rejects, &paths.summary] {
            if !companion.is_file() {
                let what = if companion.exists() {
                    "not a file"
                } else {
                    "not found"
                };
                return Err(Error::input(format!(
                    "{}: {what}; {} is not the output of a finished run",
                    companion.display(),
                    path.display()
                )));
            }
        }
        let not_ours = |e: String| {
            Error::input(format!(
                "{}: not a toolsift summary: {e}",
                paths.summary.display()
            ))
        };
        let text = crate::util::fs::read_small_text(&paths.summary, MAX_SUMMARY_BYTES, not_ours)?;
        let summary: Summary = crate::util::json::object_from_str(&text).map_err(not_ours)?;
        let (Some(shard), Some(corpus_lines), Some(run)) =
            (summary.shard, summary.corpus_lines, summary.run.clone())
        else {
            return Err(Error::input(format!(
                "{}: no shard, corpus_lines and run (written by an older toolsift); rerun that \
                 shard's annotate to merge it",
                paths.summary.display()
            )));
        };
        outputs.push(MergeInput {
            paths,
            shard,
            corpus_lines,
            run,
            summary,
        });
    }
    Ok(outputs)
}

/// The lines of one C* or rejects file, each checked to be a record of its kind, in strictly
/// increasing input-line order and of its shard.
struct MergeStream {
    path: PathBuf,
    shard: Shard,
    rejects: bool,
    lines: JsonlLines<BufReader<std::fs::File>>,
    file_line: usize,
    last: u64,
    current: String,
}

impl MergeStream {
    fn open(path: &Path, shard: Shard, rejects: bool) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| {
            if e.raw_os_error() == Some(24) {
                // EMFILE: every shard's file is open at once.
                Error::input(format!(
                    "{}: too many files open at once (merge keeps every shard's C* open): raise \
                     the limit with `ulimit -n` and rerun",
                    path.display()
                ))
            } else {
                Error::io(path, e)
            }
        })?;
        Ok(MergeStream {
            path: path.to_owned(),
            shard,
            rejects,
            // Small: one buffer per open shard file.
            // Lines this program wrote: a C* line can be longer than its corpus line.
            lines: JsonlLines::new(BufReader::with_capacity(64 << 10, file))
                .with_max_line_bytes(usize::MAX),
            file_line: 0,
            last: 0,
            current: String::new(),
        })
    }

    /// Reads the next record into `current`; returns its input line number.
    fn advance(&mut self) -> Result<Option<u64>> {
        let Some(text) = self.lines.next() else {
            return Ok(None);
        };
        let (file_line, text) = text.map_err(|e| Error::io(&self.path, e))?;
        self.file_line = file_line;
        let at = || format!("{}:{}", self.path.display(), self.file_line);
        let text = text.map_err(|e| Error::input(format!("{}: {e}", at())))?;
        // Read as strictly as annotate's own records: one object, each key once, no key of
        // another kind of record, every field of its type; and with no value cap, as large as
        // the run that wrote them held them.
        use crate::util::json::object_from_str_within as read;
        let parsed = if self.rejects {
            read::<writer::RejectRecord>(&text, usize::MAX).map(|r| r.line)
        } else {
            read::<CStarRecord>(&text, usize::MAX).and_then(|d| {
                use serde_json::Value;
                let id_ok = match &d.id {
                    Value::Null | Value::String(_) => true,
                    Value::Number(n) => n.is_i64() || n.is_u64(),
                    _ => false,
                };
                if !id_ok {
                    return Err("its \"id\" is not a string, a 64-bit integer or null, as \
                                annotate writes ids"
                        .into());
                }
                d.check_call_positions().map(|()| d.line)
            })
        };
        let line = parsed.map_err(|e| {
            let kind = if self.rejects { "reject" } else { "C*" };
            Error::input(format!("{}: not a {kind} record: {e}", at()))
        })?;
        if line <= self.last || !self.shard.owns(line) {
            return Err(Error::input(format!(
                "{}: input line {line} {} (shard {}/{})",
                at(),
                if line <= self.last {
                    "out of order"
                } else {
                    "is not of this shard"
                },
                self.shard.index,
                self.shard.count
            )));
        }
        self.last = line;
        // A byte order mark (an editor's) is not copied into the middle of the merged file.
        self.current = match text.strip_prefix('\u{feff}') {
            Some(rest) => rest.to_owned(),
            None => text,
        };
        Ok(Some(line))
    }
}

/// What is where a missing shard's output would be, named after a given shard's (`given`, of
/// shard `index`): its journal (the shard is running or was interrupted), or its C* (not
/// given to merge); "" when neither, or when the given file is not named as a shard's.
fn missing_shard_state(given: &Path, index: u64, missing: u64, count: u64) -> String {
    let shard_name = |index: u64| Shard { index, count }.name_part();
    let Some(name) = given.file_name().and_then(|n| n.to_str()) else {
        return String::new();
    };
    if !name.contains(&shard_name(index)) {
        return String::new();
    }
    let paths = OutputPaths::new(&given.with_file_name(name.replacen(
        &shard_name(index),
        &shard_name(missing),
        1,
    )));
    if paths.journal.exists() {
        format!(
            ": its journal {} is there, so it is still running or was interrupted; finish it \
             (rerun its command) before merging",
            paths.journal.display()
        )
    } else if paths.out.exists() {
        format!(
            ": its output {} is there, but was not given",
            paths.out.display()
        )
    } else {
        String::new()
    }
}
