//! The run's summary: per tool the paper's Table 2 (texts considered, positions, calls sampled /
//! executed / failed / kept, and where the others went), the highest- and lowest-scoring calls
//! (like its Table 10), and the time per stage. Built from the journal, so a resumed run counts
//! every document exactly once (time spent on a document lost to a crash is not counted).

use serde::{Deserialize, Serialize};

use super::document::{CStarRecord, DocStats, StageSecs, ToolStats};
use super::shard::Shard;
use super::tool_kind::ToolName;

/// This build's version, recorded in every summary it writes.
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// How many best and worst calls are kept per tool.
pub const EXAMPLES: usize = 3;

/// One scored call with its context.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Example {
    /// 1-based input line of the document the call was sampled in.
    pub line: u64,
    /// The tool's call name ("Calculator", ...).
    pub tool: String,
    /// L- - L+ (`CallRecord::delta`): what the examples are ranked by.
    pub delta: f64,
    /// The three losses delta is derived from (absent in summaries of older versions).
    #[serde(default)]
    pub l_none: Option<f64>,
    /// L_i(e(c, eps)), the loss with the call but not its result.
    #[serde(default)]
    pub l_call: Option<f64>,
    /// L_i(e(c, r)), the loss with the call and its result.
    #[serde(default)]
    pub l_call_result: Option<f64>,
    /// Whether the call passed the filter (delta >= tau_f) and is in C*.
    pub kept: bool,
    /// The call spliced into ~100 bytes of its text (widened to character boundaries).
    pub context: String,
}

/// One tool's part of the summary: its counters and its best and worst calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSummary {
    /// The tool's call name ("Calculator", "QA", a custom tool's name).
    pub tool: String,
    /// Its counters summed over the documents, flattened into this object in the JSON.
    #[serde(flatten)]
    pub stats: ToolStats,
    /// The [`EXAMPLES`] scored calls of highest delta, highest first (ties: the earlier line).
    pub best: Vec<Example>,
    /// The [`EXAMPLES`] scored calls of lowest delta, lowest first (ties: the earlier line).
    pub worst: Vec<Example>,
}

/// A finished run's (or a merge's) summary, written as JSON to `<out stem>.summary.json` beside
/// C*; `render` makes the table printed at the end of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The version of toolsift that wrote it (for a merge, the one that merged); absent in
    /// summaries of older versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolsift_version: Option<String>,
    /// The shard this output covers and the corpus's line count: what `merge` checks that the
    /// shards cover, every line exactly once (absent in summaries of older versions).
    #[serde(default)]
    pub shard: Option<Shard>,
    /// Lines of the whole corpus (every shard's), as counted when the run started.
    #[serde(default)]
    pub corpus_lines: Option<u64>,
    /// The settings of the run that wrote it, as its journal recorded them (config, tools, corpus
    /// path, line count and hash, model, device), less the shard: `merge` requires them equal
    /// across the shards it joins, but for the corpus path and model folder where their content
    /// hashes stand beside them (only where the inputs were read from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<serde_json::Value>,
    /// Input lines of this shard.
    pub lines: u64,
    /// Of those, the documents annotated: the lines of C*.
    pub documents: u64,
    /// Of those, the lines rejected: the lines of the rejects file.
    pub rejected: u64,
    /// Documents with at least one kept call.
    pub documents_with_calls: u64,
    /// Candidates handed to the scorer, summed over documents (`DocStats::candidates`).
    pub candidates_scored: u64,
    /// One entry per active tool, in the run's tool order.
    pub tools: Vec<ToolSummary>,
    /// Seconds per stage, summed over documents.
    pub secs: StageSecs,
    /// Wall-clock seconds of the run that finished (resumed runs: the last one only).
    pub wall_secs: f64,
    /// Lines of this shard that an interrupted run had already annotated when the run that
    /// finished resumed its journal (0: no resume). `secs` counts every run, `wall_secs` only
    /// the last. Merged: the shards' sum.
    #[serde(default)]
    pub lines_resumed: u64,
}

/// A column of the printed table: its header and the count it shows.
type Column = (&'static str, fn(&ToolStats) -> u64);

/// The printed table's columns. Those from "sampled" to "executed" add up: every sampled call
/// is malformed, of an unknown tool, a duplicate, dropped as lookahead or executed. Each is the
/// summary's field of that name (`calls_*`). Lookahead and unscorable are shown only when a tool
/// has some.
const COLUMNS: [Column; 12] = [
    ("texts", |st| st.texts_considered),
    ("positions", |st| st.positions),
    ("sampled", |st| st.calls_sampled),
    ("malformed", |st| st.calls_malformed),
    ("unknown", |st| st.calls_unknown_tool),
    ("duplicate", |st| st.calls_duplicate),
    ("lookahead", |st| st.calls_lookahead),
    ("executed", |st| st.calls_executed),
    ("failed", |st| st.calls_failed),
    ("unscorable", |st| st.calls_unscorable),
    ("kept", |st| st.calls_kept),
    ("heuristic", |st| st.texts_skipped_heuristic),
];

/// Accumulates journal entries into a `Summary`.
pub struct SummaryBuilder {
    summary: Summary,
    /// The key of each tool's counters in `DocStats::tools`, in the order of `summary.tools`.
    keys: Vec<String>,
}

impl SummaryBuilder {
    /// An empty summary of a run of `tools` (in that order), each with zero counters.
    pub fn new(tools: &[ToolName]) -> Self {
        SummaryBuilder {
            keys: tools.iter().map(|t| t.key().to_string()).collect(),
            summary: Summary {
                toolsift_version: Some(VERSION.to_string()),
                shard: None,
                corpus_lines: None,
                run: None,
                lines: 0,
                documents: 0,
                rejected: 0,
                documents_with_calls: 0,
                candidates_scored: 0,
                tools: tools
                    .iter()
                    .map(|t| ToolSummary {
                        tool: t.call_name().to_string(),
                        stats: ToolStats::default(),
                        best: Vec::new(),
                        worst: Vec::new(),
                    })
                    .collect(),
                secs: StageSecs::default(),
                wall_secs: 0.0,
                lines_resumed: 0,
            },
        }
    }

    /// Counts one rejected input line.
    pub fn reject(&mut self) {
        self.summary.lines += 1;
        self.summary.rejected += 1;
    }

    /// Counts one annotated document: adds its counters and stage seconds, and offers each of
    /// its scored calls to its tool's best and worst examples.
    pub fn document(&mut self, record: &CStarRecord, stats: &DocStats) {
        let s = &mut self.summary;
        s.lines += 1;
        s.documents += 1;
        s.documents_with_calls += u64::from(record.calls.iter().any(|c| c.kept));
        s.candidates_scored += stats.candidates;
        s.secs.add(&stats.secs);
        for (t, key) in s.tools.iter_mut().zip(&self.keys) {
            if let Some(st) = stats.tools.get(key) {
                t.stats.add(st);
            }
        }
        for c in &record.calls {
            let Some(delta) = c.delta else { continue };
            let Some(t) = s.tools.iter_mut().find(|t| t.tool == c.tool) else {
                continue;
            };
            let example = || Example {
                line: record.line,
                tool: c.tool.clone(),
                delta,
                l_none: c.l_none,
                l_call: c.l_call,
                l_call_result: c.l_call_result,
                kept: c.kept,
                context: context(
                    &record.text,
                    c.position,
                    &c.tool,
                    &c.input,
                    c.result.as_deref(),
                ),
            };
            // Best: highest delta first; ties keep the earlier example.
            insert(&mut t.best, delta, example, |a, b| a > b);
            insert(&mut t.worst, delta, example, |a, b| a < b);
        }
    }

    /// The summary, with `wall_secs` as the run's wall-clock seconds; `shard`, `corpus_lines`
    /// and `run` are left None for the caller to fill in.
    pub fn finish(mut self, wall_secs: f64) -> Summary {
        self.summary.wall_secs = wall_secs;
        self.summary
    }
}

/// Puts the example of a call with `delta` in its place in `list` (the first place whose example
/// it is `better` than), keeping the first `EXAMPLES`; the example (its context string) is made
/// only when it is kept.
fn insert(
    list: &mut Vec<Example>,
    delta: f64,
    make: impl FnOnce() -> Example,
    better: impl Fn(f64, f64) -> bool,
) {
    let at = list
        .iter()
        .position(|x| better(delta, x.delta))
        .unwrap_or(list.len());
    if at < EXAMPLES {
        list.insert(at, make());
        list.truncate(EXAMPLES);
    }
}

/// ~60 bytes before the call, the call, ~40 after (each widened to a character boundary).
fn context(text: &str, position: usize, tool: &str, input: &str, result: Option<&str>) -> String {
    let position = position.min(text.len());
    let mut start = position.saturating_sub(60);
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = (position + 40).min(text.len());
    while !text.is_char_boundary(end) {
        end += 1;
    }
    let call = crate::score::call_text(tool, input, result, Default::default());
    let spliced = super::splice::splice(&text[start..end], &[(position - start, call)]);
    format!("…{spliced}…")
}

impl Summary {
    /// The summary of every shard's output joined (`merge`): the whole corpus (shard 0/1), the
    /// counts and stage seconds summed, each tool's best and worst calls the best and worst of
    /// all shards' (ties to the earlier line, as one unsharded run keeps them: the same
    /// examples), and the wall time of the longest shard (they run side by side). `shards` are
    /// one run's (`merge` checks that first); a tool is matched by name.
    pub fn merge_shards(shards: &[Summary]) -> Summary {
        let mut merged = Summary {
            toolsift_version: Some(VERSION.to_string()),
            shard: Some(Shard::default()),
            corpus_lines: shards.first().and_then(|s| s.corpus_lines),
            run: shards.first().and_then(|s| s.run.clone()),
            lines: 0,
            documents: 0,
            rejected: 0,
            documents_with_calls: 0,
            candidates_scored: 0,
            tools: Vec::new(),
            secs: StageSecs::default(),
            wall_secs: 0.0,
            lines_resumed: 0,
        };
        for s in shards {
            merged.lines += s.lines;
            merged.documents += s.documents;
            merged.rejected += s.rejected;
            merged.documents_with_calls += s.documents_with_calls;
            merged.candidates_scored += s.candidates_scored;
            merged.secs.add(&s.secs);
            merged.wall_secs = merged.wall_secs.max(s.wall_secs);
            merged.lines_resumed += s.lines_resumed;
            for t in &s.tools {
                let at = match merged.tools.iter().position(|m| m.tool == t.tool) {
                    Some(at) => at,
                    None => {
                        merged.tools.push(ToolSummary {
                            tool: t.tool.clone(),
                            stats: ToolStats::default(),
                            best: Vec::new(),
                            worst: Vec::new(),
                        });
                        merged.tools.len() - 1
                    }
                };
                let m = &mut merged.tools[at];
                m.stats.add(&t.stats);
                m.best.extend(t.best.iter().cloned());
                m.worst.extend(t.worst.iter().cloned());
            }
        }
        // Stable sorts: calls of one line (one shard's, in its order) keep their order.
        for m in &mut merged.tools {
            m.best
                .sort_by(|a, b| b.delta.total_cmp(&a.delta).then(a.line.cmp(&b.line)));
            m.worst
                .sort_by(|a, b| a.delta.total_cmp(&b.delta).then(a.line.cmp(&b.line)));
            m.best.truncate(EXAMPLES);
            m.worst.truncate(EXAMPLES);
        }
        merged
    }

    /// The human-readable table printed at the end of a run.
    pub fn render(&self) -> String {
        let mut s = format!(
            "{} lines: {} documents, {} rejected; {} documents with kept calls; {} candidates scored\n",
            self.lines, self.documents, self.rejected, self.documents_with_calls, self.candidates_scored
        );
        // As wide as the longest name (a custom tool's can be long), 11 at least.
        let w = self
            .tools
            .iter()
            .map(|t| t.tool.chars().count())
            .fold(11, usize::max);
        // Columns that are mostly 0 (lookahead is opt-in), only when a tool has some.
        let columns: Vec<&Column> = COLUMNS
            .iter()
            .filter(|(name, value)| {
                !["lookahead", "unscorable"].contains(name)
                    || self.tools.iter().any(|t| value(&t.stats) > 0)
            })
            .collect();
        s.push_str(&format!("{:<w$}", "tool"));
        for (name, _) in &columns {
            s.push_str(&format!(" {name:>8}"));
        }
        s.push('\n');
        for t in &self.tools {
            s.push_str(&format!("{:<w$}", t.tool));
            for (name, value) in &columns {
                s.push_str(&format!(
                    " {:>width$}",
                    value(&t.stats),
                    width = name.len().max(8)
                ));
            }
            s.push('\n');
        }
        for t in &self.tools {
            let st = &t.stats;
            if st.calls_executed > 0 && st.calls_failed == st.calls_executed {
                s.push_str(&format!(
                    "warning: every call {} executed failed ({}): is the tool set up? (each \
                     call's \"error\" in C* says why)\n",
                    t.tool, st.calls_failed
                ));
            }
        }
        let total = self.secs.sampling + self.secs.tools + self.secs.scoring;
        let pct = |x: f64| if total > 0.0 { 100.0 * x / total } else { 0.0 };
        s.push_str(&format!(
            "time: sampling {:.2}s ({:.0}%), tools {:.2}s ({:.0}%), scoring {:.2}s ({:.0}%); wall {:.2}s\n",
            self.secs.sampling,
            pct(self.secs.sampling),
            self.secs.tools,
            pct(self.secs.tools),
            self.secs.scoring,
            pct(self.secs.scoring),
            self.wall_secs
        ));
        if self.lines_resumed > 0 {
            s.push_str(&format!(
                "(resumed after {} lines: the stage times add up every run of this output, the \
                 wall time is the last run's, in a merge the slowest shard's)\n",
                self.lines_resumed
            ));
        }
        for t in &self.tools {
            for (label, list) in [("best", &t.best), ("worst", &t.worst)] {
                for e in list {
                    let loss = |l: Option<f64>| l.map_or("-".to_string(), |l| format!("{l:.3}"));
                    s.push_str(&format!(
                        "{} {label} delta {:+.3} (L_none {}, L_call {}, L_call_result {}; line {}, {}): {}\n",
                        t.tool,
                        e.delta,
                        loss(e.l_none),
                        loss(e.l_call),
                        loss(e.l_call_result),
                        e.line,
                        if e.kept { "kept" } else { "rejected" },
                        printable(&e.context)
                    ));
                }
            }
        }
        s
    }
}

/// `text` for a terminal: every control character (a line break, a NUL, an escape that would
/// start a terminal sequence) as a space.
fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotate::document::CallRecord;

    fn call(position: usize, delta: f64, kept: bool) -> CallRecord {
        CallRecord {
            position,
            tool: "Calculator".into(),
            input: "1 + 1".into(),
            result: Some("2".into()),
            l_none: Some(2.5),
            l_call: Some(2.25),
            l_call_result: Some(2.25 - delta),
            delta: Some(delta),
            kept,
            error: None,
        }
    }

    /// A document counts as one with calls when a call of it is kept, not when one was scored.
    #[test]
    fn documents_with_calls_counts_kept_calls_only() {
        let mut b = SummaryBuilder::new(&[crate::annotate::ToolKind::Calculator.into()]);
        let record = |line, kept| CStarRecord {
            line,
            id: serde_json::Value::Null,
            text: "so 2 in total".into(),
            annotated_text: String::new(),
            calls: vec![call(3, -0.5, false), call(3, 1.5, kept)],
        };
        b.document(&record(1, false), &DocStats::default());
        b.document(&record(2, true), &DocStats::default());
        b.document(&record(3, false), &DocStats::default());
        let s = b.finish(1.0);
        assert_eq!((s.documents, s.documents_with_calls), (3, 1));
    }

    /// Per tool sampled / executed / kept, and the best and worst calls with their three losses.
    #[test]
    fn render_shows_counts_and_losses() {
        let mut b = SummaryBuilder::new(&[crate::annotate::ToolKind::Calculator.into()]);
        let record = CStarRecord {
            line: 1,
            id: serde_json::Value::Null,
            text: "so 2\0 in\u{1b}[2J total".into(),
            annotated_text: String::new(),
            calls: (0..4)
                .map(|k| call(2, k as f64 - 1.0, k >= 2))
                .chain([CallRecord {
                    l_none: None,
                    delta: None,
                    ..call(2, 0.0, false)
                }])
                .collect(),
        };
        let mut stats = DocStats::default();
        stats.tools.insert(
            "calculator".into(),
            ToolStats {
                calls_sampled: 9,
                calls_malformed: 1,
                calls_unknown_tool: 2,
                calls_duplicate: 1,
                calls_executed: 5,
                calls_unscorable: 1,
                calls_kept: 2,
                ..Default::default()
            },
        );
        b.document(&record, &stats);
        let s = b.finish(1.0);
        let t = &s.tools[0];
        assert_eq!(t.best.len(), 3);
        assert_eq!(t.best[0].delta, 2.0);
        assert_eq!(t.best[0].l_none, Some(2.5));
        assert_eq!(t.best[0].l_call_result, Some(0.25));
        assert_eq!(t.worst[0].delta, -1.0);
        let text = s.render();
        // The columns from sampled to executed add up (9 = 1 + 2 + 1 + 5), each a field's value;
        // lookahead, opt-in and 0 here, has no column.
        let lines: Vec<&str> = text.lines().collect();
        let header: Vec<&str> = lines[1].split_whitespace().collect();
        let row: Vec<&str> = lines[2].split_whitespace().collect();
        let at = |name: &str| row[header.iter().position(|h| *h == name).unwrap()];
        assert_eq!(
            [
                "sampled",
                "malformed",
                "unknown",
                "duplicate",
                "executed",
                "unscorable",
                "kept"
            ]
            .map(at),
            ["9", "1", "2", "1", "5", "1", "2"],
            "{text}"
        );
        assert!(!header.contains(&"lookahead"), "{text}");
        // The corpus's control characters (a NUL, a terminal escape) do not reach the terminal.
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "{text:?}"
        );
        assert!(!text.contains("warning"), "{text}");
        assert!(
            text.contains(
                "Calculator best delta +2.000 (L_none 2.500, L_call 2.250, L_call_result 0.250; line 1, kept)"
            ),
            "{text}"
        );
        assert!(
            text.contains("worst delta -1.000") && text.contains("rejected"),
            "{text}"
        );
        // Without unscorable calls, no column for them; a tool whose every call failed is named.
        let mut failing = SummaryBuilder::new(&[crate::annotate::ToolKind::Calculator.into()]);
        let mut stats = DocStats::default();
        stats.tools.insert(
            "calculator".into(),
            ToolStats {
                calls_sampled: 3,
                calls_executed: 3,
                calls_failed: 3,
                ..Default::default()
            },
        );
        failing.document(
            &CStarRecord {
                calls: vec![],
                ..record
            },
            &stats,
        );
        let text = failing.finish(1.0).render();
        assert!(
            !text.lines().nth(1).unwrap().contains("unscorable"),
            "{text}"
        );
        assert!(
            text.contains("warning: every call Calculator executed failed (3)"),
            "{text}"
        );
        // Summaries written before the losses were recorded still read.
        let old =
            r#"{"line": 1, "tool": "Calculator", "delta": 1.0, "kept": true, "context": "x"}"#;
        let e: Example = serde_json::from_str(old).unwrap();
        assert_eq!(e.l_none, None);
    }

    fn calculator() -> SummaryBuilder {
        SummaryBuilder::new(&[crate::annotate::ToolKind::Calculator.into()])
    }

    fn one_call(line: u64, delta: f64) -> CStarRecord {
        CStarRecord {
            line,
            id: serde_json::Value::Null,
            text: "so 2 in total".into(),
            annotated_text: String::new(),
            calls: vec![call(3, delta, delta >= 1.0)],
        }
    }

    /// A rejected line is a line of the shard as well; every document's candidates add up; a
    /// call that was not scored (no delta) is no example.
    #[test]
    fn lines_count_rejects_and_candidates_add_up_over_documents() {
        let mut b = calculator();
        b.reject();
        let stats = |candidates| DocStats {
            candidates,
            ..Default::default()
        };
        let unscored = CStarRecord {
            calls: vec![CallRecord {
                delta: None,
                ..call(3, 0.0, false)
            }],
            ..one_call(2, 0.0)
        };
        b.document(&unscored, &stats(4));
        b.document(&one_call(3, 0.5), &stats(6));
        let s = b.finish(1.0);
        assert_eq!((s.lines, s.documents, s.rejected), (3, 2, 1));
        assert_eq!(s.candidates_scored, 10);
        let t = &s.tools[0];
        assert_eq!(t.best.iter().map(|e| e.line).collect::<Vec<_>>(), [3]);
        assert_eq!(t.worst.iter().map(|e| e.line).collect::<Vec<_>>(), [3]);
    }

    /// A call is an example of its own tool: a Calendar call in a run of Calculator and
    /// Calendar is among the Calendar's best and worst, not the first tool's.
    #[test]
    fn an_example_goes_to_its_own_tool() {
        let mut b = SummaryBuilder::new(&[
            crate::annotate::ToolKind::Calculator.into(),
            crate::annotate::ToolKind::Calendar.into(),
        ]);
        let record = CStarRecord {
            calls: vec![CallRecord {
                tool: "Calendar".into(),
                ..call(3, 1.0, true)
            }],
            ..one_call(1, 1.0)
        };
        b.document(&record, &DocStats::default());
        let s = b.finish(1.0);
        assert!(s.tools[0].best.is_empty() && s.tools[0].worst.is_empty());
        assert_eq!((s.tools[1].best.len(), s.tools[1].worst.len()), (1, 1));
        assert_eq!(s.tools[1].best[0].tool, "Calendar");
    }

    /// Calls of equal delta: the earlier line keeps its place, in a run's best and worst and in
    /// a merge of shards, which also keeps the best three of all shards' examples.
    #[test]
    fn ties_go_to_the_earlier_line_in_a_run_and_in_a_merge() {
        let mut b = calculator();
        for line in 1..=4 {
            b.document(&one_call(line, 1.0), &DocStats::default());
        }
        let s = b.finish(1.0);
        let lines = |list: &[Example]| list.iter().map(|e| e.line).collect::<Vec<_>>();
        assert_eq!(lines(&s.tools[0].best), [1, 2, 3]);
        assert_eq!(lines(&s.tools[0].worst), [1, 2, 3]);

        // Shard 2 of lines 2, 4, 6 and shard 1 of lines 1, 3, 5, merged in that order.
        let shard = |first| {
            let mut b = calculator();
            for line in [first, first + 2, first + 4] {
                b.document(&one_call(line, 1.0), &DocStats::default());
            }
            b.finish(1.0)
        };
        let merged = Summary::merge_shards(&[shard(2), shard(1)]);
        assert_eq!(lines(&merged.tools[0].best), [1, 2, 3]);
        assert_eq!(lines(&merged.tools[0].worst), [1, 2, 3]);
    }

    /// A merge covers the whole corpus (shard 0/1, the first shard's corpus line count and
    /// run), sums the counts and the resumed lines, and takes the slowest shard's wall time
    /// (the shards run side by side).
    #[test]
    fn a_merge_sums_the_counts_and_takes_the_slowest_wall_time() {
        let shard = |index, wall_secs, lines_resumed| {
            let mut b = calculator();
            b.document(&one_call(index + 1, 0.5), &DocStats::default());
            b.reject();
            Summary {
                shard: Some(Shard { index, count: 2 }),
                corpus_lines: Some(4),
                run: Some(serde_json::json!({"seed": 7})),
                lines_resumed,
                ..b.finish(wall_secs)
            }
        };
        let merged = Summary::merge_shards(&[shard(0, 2.0, 1), shard(1, 3.0, 2)]);
        assert_eq!(merged.shard, Some(Shard::default()));
        assert_eq!(merged.corpus_lines, Some(4));
        assert_eq!(merged.run, Some(serde_json::json!({"seed": 7})));
        assert_eq!((merged.lines, merged.documents, merged.rejected), (4, 2, 2));
        assert_eq!(merged.lines_resumed, 3);
        assert_eq!(merged.wall_secs, 3.0);
    }

    /// The table's tool column is 11 wide at least; a tool that executed no call is no
    /// warning; each stage's share of the time is a percentage, 0% when no time was spent.
    #[test]
    fn render_pads_the_tool_column_and_shows_each_stages_share() {
        let mut b = SummaryBuilder::new(&[crate::annotate::ToolKind::Qa.into()]);
        b.document(&one_call(1, 0.5), &DocStats::default());
        let idle = b.finish(0.0).render();
        let header = idle.lines().nth(1).unwrap();
        assert!(
            header.starts_with(&format!("{:<11} {:>8}", "tool", "texts")),
            "{idle}"
        );
        assert!(!idle.contains("warning"), "{idle}");
        assert!(
            idle.contains("sampling 0.00s (0%), tools 0.00s (0%), scoring 0.00s (0%)"),
            "{idle}"
        );
        let mut b = calculator();
        let secs = StageSecs {
            sampling: 1.0,
            tools: 1.0,
            scoring: 2.0,
        };
        b.document(
            &one_call(1, 0.5),
            &DocStats {
                secs,
                ..Default::default()
            },
        );
        let text = b.finish(5.0).render();
        assert!(
            text.contains(
                "sampling 1.00s (25%), tools 1.00s (25%), scoring 2.00s (50%); wall 5.00s"
            ),
            "{text}"
        );
    }

    /// An example's context is the 60 bytes before the call and the 40 after, each widened
    /// outwards to a character boundary.
    #[test]
    fn an_examples_context_is_60_bytes_before_and_40_after() {
        let call_text = "[Calculator(1 + 1) -> 2]";
        let ascii: String = (0..200u8).map(|i| char::from(b'a' + i % 26)).collect();
        let got = context(&ascii, 100, "Calculator", "1 + 1", Some("2"));
        assert_eq!(
            got,
            format!("…{}{call_text}{}…", &ascii[40..100], &ascii[100..140])
        );
        // 60 bytes before the call at byte 101 is inside the 2-byte "é" at 40..42.
        let text = format!("{}a{}", "é".repeat(30), "é".repeat(50));
        let got = context(&text, 101, "Calculator", "1 + 1", Some("2"));
        assert_eq!(
            got,
            format!("…{}{call_text}{}…", &text[40..101], &text[101..141])
        );
    }

    /// The 40 bytes after the call are widened outwards too: past a character they end in.
    #[test]
    fn an_examples_context_ends_past_a_character_it_would_cut() {
        // 40 bytes after the call at byte 100 is inside the "é" at 139..141.
        let text = format!("{}{}", "a".repeat(101), "é".repeat(50));
        let got = context(&text, 100, "Calculator", "1 + 1", Some("2"));
        assert_eq!(
            got,
            format!(
                "…{}[Calculator(1 + 1) -> 2]{}…",
                &text[40..100],
                &text[100..141]
            )
        );
    }

    /// A merge adds up every shard's seconds per stage, and its wall time is the slowest
    /// shard's wherever that shard is in the list.
    #[test]
    fn a_merge_sums_the_stage_seconds_and_takes_the_slowest_shard_first_or_last() {
        let shard = |sampling, wall_secs| {
            let mut b = calculator();
            let secs = StageSecs {
                sampling,
                tools: 1.0,
                scoring: 2.0,
            };
            b.document(
                &one_call(1, 0.5),
                &DocStats {
                    secs,
                    ..Default::default()
                },
            );
            b.finish(wall_secs)
        };
        let merged = Summary::merge_shards(&[shard(1.0, 5.0), shard(3.0, 2.0)]);
        let want = StageSecs {
            sampling: 4.0,
            tools: 2.0,
            scoring: 4.0,
        };
        assert_eq!(merged.secs, want);
        assert_eq!(merged.wall_secs, 5.0);
    }

    /// Each count of the table is right-aligned under its header, a header longer than the
    /// usual 8 columns ("unscorable", shown when any tool, not only the first, has some)
    /// included; the tool column is as wide as the longest name in characters, not bytes.
    #[test]
    fn render_aligns_each_count_under_its_header() {
        let name = "Wetterstationé";
        let tools = [
            crate::annotate::ToolKind::Calculator.into(),
            ToolName::custom(name).unwrap(),
        ];
        let mut b = SummaryBuilder::new(&tools);
        let mut stats = DocStats::default();
        let st = ToolStats {
            calls_sampled: 3,
            calls_executed: 3,
            calls_unscorable: 2,
            calls_kept: 1,
            ..Default::default()
        };
        stats.tools.insert(name.into(), st);
        b.document(&one_call(1, 0.5), &stats);
        let text = b.finish(1.0).render();
        let lines: Vec<&str> = text.lines().collect();
        let (header, row) = (lines[1], lines[3]);
        let w = name.chars().count();
        assert!(
            header.starts_with(&format!("{:<w$} {:>8}", "tool", "texts")),
            "{text}"
        );
        let row: Vec<char> = row.chars().collect();
        assert_eq!(header.len(), row.len(), "{text}");
        for (name, value) in [("sampled", "3"), ("unscorable", "2"), ("kept", "1")] {
            let end = header.find(name).unwrap() + name.len();
            let at: String = row[end - value.len() - 1..end].iter().collect();
            assert_eq!(at, format!(" {value}"), "{name}: {text}");
        }
    }

    /// The warning names a tool only when every call it executed failed, not when some did.
    #[test]
    fn no_warning_when_some_calls_of_a_tool_succeed() {
        let mut b = calculator();
        let mut stats = DocStats::default();
        let st = ToolStats {
            calls_sampled: 3,
            calls_executed: 3,
            calls_failed: 2,
            ..Default::default()
        };
        stats.tools.insert("calculator".into(), st);
        b.document(&one_call(1, 0.5), &stats);
        let text = b.finish(1.0).render();
        assert!(!text.contains("warning"), "{text}");
    }

    /// The first line counts the lines, documents, rejects, documents with kept calls (two
    /// kept calls in one document count once) and candidates, each in its place.
    #[test]
    fn render_first_line_gives_each_count_in_its_place() {
        let mut b = calculator();
        b.reject();
        let two_kept = CStarRecord {
            calls: vec![call(3, 1.5, true), call(3, 2.5, true)],
            ..one_call(2, 0.0)
        };
        let stats = DocStats {
            candidates: 5,
            ..Default::default()
        };
        b.document(&two_kept, &stats);
        b.document(&one_call(3, 0.5), &stats);
        let text = b.finish(1.0).render();
        assert_eq!(
            text.lines().next().unwrap(),
            "3 lines: 2 documents, 1 rejected; 1 documents with kept calls; 10 candidates scored"
        );
    }

    /// An example of an older summary, without its losses, shows "-" for each; a tab in a
    /// context is printed as a space like every control character.
    #[test]
    fn render_shows_missing_losses_as_dashes_and_tabs_as_spaces() {
        let mut s = calculator().finish(1.0);
        s.tools[0].best.push(Example {
            line: 4,
            tool: "Calculator".into(),
            delta: 1.0,
            l_none: None,
            l_call: None,
            l_call_result: None,
            kept: true,
            context: "a\tb".into(),
        });
        let text = s.render();
        assert!(
            text.contains(
                "Calculator best delta +1.000 (L_none -, L_call -, L_call_result -; line 4, kept): a b"
            ),
            "{text}"
        );
    }
}
