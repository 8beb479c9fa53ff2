//! `toolsift eval-demo`'s metrics: what an annotate run kept, against the sites the demo corpus
//! records (`corpus::Site`). Pure functions over the documents and the C* records.
//!
//! - calculator precision: among kept Calculator calls, the share whose result equals the number
//!   written right after the call's position (whitespace skipped; digits with an optional
//!   decimal part; compared as numbers, so "25" equals "25" and "25.0"): the issue's
//!   definition. `precision_at_sites` counts only those at a site, so that a call that restates
//!   a number the text writes (`Calculator(1400)` before "1400") does not count;
//! - site recall: the share of calculator sites with a kept Calculator call at the site (its
//!   position is the site's offset or its answer's offset); `recall_right`, those with one whose
//!   result is the site's answer;
//! - control rate: the share of control documents with any kept Calculator call;
//! - calendar: kept Calendar calls, and the share of calendar sites with a kept Calendar call.
//!
//! The same metrics with every scored call kept ([`unfiltered`]) show what the filter does:
//! the sampled calls themselves, before tau_f, are mostly wrong.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::annotate::tool_kind::ToolKind;
use crate::annotate::{CStarRecord, CallRecord, Summary};
use crate::error::{Error, Result};

use super::corpus::{number_after, DemoDoc, DocKind, Site};

/// Calculator precision target.
pub const PRECISION_TARGET: f64 = 0.9;
/// Calculator site recall target.
pub const RECALL_TARGET: f64 = 0.5;
/// Control rate target (at most).
pub const CONTROL_TARGET: f64 = 0.05;

/// The Calculator's metrics: precision, site recall and control rate, with the counts behind
/// them (eval.json's "metrics"."calculator").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalculatorMetrics {
    /// Kept Calculator calls.
    pub kept: u64,
    /// Kept Calculator calls whose result is the number the text writes after them.
    pub correct: u64,
    /// correct / kept (null without kept calls).
    pub precision: Option<f64>,
    /// Calculator sites.
    pub sites: u64,
    /// Calculator sites with a kept Calculator call.
    pub sites_hit: u64,
    /// sites_hit / sites.
    pub recall: Option<f64>,
    /// Control documents.
    pub control_docs: u64,
    /// Control documents with a kept Calculator call.
    pub control_with_calls: u64,
    /// control_with_calls / control_docs.
    pub control_rate: Option<f64>,
    /// Of `correct`, the calls at a site (`at_site`), whose result is thus the site's answer: a
    /// stricter count than `correct`, which also counts a call that merely restates a number
    /// the text writes next (`Calculator(1400)` before "1400") wherever it stands.
    #[serde(default)]
    pub correct_at_sites: u64,
    /// correct_at_sites / kept.
    #[serde(default)]
    pub precision_at_sites: Option<f64>,
    /// Of `sites_hit`, the sites with a kept call whose result is the site's answer.
    #[serde(default)]
    pub sites_hit_right: u64,
    /// sites_hit_right / sites.
    #[serde(default)]
    pub recall_right: Option<f64>,
}

/// The Calendar's counts and site recall (eval.json's "metrics"."calendar"); it has no target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalendarMetrics {
    /// Kept Calendar calls.
    pub kept: u64,
    /// Calendar sites.
    pub sites: u64,
    /// Calendar sites with a kept Calendar call.
    pub sites_hit: u64,
    /// sites_hit / sites.
    pub recall: Option<f64>,
}

/// What [`evaluate`] measures of one C* against its set (eval.json's "metrics").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metrics {
    /// Documents of the set.
    pub docs: u64,
    /// C* records matched to a document (by id).
    pub records: u64,
    /// C* records whose id is not a document of the set (should be 0).
    pub unmatched_records: u64,
    /// Kept Calculator calls against the arithmetic sites and the control documents.
    pub calculator: CalculatorMetrics,
    /// Kept Calendar calls against the calendar sites.
    pub calendar: CalendarMetrics,
}

/// Whether a calculator result equals the number the text writes after `position`.
pub fn result_matches_text(result: &str, text: &str, position: usize) -> bool {
    let (Ok(r), Some(t)) = (result.trim().parse::<f64>(), number_after(text, position)) else {
        return false;
    };
    (r - t).abs() <= 1e-9 * r.abs().max(t.abs()).max(1.0)
}

/// Whether `call` is at `site`: its position is the site's offset or its answer's.
pub fn at_site(call: &CallRecord, site: &Site) -> bool {
    call.position == site.offset || call.position == site.answer_offset
}

fn kept_of(record: &CStarRecord, tool: ToolKind) -> impl Iterator<Item = &CallRecord> {
    record
        .calls
        .iter()
        .filter(move |c| c.kept && c.tool == tool.call_name())
}

fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

/// The metrics of `records` (a C* of `docs`, matched by id; documents without a record count
/// as having kept nothing).
pub fn evaluate(docs: &[DemoDoc], records: &[CStarRecord]) -> Metrics {
    let by_id: HashMap<&str, &CStarRecord> = records
        .iter()
        .filter_map(|r| r.id.as_str().map(|id| (id, r)))
        .collect();
    let ids: std::collections::HashSet<&str> = docs.iter().map(|d| d.id.as_str()).collect();
    let unmatched = records
        .iter()
        .filter(|r| !r.id.as_str().is_some_and(|id| ids.contains(id)))
        .count() as u64;

    let mut calc = CalculatorMetrics {
        kept: 0,
        correct: 0,
        precision: None,
        sites: 0,
        sites_hit: 0,
        recall: None,
        control_docs: 0,
        control_with_calls: 0,
        control_rate: None,
        correct_at_sites: 0,
        precision_at_sites: None,
        sites_hit_right: 0,
        recall_right: None,
    };
    let mut cal = CalendarMetrics {
        kept: 0,
        sites: 0,
        sites_hit: 0,
        recall: None,
    };
    let mut matched = 0;
    for doc in docs {
        let record = by_id.get(doc.id.as_str()).copied();
        matched += u64::from(record.is_some());
        let kept_calc: Vec<&CallRecord> = record
            .map(|r| kept_of(r, ToolKind::Calculator).collect())
            .unwrap_or_default();
        let kept_cal: Vec<&CallRecord> = record
            .map(|r| kept_of(r, ToolKind::Calendar).collect())
            .unwrap_or_default();
        let right = |c: &CallRecord| {
            record.is_some_and(|r| {
                c.result
                    .as_deref()
                    .is_some_and(|res| result_matches_text(res, &r.text, c.position))
            })
        };
        let calc_sites: Vec<&Site> = doc
            .sites
            .iter()
            .filter(|s| s.tool == ToolKind::Calculator)
            .collect();
        if record.is_some() {
            calc.kept += kept_calc.len() as u64;
            for c in kept_calc.iter().filter(|c| right(c)) {
                calc.correct += 1;
                calc.correct_at_sites += u64::from(calc_sites.iter().any(|s| at_site(c, s)));
            }
            cal.kept += kept_cal.len() as u64;
        }
        for site in &doc.sites {
            let (sites, hit, kept) = match site.tool {
                ToolKind::Calculator => (&mut calc.sites, &mut calc.sites_hit, &kept_calc),
                ToolKind::Calendar => (&mut cal.sites, &mut cal.sites_hit, &kept_cal),
                _ => continue,
            };
            *sites += 1;
            *hit += u64::from(kept.iter().any(|c| at_site(c, site)));
            if site.tool == ToolKind::Calculator {
                calc.sites_hit_right +=
                    u64::from(kept.iter().any(|c| at_site(c, site) && right(c)));
            }
        }
        if doc.kind == DocKind::Control {
            calc.control_docs += 1;
            calc.control_with_calls += u64::from(!kept_calc.is_empty());
        }
    }
    calc.precision = ratio(calc.correct, calc.kept);
    calc.recall = ratio(calc.sites_hit, calc.sites);
    calc.precision_at_sites = ratio(calc.correct_at_sites, calc.kept);
    calc.recall_right = ratio(calc.sites_hit_right, calc.sites);
    calc.control_rate = ratio(calc.control_with_calls, calc.control_docs);
    cal.recall = ratio(cal.sites_hit, cal.sites);
    Metrics {
        docs: docs.len() as u64,
        records: matched,
        unmatched_records: unmatched,
        calculator: calc,
        calendar: cal,
    }
}

/// `records` with every scored call kept (finite L_none, L_call and L_call_result), as if
/// tau_f were -inf: what [`evaluate`] measures then is the sampling alone, without the filter.
/// The annotated texts are left as they are (the metrics read positions against "text").
pub fn unfiltered(records: &[CStarRecord]) -> Vec<CStarRecord> {
    let scored = |c: &CallRecord| {
        [c.l_none, c.l_call, c.l_call_result]
            .iter()
            .all(|l| l.is_some_and(f64::is_finite))
    };
    records
        .iter()
        .map(|r| {
            let mut r = r.clone();
            for c in &mut r.calls {
                c.kept = scored(c);
            }
            r
        })
        .collect()
}

/// One target and whether the run meets it (a metric without a value misses).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetCheck {
    /// Which metric: "calculator_precision", "site_recall" or "control_rate".
    pub metric: String,
    /// Its value in this run; None when it has no denominator (e.g. nothing kept).
    pub value: Option<f64>,
    /// ">=" or "<=".
    pub op: String,
    /// The bound (`PRECISION_TARGET`, `RECALL_TARGET` or `CONTROL_TARGET`).
    pub target: f64,
    /// Whether `value op target` holds; false without a value.
    pub pass: bool,
}

/// precision >= 0.9, recall >= 0.5, control rate <= 0.05.
pub fn targets(m: &Metrics) -> Vec<TargetCheck> {
    let check = |metric: &str, value: Option<f64>, at_least: bool, target: f64| TargetCheck {
        metric: metric.to_string(),
        value,
        op: if at_least { ">=" } else { "<=" }.to_string(),
        target,
        pass: value.is_some_and(|v| if at_least { v >= target } else { v <= target }),
    };
    vec![
        check(
            "calculator_precision",
            m.calculator.precision,
            true,
            PRECISION_TARGET,
        ),
        check("site_recall", m.calculator.recall, true, RECALL_TARGET),
        check(
            "control_rate",
            m.calculator.control_rate,
            false,
            CONTROL_TARGET,
        ),
    ]
}

/// Calls per tool, from the run's summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCounts {
    /// The tool's name as the summary writes it ("Calculator").
    pub tool: String,
    /// Calls sampled (the summary's `calls_sampled`).
    pub sampled: u64,
    /// Calls executed (`calls_executed`).
    pub executed: u64,
    /// Calls kept by the filter (`calls_kept`).
    pub kept: u64,
}

/// Everything `eval-demo` reports (`--json` prints it; `eval.json` holds it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    /// Seed of the generated set.
    pub seed: u64,
    /// Whether the set is held out: false for the demo model's training seed and the embedded
    /// corpus's seed ([`super::held_out`]).
    pub held_out: bool,
    /// The metrics of the C* against the set's sites ([`evaluate`]).
    pub metrics: Metrics,
    /// Calls per tool, in the summary's order.
    pub tools: Vec<ToolCounts>,
    /// The three targets ([`targets`]), in the order precision, recall, control rate.
    pub targets: Vec<TargetCheck>,
    /// Seconds of the annotate run (its summary's wall time).
    pub annotate_secs: f64,
    /// Seconds of the whole command (materializing, model load, generating the set, annotate,
    /// metrics, and the tool-use comparison when it runs).
    pub wall_secs: f64,
    /// The C* file evaluated.
    pub cstar: String,
    /// Generation with and without tools on the set's arithmetic prompts (`tool_use`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use: Option<super::tool_use::ToolUseReport>,
    /// The metrics with every scored call kept ([`unfiltered`]): the sampling without the
    /// filter, for comparison; no targets apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unfiltered: Option<Metrics>,
}

impl EvalReport {
    /// The report of a run: `targets` from `metrics`, the per-tool counts and `annotate_secs`
    /// from `summary`, `cstar` as `Path::display` writes it; `tool_use` is None (the caller
    /// sets it).
    pub fn new(
        seed: u64,
        metrics: Metrics,
        summary: &Summary,
        wall_secs: f64,
        cstar: &Path,
    ) -> Self {
        let tools = summary
            .tools
            .iter()
            .map(|t| ToolCounts {
                tool: t.tool.clone(),
                sampled: t.stats.calls_sampled,
                executed: t.stats.calls_executed,
                kept: t.stats.calls_kept,
            })
            .collect();
        EvalReport {
            seed,
            held_out: super::held_out(seed),
            targets: targets(&metrics),
            metrics,
            tools,
            annotate_secs: summary.wall_secs,
            wall_secs,
            cstar: cstar.display().to_string(),
            tool_use: None,
            unfiltered: None,
        }
    }

    /// The table `eval-demo` prints.
    pub fn render(&self) -> String {
        let m = &self.metrics;
        let pct = |v: Option<f64>| v.map_or("n/a".to_string(), |v| format!("{:.3}", v));
        let mut s = format!(
            "eval-demo: seed {}, {} documents ({} in C*){}\n",
            self.seed,
            m.docs,
            m.records,
            if self.held_out {
                ""
            } else {
                "; NOT held out: the demo trained on or annotates these documents"
            }
        );
        s.push_str(&format!(
            "{:<11} {:>8} {:>9} {:>6}\n",
            "tool", "sampled", "executed", "kept"
        ));
        for t in &self.tools {
            s.push_str(&format!(
                "{:<11} {:>8} {:>9} {:>6}\n",
                t.tool, t.sampled, t.executed, t.kept
            ));
        }
        let c = &m.calculator;
        s.push_str(&format!(
            "calculator precision  {:>6}  ({} of {} kept calls write their result next)\n",
            pct(c.precision),
            c.correct,
            c.kept
        ));
        s.push_str(&format!(
            "  at sites            {:>6}  ({} of them stand at an arithmetic site)\n",
            pct(c.precision_at_sites),
            c.correct_at_sites
        ));
        s.push_str(&format!(
            "site recall           {:>6}  ({} of {} arithmetic sites have a kept call)\n",
            pct(c.recall),
            c.sites_hit,
            c.sites
        ));
        s.push_str(&format!(
            "  with its answer     {:>6}  ({} of them have one whose result is the answer)\n",
            pct(c.recall_right),
            c.sites_hit_right
        ));
        s.push_str(&format!(
            "control rate          {:>6}  ({} of {} control documents have a kept call)\n",
            pct(c.control_rate),
            c.control_with_calls,
            c.control_docs
        ));
        let k = &m.calendar;
        s.push_str(&format!(
            "calendar              {:>6}  ({} kept calls; {} of {} calendar sites have one)\n",
            pct(k.recall),
            k.kept,
            k.sites_hit,
            k.sites
        ));
        for t in &self.targets {
            s.push_str(&format!(
                "target {:<21} {} {:<4} {:>6}  {}\n",
                t.metric,
                t.op,
                t.target,
                pct(t.value),
                if t.pass { "PASS" } else { "MISS" }
            ));
        }
        if let Some(u) = &self.unfiltered {
            let c = &u.calculator;
            s.push_str(&format!(
                "without the filter (every scored call kept): precision {} ({} of {}), \
                 recall {}, control rate {} ({} of {})\n",
                pct(c.precision),
                c.correct,
                c.kept,
                pct(c.recall),
                pct(c.control_rate),
                c.control_with_calls,
                c.control_docs
            ));
        }
        s.push_str(&format!(
            "time: annotate {:.2}s, wall {:.2}s; C* {}\n",
            self.annotate_secs, self.wall_secs, self.cstar
        ));
        if let Some(t) = &self.tool_use {
            s.push_str(&t.render());
        }
        s
    }
}

/// Reads a C* file.
pub fn read_cstar(path: &Path) -> Result<Vec<CStarRecord>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| {
            serde_json::from_str(l)
                .map_err(|e| Error::input(format!("{}:{}: {e}", path.display(), n + 1)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::annotate::tools::Date;
    use serde_json::json;

    fn site(tool: ToolKind, text: &str, answer: &str, input: &str) -> Site {
        let answer_offset = text.find(answer).unwrap();
        Site {
            tool,
            offset: answer_offset - 1,
            answer_offset,
            answer: answer.into(),
            input: input.into(),
        }
    }

    fn doc(id: &str, kind: DocKind, text: &str, sites: Vec<Site>) -> DemoDoc {
        DemoDoc {
            id: id.into(),
            kind,
            text: text.into(),
            date: Date::new(2021, 7, 4).unwrap(),
            sites,
        }
    }

    fn call(tool: &str, position: usize, result: &str, kept: bool) -> CallRecord {
        CallRecord {
            position,
            tool: tool.into(),
            input: "x".into(),
            result: Some(result.into()),
            l_none: Some(2.0),
            l_call: Some(2.0),
            l_call_result: Some(1.0),
            delta: Some(1.0),
            kept,
            error: None,
        }
    }

    fn record(line: u64, d: &DemoDoc, calls: Vec<CallRecord>) -> CStarRecord {
        CStarRecord {
            line,
            id: json!(d.id),
            text: d.text.clone(),
            annotated_text: d.text.clone(),
            calls,
        }
    }

    /// "a1": an arithmetic document whose one site is the "70" of "so 70 in total".
    fn apples() -> DemoDoc {
        let t = "Anna sold 30 apples on Monday and 40 on Tuesday, so 70 in total.";
        let site = site(ToolKind::Calculator, t, "70", "30 + 40");
        doc("a1", DocKind::Arithmetic, t, vec![site])
    }

    /// "a2": an arithmetic document whose one site is the "25" of "(or 25%)".
    fn voters() -> DemoDoc {
        let t = "Out of 1400 voters, 350 (or 25%) voted.";
        let site = site(ToolKind::Calculator, t, "25", "350 / 1400 * 100");
        doc("a2", DocKind::Arithmetic, t, vec![site])
    }

    #[test]
    fn numbers_after_a_position() {
        let t = "so 70 in total, 2.5 each, 3. Done";
        assert_eq!(number_after(t, 2), Some(70.0));
        assert_eq!(number_after(t, 3), Some(70.0));
        assert_eq!(number_after(t, 4), None, "inside 70");
        assert_eq!(number_after(t, 15), Some(2.5));
        assert_eq!(number_after(t, 17), None, "inside 2.5, before its point");
        assert_eq!(number_after(t, 18), None, "inside 2.5, after its point");
        assert_eq!(
            number_after("3 5", 1),
            Some(5.0),
            "after a number, before another"
        );
        assert_eq!(
            number_after("x 3.", 4),
            None,
            "after a number's full stop: no number"
        );
        assert_eq!(number_after(".5", 0), None, "a number starts with a digit");
        assert_eq!(number_after(".5", 1), Some(5.0));
        assert_eq!(number_after("é 7", 2), Some(7.0));
        assert_eq!(
            number_after(t, 25),
            Some(3.0),
            "a full stop is not a decimal part"
        );
        assert_eq!(number_after(t, 0), None);
        assert_eq!(number_after(t, 1000), None);
        assert_eq!(number_after("a ä", 3), None, "not a char boundary");
        assert!(result_matches_text("25", "(or 25%)", 3));
        assert!(result_matches_text("25.0", "(or 25%)", 3));
        assert!(!result_matches_text("26", "(or 25%)", 3));
        assert!(
            !result_matches_text("25", "(or 25%)", 0),
            "text has \"(\" first"
        );
        assert!(!result_matches_text("Today is Monday.", "x 25", 1));
        assert!(
            !result_matches_text("0", t, 4),
            "a call inside 70 does not stand before a 0"
        );
    }

    #[test]
    fn metrics_on_hand_made_records() {
        let (d1, d2) = (apples(), voters());
        let t1 = d1.text.clone();
        let t3 = "Bus 12 to the park runs every 7 minutes and stops 9 times.";
        let d3 = doc("c1", DocKind::Control, t3, vec![]);
        let t4 = "Bus 13 to the park runs every 8 minutes and stops 5 times.";
        let d4 = doc("c2", DocKind::Control, t4, vec![]);
        let t5 = "The council met today, a Sunday, to discuss the budget.";
        let d5 = doc(
            "k1",
            DocKind::Calendar,
            t5,
            vec![site(ToolKind::Calendar, t5, "Sunday", "")],
        );
        let t6 = "The train left the station on time.";
        let d6 = doc("p1", DocKind::Plain, t6, vec![]);
        let s1 = d1.sites[0].clone();
        let s2 = d2.sites[0].clone();
        let records = vec![
            // A kept correct call at the site's offset, and a kept wrong one elsewhere.
            record(
                1,
                &d1,
                vec![
                    call("Calculator", s1.offset, "70", true),
                    call("Calculator", t1.find("40").unwrap() - 1, "12", true),
                    call("Calculator", 4, "70", false),
                ],
            ),
            // A kept correct call at the answer's offset (no space before it).
            record(
                2,
                &d2,
                vec![call("Calculator", s2.answer_offset, "25", true)],
            ),
            // A control document with a kept call (correct by accident) and one without.
            record(3, &d3, vec![call("Calculator", 3, "12", true)]),
            record(4, &d4, vec![call("Calculator", 3, "13", false)]),
            // A kept calendar call at the site; a calculator call that was not kept.
            record(
                5,
                &d5,
                vec![call("Calendar", d5.sites[0].offset, "Today is ...", true)],
            ),
            record(6, &d6, vec![]),
            // Not a document of the set.
            CStarRecord {
                id: json!("other"),
                ..record(7, &d6, vec![call("Calculator", 1, "1", true)])
            },
        ];
        let docs = [d1, d2, d3, d4, d5, d6];
        let m = evaluate(&docs, &records);
        assert_eq!((m.docs, m.records, m.unmatched_records), (6, 6, 1));
        let c = &m.calculator;
        assert_eq!((c.kept, c.correct), (4, 3));
        assert_eq!(c.precision, Some(0.75));
        assert_eq!((c.sites, c.sites_hit, c.recall), (2, 2, Some(1.0)));
        // The control document's call restates the number after it, away from any site:
        // correct, not at a site.
        assert_eq!((c.correct_at_sites, c.precision_at_sites), (2, Some(0.5)));
        assert_eq!((c.sites_hit_right, c.recall_right), (2, Some(1.0)));
        assert_eq!(
            (c.control_docs, c.control_with_calls, c.control_rate),
            (2, 1, Some(0.5))
        );
        let k = &m.calendar;
        assert_eq!(
            (k.kept, k.sites, k.sites_hit, k.recall),
            (1, 1, 1, Some(1.0))
        );
        let t = targets(&m);
        assert_eq!(
            t.iter().map(|t| t.pass).collect::<Vec<_>>(),
            [false, true, false]
        );

        // A call near the site but at neither offset does not count; missing records keep
        // nothing.
        let near = vec![record(
            1,
            &docs[0],
            vec![call("Calculator", s1.offset - 1, "70", true)],
        )];
        let m = evaluate(&docs, &near);
        assert_eq!(m.calculator.sites_hit, 0);
        assert_eq!(m.calculator.correct, 0, "\"s 70\": not a number first");
        assert_eq!(m.records, 1);
        assert_eq!(m.calendar.recall, Some(0.0));
        // A call at the site with a wrong result hits the site, not with its answer.
        let wrong = vec![record(
            1,
            &docs[0],
            vec![call("Calculator", s1.offset, "71", true)],
        )];
        let c = evaluate(&docs, &wrong).calculator;
        assert_eq!((c.sites_hit, c.sites_hit_right), (1, 0));
        assert_eq!((c.correct, c.correct_at_sites), (0, 0));

        // Without the filter every scored call counts as kept, whatever its flag; an unscored
        // one (a failed tool, a loss that is not finite) still does not.
        let mut records = records;
        let mut failed = call("Calculator", s2.offset, "25", false);
        (failed.result, failed.l_call_result, failed.delta) = (None, None, None);
        let mut overflowed = call("Calculator", 3, "13", false);
        overflowed.l_call = Some(f64::INFINITY);
        records[1].calls.push(failed);
        records[3].calls.push(overflowed);
        let all = unfiltered(&records);
        assert_eq!(all[0].calls.iter().filter(|c| c.kept).count(), 3);
        assert!(!all[1].calls[1].kept && !all[3].calls[1].kept);
        let m = evaluate(&docs, &all);
        let c = &m.calculator;
        assert_eq!(
            (c.kept, c.correct),
            (6, 4),
            "the two unkept calls of a1 and c2 count"
        );
        assert_eq!((c.control_docs, c.control_with_calls), (2, 2));
        assert!(!records[0].calls[2].kept, "the records are not changed");
    }

    /// A C* line that is not a record is named by its line number (blank lines counted).
    #[test]
    fn read_cstar_names_the_bad_line() {
        let docs = crate::demo::corpus::generate(5, 2);
        let good = serde_json::to_string(&record(1, &docs[0], vec![])).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        std::fs::write(&path, format!("{good}\n\n{{\"line\": 2}}\n{good}\n")).unwrap();
        let e = read_cstar(&path).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}:3: ", path.display())), "{e}");
        std::fs::write(&path, format!("{good}\n\n{good}\n")).unwrap();
        assert_eq!(read_cstar(&path).unwrap().len(), 2);
    }

    #[test]
    fn nothing_kept_means_no_precision_and_misses() {
        let docs = crate::demo::corpus::generate(5, 30);
        let records: Vec<CStarRecord> = docs
            .iter()
            .enumerate()
            .map(|(i, d)| record(i as u64 + 1, d, vec![]))
            .collect();
        let m = evaluate(&docs, &records);
        assert_eq!(m.calculator.precision, None);
        assert_eq!(m.calculator.recall, Some(0.0));
        let t = targets(&m);
        assert!(!t[0].pass && !t[1].pass);
        assert_eq!(t[2].pass, m.calculator.control_docs > 0);
        let summary = crate::annotate::summary::SummaryBuilder::new(&[ToolKind::Calculator.into()])
            .finish(1.5);
        let report = EvalReport::new(5, m, &summary, 2.0, Path::new("c.jsonl"));
        let text = report.render();
        assert!(text.contains("MISS") && text.contains("n/a"), "{text}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["metrics"]["calculator"]["precision"], json!(null));
        assert_eq!(json["tools"][0]["tool"], "Calculator");
        assert_eq!(json["held_out"], true);
        assert!(!text.contains("NOT held out"), "{text}");
        // The trainer's seed and the embedded corpus's are not held out, and say so.
        for seed in [crate::demo::TRAIN_SEED, crate::demo::DEMO_CORPUS_SEED] {
            let report =
                EvalReport::new(seed, report.metrics.clone(), &summary, 2.0, Path::new("c"));
            assert!(!report.held_out);
            assert!(
                report.render().contains("NOT held out"),
                "{}",
                report.render()
            );
        }
    }

    /// A result a little off the number the text writes is no match: "compared as numbers"
    /// means equal up to rounding, not within a relative tolerance a miscount would pass.
    #[test]
    fn a_result_near_the_written_number_is_no_match() {
        assert!(!result_matches_text("1401", "so 1400 in all", 2));
        assert!(!result_matches_text("1400.5", "so 1400 in all", 2));
        assert!(result_matches_text("1400.0", "so 1400 in all", 2));
        // A result is read as the number it writes, whitespace around it aside.
        assert!(result_matches_text(" 1400\n", "so 1400 in all", 2));
    }

    /// One arithmetic site with a kept call of the wrong result at it and a kept call restating
    /// "30" elsewhere: the site is hit, not with its answer (the right call is not at it); a
    /// second site without calls halves recall_right, whose denominator is every site.
    #[test]
    fn recall_right_needs_the_right_call_at_the_site_over_every_site() {
        let (d1, d2) = (apples(), voters());
        let t1 = d1.text.clone();
        let at = d1.sites[0].offset;
        let wrong_at_site = vec![record(
            1,
            &d1,
            vec![
                call("Calculator", at, "71", true),
                call("Calculator", t1.find("30").unwrap() - 1, "30", true),
            ],
        )];
        let docs = [d1.clone(), d2.clone()];
        let c = evaluate(&docs, &wrong_at_site).calculator;
        assert_eq!((c.sites_hit, c.sites_hit_right, c.correct), (1, 0, 1));
        let right_at_site = vec![record(1, &d1, vec![call("Calculator", at, "70", true)])];
        let c = evaluate(&docs, &right_at_site).calculator;
        assert_eq!((c.sites, c.sites_hit, c.sites_hit_right), (2, 1, 1));
        assert_eq!((c.recall, c.recall_right), (Some(0.5), Some(0.5)));
    }

    /// The control rate counts documents, not calls, and only Calculator calls: a control
    /// document with two kept calls is one, one with only a kept Calendar call is none.
    #[test]
    fn control_rate_counts_documents_with_a_kept_calculator_call() {
        let t1 = "Bus 12 to the park runs every 7 minutes and stops 9 times.";
        let t2 = "Bus 13 to the park runs every 8 minutes and stops 5 times.";
        let t3 = "Bus 14 to the park runs every 6 minutes and stops 4 times.";
        let docs = [
            doc("c1", DocKind::Control, t1, vec![]),
            doc("c2", DocKind::Control, t2, vec![]),
            doc("c3", DocKind::Control, t3, vec![]),
        ];
        let records = vec![
            record(
                1,
                &docs[0],
                vec![
                    call("Calculator", 3, "12", true),
                    call("Calculator", 29, "7", true),
                ],
            ),
            record(2, &docs[1], vec![call("Calendar", 3, "Today is ...", true)]),
            record(3, &docs[2], vec![]),
        ];
        let m = evaluate(&docs, &records);
        let c = &m.calculator;
        assert_eq!((c.kept, c.control_docs, c.control_with_calls), (2, 3, 1));
        assert_eq!(c.control_rate, Some(1.0 / 3.0));
        assert_eq!(m.calendar.kept, 1);
    }

    /// A kept Calculator call restating a number at a Calendar site ("2021") is correct but at
    /// no arithmetic site: precision_at_sites counts Calculator sites only.
    #[test]
    fn a_calculator_call_at_a_calendar_site_is_not_at_a_site() {
        let t = "The year is 2021 and the fair opens soon.";
        let d = doc(
            "k1",
            DocKind::Calendar,
            t,
            vec![site(ToolKind::Calendar, t, "2021", "")],
        );
        let at = d.sites[0].offset;
        let records = vec![record(1, &d, vec![call("Calculator", at, "2021", true)])];
        let c = evaluate(&[d], &records).calculator;
        assert_eq!((c.kept, c.correct, c.correct_at_sites), (1, 1, 0));
        assert_eq!(c.precision_at_sites, Some(0.0));
    }

    /// Calls are checked against the record's "text", which their positions index, not against
    /// "annotated_text", where the inserted calls shift everything after them.
    #[test]
    fn results_are_read_against_the_text_not_the_annotated_text() {
        let d = apples();
        let t = d.text.clone();
        let at = d.sites[0].offset;
        let mut r = record(1, &d, vec![call("Calculator", at, "70", true)]);
        r.annotated_text = format!("{} [Calculator(30 + 40) → 70]{}", &t[..at], &t[at..]);
        let c = evaluate(&[d], &[r]).calculator;
        assert_eq!((c.correct, c.sites_hit_right), (1, 1));
    }

    /// A record whose id is no document's id is unmatched, a number as much as a string.
    #[test]
    fn a_record_with_a_number_for_its_id_is_unmatched() {
        let d = doc("p1", DocKind::Plain, "The train left on time.", vec![]);
        let numbered = CStarRecord {
            id: json!(1),
            ..record(2, &d, vec![])
        };
        let m = evaluate(std::slice::from_ref(&d), &[record(1, &d, vec![]), numbered]);
        assert_eq!((m.records, m.unmatched_records), (1, 1));
    }

    /// Without the filter a call counts when all three losses are finite: a non-finite L_none
    /// (the call's text without it overflowed) leaves it unscored, as L_call's does.
    #[test]
    fn unfiltered_needs_a_finite_l_none_too() {
        let d = doc("p1", DocKind::Plain, "The train left at 9 sharp.", vec![]);
        let mut bad_none = call("Calculator", 1, "9", false);
        bad_none.l_none = Some(f64::NAN);
        let mut no_none = call("Calculator", 2, "9", false);
        no_none.l_none = None;
        let all = unfiltered(&[record(
            1,
            &d,
            vec![bad_none, no_none, call("Calculator", 3, "9", false)],
        )]);
        let kept: Vec<bool> = all[0].calls.iter().map(|c| c.kept).collect();
        assert_eq!(kept, [false, false, true]);
    }

    /// A metric exactly at its bound meets the target (">=" and "<="), and site recall is the
    /// recall of any kept call at the site, not the stricter recall_right.
    #[test]
    fn targets_pass_at_their_bounds_on_the_plain_recall() {
        let docs = crate::demo::corpus::generate(5, 4);
        let mut m = evaluate(&docs, &[]);
        m.calculator.precision = Some(PRECISION_TARGET);
        m.calculator.recall = Some(RECALL_TARGET);
        m.calculator.recall_right = Some(0.0);
        m.calculator.control_rate = Some(CONTROL_TARGET);
        let t = targets(&m);
        assert_eq!(t[1].value, Some(RECALL_TARGET));
        let ops: Vec<&str> = t.iter().map(|t| t.op.as_str()).collect();
        assert_eq!(ops, [">=", ">=", "<="]);
        assert_eq!(t.iter().map(|t| t.pass).collect::<Vec<_>>(), [true; 3]);
        m.calculator.control_rate = Some(CONTROL_TARGET + 1e-9);
        assert!(!targets(&m)[2].pass);
    }

    /// A calendar document with a site at "Sunday" and one at "Monday".
    fn calendar_doc_with_two_sites() -> DemoDoc {
        let t = "The council met today, a Sunday, and on Monday.";
        doc(
            "k1",
            DocKind::Calendar,
            t,
            vec![
                site(ToolKind::Calendar, t, "Sunday", ""),
                site(ToolKind::Calendar, t, "Monday", ""),
            ],
        )
    }

    /// The report's per-tool counts are the summary's sampled, executed and kept, its
    /// annotate_secs the summary's wall time (not the command's), and the table prints the
    /// calendar's kept calls and hit sites each where they belong.
    #[test]
    fn the_report_takes_the_summarys_counts_and_times() {
        let d = calendar_doc_with_two_sites();
        let at = d.sites[0].offset;
        let records = vec![record(
            1,
            &d,
            vec![
                call("Calendar", at, "Today is ...", true),
                call("Calendar", 2, "Today is ...", true),
                call("Calendar", 5, "Today is ...", true),
            ],
        )];
        let m = evaluate(&[d], &records);
        let mut summary =
            crate::annotate::summary::SummaryBuilder::new(&[ToolKind::Calendar.into()]).finish(1.5);
        let stats = &mut summary.tools[0].stats;
        (stats.calls_sampled, stats.calls_executed, stats.calls_kept) = (7, 5, 3);
        let report = EvalReport::new(5, m, &summary, 2.0, Path::new("c.jsonl"));
        assert_eq!(report.annotate_secs, 1.5);
        assert_eq!(report.wall_secs, 2.0);
        let c = &report.tools[0];
        assert_eq!((c.sampled, c.executed, c.kept), (7, 5, 3));
        let text = report.render();
        assert!(
            text.contains("(3 kept calls; 1 of 2 calendar sites have one)"),
            "{text}"
        );
    }

    /// The table prints each count where its words say: of the kept calls, of the sites, of
    /// the control documents, and the run without the filter.
    #[test]
    fn the_table_prints_each_count_in_its_place() {
        let docs = crate::demo::corpus::generate(5, 4);
        let mut m = evaluate(&docs, &[]);
        let c = &mut m.calculator;
        (c.correct, c.kept, c.correct_at_sites) = (3, 4, 2);
        (c.sites_hit, c.sites, c.sites_hit_right) = (5, 6, 1);
        (c.control_with_calls, c.control_docs) = (7, 9);
        let summary = crate::annotate::summary::SummaryBuilder::new(&[ToolKind::Calculator.into()])
            .finish(1.5);
        let mut report = EvalReport::new(5, m.clone(), &summary, 2.0, Path::new("c.jsonl"));
        let mut all = m;
        (all.calculator.correct, all.calculator.kept) = (10, 11);
        report.unfiltered = Some(all);
        let text = report.render();
        for want in [
            "(3 of 4 kept calls write their result next)",
            "(2 of them stand at an arithmetic site)",
            "(5 of 6 arithmetic sites have a kept call)",
            "(1 of them have one whose result is the answer)",
            "(7 of 9 control documents have a kept call)",
            "without the filter (every scored call kept): precision n/a (10 of 11)",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
    }

    /// "docs" is every document of the set and "records" those with a C* record: a document
    /// without one counts in the first, not the second; a record whose id is a document's is
    /// not unmatched, even when two records carry that id.
    #[test]
    fn documents_without_a_record_count_in_docs_only_and_a_repeated_id_is_matched() {
        let docs = crate::demo::corpus::generate(9, 12);
        let records: Vec<CStarRecord> = docs
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 3 != 1)
            .map(|(i, d)| record(i as u64 + 1, d, vec![]))
            .collect();
        let m = evaluate(&docs, &records);
        assert_eq!((m.docs, m.records, m.unmatched_records), (12, 8, 0));
        // A second record of the third document (a resumed run's duplicate) is not unmatched.
        let mut twice = records.clone();
        twice.push(record(99, &docs[2], vec![]));
        let m = evaluate(&docs, &twice);
        assert_eq!((m.docs, m.records, m.unmatched_records), (12, 8, 0));
    }

    /// Calendar recall is the share of calendar sites hit, not kept calls per site: three
    /// kept Calendar calls, one of them at one of two sites, is 0.5.
    #[test]
    fn calendar_recall_is_sites_hit_over_sites_not_kept_calls() {
        let d = calendar_doc_with_two_sites();
        let at = d.sites[1].answer_offset;
        let records = vec![record(
            1,
            &d,
            vec![
                call("Calendar", at, "Today is ...", true),
                call("Calendar", 3, "Today is ...", true),
                call("Calendar", 11, "Today is ...", true),
            ],
        )];
        let k = evaluate(&[d], &records).calendar;
        assert_eq!(
            (k.kept, k.sites, k.sites_hit, k.recall),
            (3, 2, 1, Some(0.5))
        );
    }

    /// Without the filter a call is kept exactly when it is scored, whatever its flag: one
    /// flagged kept whose L_none is not finite is not kept there.
    #[test]
    fn unfiltered_drops_a_kept_call_that_is_not_scored() {
        let d = apples();
        let at = d.sites[0].offset;
        let mut unscored = call("Calculator", at, "70", true);
        unscored.l_none = Some(f64::INFINITY);
        let r = record(1, &d, vec![unscored, call("Calculator", 9, "30", false)]);
        let all = unfiltered(std::slice::from_ref(&r));
        let kept: Vec<bool> = all[0].calls.iter().map(|c| c.kept).collect();
        assert_eq!(kept, [false, true]);
        let c = evaluate(std::slice::from_ref(&d), &all).calculator;
        assert_eq!((c.kept, c.sites_hit), (1, 0));
    }

    /// The report lists the tools in the summary's order, and names the C* file by its whole
    /// path as given.
    #[test]
    fn the_report_keeps_the_summarys_tool_order_and_the_whole_cstar_path() {
        let docs = crate::demo::corpus::generate(5, 4);
        let tools: [crate::annotate::ToolName; 2] =
            [ToolKind::Calendar.into(), ToolKind::Calculator.into()];
        let mut summary = crate::annotate::summary::SummaryBuilder::new(&tools).finish(1.5);
        summary.tools[0].stats.calls_sampled = 4;
        summary.tools[1].stats.calls_sampled = 9;
        let cstar = Path::new("runs").join("demo").join("c.jsonl");
        let report = EvalReport::new(5, evaluate(&docs, &[]), &summary, 2.0, &cstar);
        let named: Vec<(&str, u64)> = report
            .tools
            .iter()
            .map(|t| (t.tool.as_str(), t.sampled))
            .collect();
        assert_eq!(named, [("Calendar", 4), ("Calculator", 9)]);
        assert_eq!(report.cstar, cstar.display().to_string());
        assert!(report
            .render()
            .contains(&format!("; C* {}\n", cstar.display())));
    }

    /// The table's header, tool rows, values (three decimals), target rows (PASS only where
    /// the target holds), the run without the filter and the times, each in its place; the
    /// tool-use line comes last.
    #[test]
    fn the_table_prints_header_rows_targets_and_times_in_their_places() {
        let (d1, d2) = (apples(), voters());
        let t3 = "Bus 12 to the park runs every 7 minutes and stops 9 times.";
        let t4 = "Bus 13 to the park runs every 8 minutes and stops 5 times.";
        let t5 = "Bus 14 to the park runs every 6 minutes and stops 4 times.";
        let docs = [
            d1.clone(),
            d2,
            doc("c1", DocKind::Control, t3, vec![]),
            doc("c2", DocKind::Control, t4, vec![]),
            doc("c3", DocKind::Control, t5, vec![]),
        ];
        let at = d1.sites[0].offset;
        let records = vec![
            record(
                1,
                &docs[0],
                vec![
                    call("Calculator", at, "70", true),
                    call("Calculator", 9, "12", true),
                    call("Calculator", 9, "12", false),
                ],
            ),
            record(3, &docs[2], vec![]),
            record(4, &docs[3], vec![call("Calculator", 3, "13", false)]),
            record(5, &docs[4], vec![]),
        ];
        let m = evaluate(&docs, &records);
        let mut all = unfiltered(&records);
        all[1].calls.push(call("Calculator", 3, "12", false));
        let all = unfiltered(&all);
        let mut summary = crate::annotate::summary::SummaryBuilder::new(&[
            ToolKind::Calculator.into(),
            ToolKind::Calendar.into(),
        ])
        .finish(1.25);
        let stats = &mut summary.tools[0].stats;
        (stats.calls_sampled, stats.calls_executed, stats.calls_kept) = (17, 12, 2);
        let mut report = EvalReport::new(5, m, &summary, 3.5, Path::new("c.jsonl"));
        report.unfiltered = Some(evaluate(&docs, &all));
        report.tool_use = Some(crate::demo::tool_use::ToolUseReport {
            prompts: 4,
            correct_with_tools: 3,
            correct_without_tools: 1,
            calls_made: 4,
            calls_with_result: 4,
            accuracy_with_tools: Some(0.75),
            accuracy_without_tools: Some(0.25),
            secs: 0.5,
            examples: vec![],
        });
        let text = report.render();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0], "eval-demo: seed 5, 5 documents (4 in C*)",
            "{text}"
        );
        assert_eq!(lines[2], "Calculator        17        12      2", "{text}");
        assert_eq!(lines[3], "Calendar           0         0      0", "{text}");
        for want in [
            "calculator precision   0.500  (1 of 2 kept calls",
            "site recall            0.500  (1 of 2 arithmetic sites",
            "control rate           0.000  (0 of 3 control documents",
            "target calculator_precision  >= 0.9   0.500  MISS\n",
            "target site_recall           >= 0.5   0.500  PASS\n",
            "target control_rate          <= 0.05  0.000  PASS\n",
            "precision 0.600 (3 of 5), recall 0.500, control rate 0.667 (2 of 3)\n",
            "time: annotate 1.25s, wall 3.50s; C* c.jsonl\n",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        let last = lines.last().unwrap();
        assert!(
            last.starts_with("tool use (generate, greedy, same 4 "),
            "{text}"
        );
    }

    /// A line of spaces in a C* file is blank, as an empty one is: skipped, and counted in
    /// the line numbers of the lines after it.
    #[test]
    fn read_cstar_skips_a_line_of_whitespace() {
        let docs = crate::demo::corpus::generate(5, 2);
        let good = serde_json::to_string(&record(1, &docs[0], vec![])).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.jsonl");
        std::fs::write(&path, format!("{good}\n  \t\n{good}\n")).unwrap();
        assert_eq!(read_cstar(&path).unwrap().len(), 2);
        std::fs::write(&path, format!("{good}\n  \nnot json\n")).unwrap();
        let e = read_cstar(&path).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}:3: ", path.display())), "{e}");
    }
}
