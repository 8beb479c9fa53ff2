//! The synthetic demo corpus: short documents where a calculator or a calendar helps, and
//! documents where neither does, generated from a seed.
//!
//! Four kinds of documents (shares in [`generate`]):
//! - **arithmetic**: one or two sentences whose last number is the result of arithmetic on
//!   numbers written before it: a share ("Out of 1400 participants, 350 (or 25%) passed"), a
//!   running total, a unit price, a difference, an even split, an age from the document's year.
//!   Every result is exact (no rounding), so the calculator's answer is the number the text
//!   writes;
//! - **calendar**: a sentence that states the document's own weekday, month or year, which
//!   only its date (the Calendar tool) tells;
//! - **control**: sentences with at least three numbers of which none is the sum, difference,
//!   product, quotient or percentage of two earlier ones;
//! - **plain**: sentences without numbers.
//!
//! Each document records its *sites*: where a call belongs (the byte offset the annotate driver
//! splices a call at), the tool, the call's input and the answer the text writes there. The
//! trainer turns documents into training sequences ([`training_sequences`]); `eval-demo`
//! compares what the annotate run keeps with the sites.
//!
//! Deterministic: the same seed gives the same documents, byte for byte, on every machine
//! (toolsift's own SplitMix64, no floating point in the choices).

use serde_json::{json, Value};

use crate::annotate::splice::splice;
use crate::annotate::tool_kind::ToolKind;
use crate::annotate::tools::{evaluate, format_result, Date};
use crate::util::rng::Rng;

/// What a document is for. Any kind may end with one more sentence without numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DocKind {
    /// One or two sentences whose last number is the result of arithmetic on numbers written
    /// before it: one Calculator site per sentence.
    Arithmetic,
    /// A sentence stating the document's weekday, month or year: one Calendar site.
    Calendar,
    /// Three numbers, none the sum, difference, product, quotient or percentage of two earlier
    /// ones: no site, so a kept Calculator call there is a false positive.
    Control,
    /// A sentence without numbers: no site.
    Plain,
}

impl DocKind {
    /// The name in a corpus line's "kind": "arithmetic", "calendar", "control" or "plain".
    pub fn name(self) -> &'static str {
        match self {
            DocKind::Arithmetic => "arithmetic",
            DocKind::Calendar => "calendar",
            DocKind::Control => "control",
            DocKind::Plain => "plain",
        }
    }

    /// The kind whose [`name`](Self::name) is `name` (exactly, lowercase); None for any other.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            DocKind::Arithmetic,
            DocKind::Calendar,
            DocKind::Control,
            DocKind::Plain,
        ]
        .into_iter()
        .find(|k| k.name() == name)
    }
}

/// A place where a call helps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Site {
    /// The tool whose call belongs here: Calculator or Calendar (the corpus line's "tool" is
    /// its key, "calculator" or "calendar").
    pub tool: ToolKind,
    /// Byte offset where the call is spliced: the space before the answer (the annotate driver
    /// puts a call before the whitespace that precedes a word).
    pub offset: usize,
    /// Byte offset of the answer itself (`offset + 1`).
    pub answer_offset: usize,
    /// The text written at the answer: "25", "Monday".
    pub answer: String,
    /// The call's input: "350 / 1400 * 100"; empty for the calendar.
    pub input: String,
}

impl Site {
    /// The call as the prompt's examples write it: "[Calculator(350 / 1400 * 100)]".
    pub fn call(&self) -> String {
        format!("[{}({})]", self.tool.call_name(), self.input)
    }

    /// The call with its result, as C* writes it: "[Calculator(350 / 1400 * 100) -> 25]".
    pub fn call_with_result(&self, date: Date) -> String {
        format!(
            "[{}({}) -> {}]",
            self.tool.call_name(),
            self.input,
            self.result(date)
        )
    }

    /// What the tool returns for this call.
    pub fn result(&self, date: Date) -> String {
        match self.tool {
            ToolKind::Calendar => date.render(),
            _ => evaluate(&self.input)
                .ok()
                .map(format_result)
                .unwrap_or_default(),
        }
    }
}

/// The number written at `position` of `text` after optional whitespace: ASCII digits with an
/// optional "." and more digits. None if there is none, if `position` is inside a number (a
/// call between the "7" and the "0" of "70" does not stand before a number "0": each digit is a
/// token, so a call can be sampled there), or if `position` is not in the text.
pub fn number_after(text: &str, position: usize) -> Option<f64> {
    let before = text.get(..position)?.as_bytes();
    let after = &text.as_bytes()[position..];
    // Digits on both sides of the position, or of a decimal point at it.
    let inside = match (before, after) {
        ([.., d], [n, ..]) if d.is_ascii_digit() && n.is_ascii_digit() => true,
        ([.., d], [b'.', n, ..]) if d.is_ascii_digit() && n.is_ascii_digit() => true,
        ([.., d, b'.'], [n, ..]) if d.is_ascii_digit() && n.is_ascii_digit() => true,
        _ => false,
    };
    if inside {
        return None;
    }
    let rest = text[position..].trim_start();
    let b = rest.as_bytes();
    let int = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if int == 0 {
        return None;
    }
    let mut end = int;
    if b.get(int) == Some(&b'.') {
        let frac = b[int + 1..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        if frac > 0 {
            end = int + 1 + frac;
        }
    }
    rest[..end].parse().ok()
}

/// One generated document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoDoc {
    /// `demo-<seed>-<i>`, i the 0-based place in the generated set (the corpus line's "id").
    pub id: String,
    /// What the document is for (the corpus line's "kind", as [`DocKind::name`]).
    pub kind: DocKind,
    /// The text annotate reads (the corpus line's "text"); the sites' offsets are bytes into it.
    pub text: String,
    /// The date the document was written (the Calendar tool's answer).
    pub date: Date,
    /// Where calls belong, in text order; empty for control and plain documents (the corpus
    /// line's "sites", without `answer_offset`, which is always `offset + 1`).
    pub sites: Vec<Site>,
}

impl DemoDoc {
    /// The corpus line `toolsift annotate` reads, with the ground truth alongside:
    /// {"id", "text", "date", "kind", "sites": [{"tool", "offset", "answer", "input"}]}.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "text": self.text,
            "date": self.date.to_string(),
            "kind": self.kind.name(),
            "sites": self.sites.iter().map(|s| json!({
                "tool": s.tool.key(),
                "offset": s.offset,
                "answer": s.answer,
                "input": s.input,
            })).collect::<Vec<_>>(),
        })
    }

    /// The text with calls at the sites `keep` selects: with their results (C*'s form) or
    /// without (the annotation prompt's form).
    pub fn annotated(&self, keep: impl Fn(&Site) -> bool, with_results: bool) -> String {
        let calls: Vec<(usize, String)> = self
            .sites
            .iter()
            .filter(|s| keep(s))
            .map(|s| {
                let call = if with_results {
                    s.call_with_result(self.date)
                } else {
                    s.call()
                };
                (s.offset, call)
            })
            .collect();
        splice(&self.text, &calls)
    }
}

/// The demo's annotation prompt for a tool: short, because P(x) holds x twice and the demo
/// model has 256 positions. `{x}` marks the text, as in `[per_tool.<tool>] prompt`.
pub fn demo_prompt(tool: ToolKind) -> String {
    format!("Add {} calls.\nInput: {{x}}\nOutput: ", tool.call_name())
}

/// The tools the demo corpus is written for.
pub const DEMO_TOOLS: [ToolKind; 2] = [ToolKind::Calculator, ToolKind::Calendar];

/// `n` documents from `seed`: 45% arithmetic, 20% calendar, 20% control, 15% plain.
pub fn generate(seed: u64, n: usize) -> Vec<DemoDoc> {
    let mut rng = Rng::new(seed ^ 0xD3E0_C0B5);
    (0..n)
        .map(|i| {
            let roll = rng.range(0, 99);
            let kind = match roll {
                0..=44 => DocKind::Arithmetic,
                45..=64 => DocKind::Calendar,
                65..=84 => DocKind::Control,
                _ => DocKind::Plain,
            };
            let doc = document(&mut rng, kind);
            DemoDoc {
                id: format!("demo-{seed}-{i}"),
                ..doc
            }
        })
        .collect()
}

/// One training sequence: text pieces that are tokenized separately and concatenated, as the
/// annotate driver builds P(x) ++ x (the prompt's text before "{x}", x, the text after, ...).
pub type Pieces = Vec<String>;

/// Training sequences from `n` documents of `seed`. Each document gives two:
/// - C*'s form: the text with calls and results at a random 80% of its sites (so the model
///   learns to propose calls where they belong, and to use a result that precedes a number);
/// - the annotation prompt's form for one tool: P(x) followed by x with that tool's calls
///   written without results (what the position and call sampling steps condition on).
pub fn training_sequences(seed: u64, n: usize) -> Vec<Pieces> {
    let docs = generate(seed, n);
    let mut rng = Rng::new(seed ^ 0x7EA1_17E5);
    let mut out = Vec::with_capacity(2 * docs.len());
    for doc in &docs {
        let picks: Vec<bool> = doc.sites.iter().map(|_| rng.range(0, 9) < 8).collect();
        let with_results = doc.annotated(|s| picks[site_index(doc, s)], true);
        out.push(vec![with_results]);
        let tool = match doc.kind {
            DocKind::Arithmetic => ToolKind::Calculator,
            DocKind::Calendar => ToolKind::Calendar,
            _ => DEMO_TOOLS[rng.range(0, 1)],
        };
        out.push(prompt_pieces(doc, tool));
    }
    out
}

/// Texts to train the tokenizer on: every training sequence, joined.
pub fn tokenizer_texts(seed: u64, n: usize) -> Vec<String> {
    training_sequences(seed, n)
        .into_iter()
        .map(|p| p.concat())
        .collect()
}

/// P(x) for `tool` and the continuation: x with the tool's calls, results left out.
fn prompt_pieces(doc: &DemoDoc, tool: ToolKind) -> Pieces {
    let prompt = demo_prompt(tool);
    let (before, after) = prompt.split_once("{x}").expect("demo prompt has {x}");
    vec![
        before.to_string(),
        doc.text.clone(),
        after.to_string(),
        doc.annotated(|s| s.tool == tool, false),
    ]
}

fn site_index(doc: &DemoDoc, site: &Site) -> usize {
    doc.sites
        .iter()
        .position(|s| std::ptr::eq(s, site))
        .expect("site of this document")
}

// ---- Generation -------------------------------------------------------------------------------

/// Builds a text and its sites piece by piece.
struct Text {
    text: String,
    sites: Vec<Site>,
}

impl Text {
    fn new() -> Self {
        Text {
            text: String::new(),
            sites: Vec::new(),
        }
    }

    fn push(&mut self, s: &str) -> &mut Self {
        self.text.push_str(s);
        self
    }

    fn num(&mut self, n: u64) -> &mut Self {
        self.text.push_str(&n.to_string());
        self
    }

    /// " answer", with a site before the space.
    fn site(&mut self, tool: ToolKind, input: String, answer: &str) -> &mut Self {
        let offset = self.text.len();
        self.text.push(' ');
        self.sites.push(Site {
            tool,
            offset,
            answer_offset: offset + 1,
            answer: answer.to_string(),
            input,
        });
        self.text.push_str(answer);
        self
    }

    fn calc(&mut self, input: String, answer: u64) -> &mut Self {
        self.site(ToolKind::Calculator, input, &answer.to_string())
    }
}

fn pick<'a>(rng: &mut Rng, xs: &[&'a str]) -> &'a str {
    xs[rng.range(0, xs.len() - 1)]
}

const NAMES: [&str; 12] = [
    "Anna", "Ben", "Clara", "David", "Emma", "Felix", "Grace", "Hugo", "Ines", "Jonas", "Lena",
    "Marco",
];
const GROUPS: [&str; 8] = [
    "participants",
    "students",
    "visitors",
    "players",
    "members",
    "workers",
    "runners",
    "voters",
];
const ITEMS: [&str; 10] = [
    "apples", "books", "tickets", "chairs", "lamps", "cakes", "shirts", "bottles", "plants",
    "boxes",
];
const PLACES: [&str; 8] = [
    "the village",
    "the library",
    "the museum",
    "the market",
    "the school",
    "the club",
    "the harbor",
    "the park",
];
const DAYS: [&str; 5] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"];
const PLAIN: [&str; 12] = [
    "The weather was mild and the streets were quiet.",
    "Everyone agreed that the plan was a good one.",
    "The report was shared with the whole team.",
    "Nobody expected the meeting to run so long.",
    "The new bridge opened to great applause.",
    "Local shops stayed open late for the festival.",
    "The mayor thanked the volunteers for their help.",
    "Rain was expected later in the evening.",
    "The choir sang in the old church by the river.",
    "Children played in the square after school.",
    "The train left the station on time.",
    "A small crowd gathered to watch the parade.",
];

fn document(rng: &mut Rng, kind: DocKind) -> DemoDoc {
    let date = random_date(rng);
    let mut t = Text::new();
    match kind {
        DocKind::Arithmetic => {
            arithmetic(rng, &mut t, date);
            if rng.range(0, 2) == 0 {
                t.push(" ");
                arithmetic(rng, &mut t, date);
            }
        }
        DocKind::Calendar => calendar(rng, &mut t, date),
        DocKind::Control => control(rng, &mut t),
        DocKind::Plain => {
            t.push(pick(rng, &PLAIN));
        }
    }
    if rng.range(0, 1) == 0 {
        t.push(" ").push(pick(rng, &PLAIN));
    }
    DemoDoc {
        id: String::new(),
        kind,
        text: t.text,
        date,
        sites: t.sites,
    }
}

fn random_date(rng: &mut Rng) -> Date {
    loop {
        let (y, m, d) = (rng.range(2001, 2030), rng.range(1, 12), rng.range(1, 28));
        if let Some(date) = Date::new(y as u32, m as u32, d as u32) {
            return date;
        }
    }
}

fn arithmetic(rng: &mut Rng, t: &mut Text, date: Date) {
    let name = pick(rng, &NAMES);
    match rng.range(0, 5) {
        0 => {
            // A share: b a multiple of 20, p a multiple of 5, so a = b p / 100 is whole.
            let b = 20 * rng.range(2, 90) as u64;
            let p = 5 * rng.range(1, 19) as u64;
            let a = b * p / 100;
            let group = pick(rng, &GROUPS);
            let verb = pick(rng, &["passed", "stayed", "voted", "finished", "agreed"]);
            t.push("Out of ")
                .num(b)
                .push(" ")
                .push(group)
                .push(", ")
                .num(a);
            t.push(" (or")
                .calc(format!("{a} / {b} * 100"), p)
                .push("%) ")
                .push(verb)
                .push(".");
        }
        1 => {
            let (a, b) = (rng.range(3, 95) as u64, rng.range(3, 95) as u64);
            let item = pick(rng, &ITEMS);
            let d1 = rng.range(0, 3);
            t.push(name).push(" sold ").num(a).push(" ").push(item);
            t.push(" on ").push(DAYS[d1]).push(" and ").num(b);
            t.push(" on ").push(DAYS[d1 + 1]).push(", so");
            t.calc(format!("{a} + {b}"), a + b).push(" in total.");
        }
        2 => {
            let (p, n) = (rng.range(2, 40) as u64, rng.range(2, 12) as u64);
            let item = pick(rng, &ITEMS);
            t.push("Each of the ").push(item).push(" costs ").num(p);
            t.push(" dollars, so ").num(n).push(" of them cost");
            t.calc(format!("{p} * {n}"), p * n).push(" dollars.");
        }
        3 => {
            let a = rng.range(100, 900) as u64;
            let b = a + rng.range(10, 400) as u64;
            let place = pick(rng, &PLACES);
            let group = pick(rng, &GROUPS);
            t.push("The number of ")
                .push(group)
                .push(" at ")
                .push(place);
            t.push(" grew from ")
                .num(a)
                .push(" to ")
                .num(b)
                .push(", an increase of");
            t.calc(format!("{b} - {a}"), b - a).push(".");
        }
        4 => {
            let (n, q) = (rng.range(2, 12) as u64, rng.range(3, 40) as u64);
            let item = pick(rng, &ITEMS);
            t.push(name)
                .push(" shared ")
                .num(n * q)
                .push(" ")
                .push(item);
            t.push(" among ").num(n).push(" friends, so each got");
            t.calc(format!("{} / {n}", n * q), q).push(".");
        }
        _ => {
            // An age relative to the document's year.
            let year = date.year() as u64;
            let founded = year - rng.range(5, 120) as u64;
            let place = pick(rng, &PLACES);
            t.push("In ")
                .num(year)
                .push(", ")
                .push(place)
                .push(", founded in ");
            t.num(founded).push(", turned");
            t.calc(format!("{year} - {founded}"), year - founded)
                .push(".");
        }
    }
}

fn calendar(rng: &mut Rng, t: &mut Text, date: Date) {
    let weekday = date.weekday().name();
    let month = date.month_name();
    let year = date.year().to_string();
    let cal = |t: &mut Text, answer: &str| {
        t.site(ToolKind::Calendar, String::new(), answer);
    };
    match rng.range(0, 3) {
        0 => {
            t.push("The council met today, a");
            cal(t, weekday);
            t.push(", to discuss the budget.");
        }
        1 => {
            t.push("This note was written in");
            cal(t, month);
            t.push(" for ").push(pick(rng, &PLACES)).push(".");
        }
        2 => {
            t.push("The annual fair of");
            cal(t, &year);
            t.push(" opens at ").push(pick(rng, &PLACES)).push(".");
        }
        _ => {
            t.push("Today is a busy");
            cal(t, weekday);
            t.push(" at ").push(pick(rng, &PLACES)).push(".");
        }
    }
}

/// Numbers with no arithmetic relation: none is a + b, a - b, a * b, a / b or 100 a / b of two
/// numbers before it.
fn control(rng: &mut Rng, t: &mut Text) {
    loop {
        let mut nums = Vec::new();
        let mut s = Text::new();
        let place = pick(rng, &PLACES);
        match rng.range(0, 3) {
            0 => {
                let (a, b, c) = (rng.range(2, 30), rng.range(1900, 2020), rng.range(40, 900));
                nums.extend([a, b, c]);
                s.push("The team from ")
                    .push(place)
                    .push(" has ")
                    .num(a as u64);
                s.push(" players, a stadium built in ").num(b as u64);
                s.push(" and ").num(c as u64).push(" seats.");
            }
            1 => {
                let (a, b, c) = (rng.range(2, 99), rng.range(3, 30), rng.range(4, 40));
                nums.extend([a, b, c]);
                s.push("Bus ").num(a as u64).push(" to ").push(place);
                s.push(" runs every ")
                    .num(b as u64)
                    .push(" minutes and stops ");
                s.num(c as u64).push(" times.");
            }
            2 => {
                let (a, b, c) = (rng.range(2, 60), rng.range(10, 99), rng.range(1, 9));
                nums.extend([a, b, c]);
                s.push(pick(rng, &NAMES)).push(" is ").num(a as u64);
                s.push(" years old, lives at number ").num(b as u64);
                s.push(" and has ").num(c as u64).push(" cats.");
            }
            _ => {
                let (a, b, c) = (rng.range(1, 28), rng.range(100, 999), rng.range(2, 50));
                nums.extend([a, b, c]);
                s.push("On day ")
                    .num(a as u64)
                    .push(" the shop at ")
                    .push(place);
                s.push(" ordered item ")
                    .num(b as u64)
                    .push(" in ")
                    .num(c as u64);
                s.push(" colors.");
            }
        }
        if unrelated(&nums) {
            t.push(&s.text);
            return;
        }
    }
}

fn unrelated(nums: &[usize]) -> bool {
    nums.iter().enumerate().all(|(k, &c)| {
        let c = c as u64;
        nums[..k].iter().enumerate().all(|(i, &a)| {
            nums[..k].iter().enumerate().all(|(j, &b)| {
                let (a, b) = (a as u64, b as u64);
                i == j
                    || (a + b != c
                        && a.abs_diff(b) != c
                        && a * b != c
                        && !(b != 0 && a % b == 0 && a / b == c)
                        && !(b != 0 && (100 * a) % b == 0 && 100 * a / b == c))
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_documents() {
        assert_eq!(generate(7, 300), generate(7, 300));
        assert_ne!(generate(7, 50), generate(8, 50));
    }

    #[test]
    fn sites_point_at_their_answers_and_tools_agree() {
        for doc in generate(3, 2000) {
            for s in &doc.sites {
                assert_eq!(&doc.text[s.offset..s.offset + 1], " ", "{doc:?}");
                assert_eq!(
                    &doc.text[s.answer_offset..s.answer_offset + s.answer.len()],
                    s.answer
                );
                match s.tool {
                    ToolKind::Calculator => assert_eq!(s.result(doc.date), s.answer, "{doc:?}"),
                    _ => assert!(s.result(doc.date).contains(&s.answer), "{doc:?}"),
                }
            }
            match doc.kind {
                DocKind::Arithmetic => assert!(!doc.sites.is_empty()),
                DocKind::Calendar => assert_eq!(doc.sites.len(), 1),
                DocKind::Control => {
                    assert!(doc.sites.is_empty());
                    let n = doc.text.split(|c: char| !c.is_ascii_digit());
                    assert!(n.filter(|w| !w.is_empty()).count() >= 3);
                }
                DocKind::Plain => {
                    assert!(doc.sites.is_empty());
                    assert!(!doc.text.contains(|c: char| c.is_ascii_digit()));
                }
            }
        }
    }

    #[test]
    fn annotated_texts_use_the_splice_format() {
        let doc = generate(11, 200)
            .into_iter()
            .find(|d| d.kind == DocKind::Arithmetic && d.text.starts_with("Out of"))
            .expect("a share document");
        let s = doc.annotated(|_| true, true);
        assert!(s.contains(" (or [Calculator("), "{s}");
        assert!(s.contains(&format!(
            "* 100) -> {}] {}%)",
            doc.sites[0].answer, doc.sites[0].answer
        )));
        let p = doc.annotated(|_| true, false);
        assert!(p.contains("* 100)] "), "{p}");
    }

    #[test]
    fn training_sequences_are_deterministic() {
        let a = training_sequences(5, 100);
        assert_eq!(a, training_sequences(5, 100));
        assert_eq!(a.len(), 200);
        assert!(a
            .iter()
            .any(|p| p.len() == 4 && p[0].starts_with("Add Calculator")));
    }

    /// Each document gives two sequences, in order: C*'s form, with a result in every call and
    /// calls at about 80% of the sites over a set (docs/demo-model.md), and the annotation
    /// prompt's form for the document's own tool (a control or plain document's is drawn, so
    /// both occur): P(x)'s pieces around x, then x with calls and no results.
    #[test]
    fn training_sequences_pair_c_star_with_the_documents_own_prompt() {
        let docs = generate(5, 400);
        let seqs = training_sequences(5, 400);
        assert_eq!(seqs.len(), 2 * docs.len());
        let (mut sites, mut calls) = (0, 0);
        let mut drawn = std::collections::HashSet::new();
        for (doc, pair) in docs.iter().zip(seqs.chunks(2)) {
            let [cstar, prompt] = pair else {
                unreachable!()
            };
            assert_eq!(cstar.len(), 1);
            let n = cstar[0].matches(" -> ").count();
            assert_eq!(
                cstar[0].matches('[').count(),
                n,
                "every call has its result"
            );
            sites += doc.sites.len();
            calls += n;
            let tool = match doc.kind {
                DocKind::Arithmetic => ToolKind::Calculator,
                DocKind::Calendar => ToolKind::Calendar,
                _ => {
                    let t = DEMO_TOOLS
                        .into_iter()
                        .find(|t| prompt[0].starts_with(&format!("Add {} calls", t.call_name())))
                        .expect("a demo tool's prompt");
                    drawn.insert(t);
                    t
                }
            };
            let (before, after) = demo_prompt(tool)
                .split_once("{x}")
                .map(|(b, a)| (b.to_string(), a.to_string()))
                .unwrap();
            assert_eq!(prompt[..3], [before, doc.text.clone(), after], "{doc:?}");
            assert_eq!(prompt[3], doc.annotated(|_| true, false), "{doc:?}");
        }
        let share = calls as f64 / sites as f64;
        assert!((0.7..0.9).contains(&share), "{calls} of {sites} sites");
        assert_eq!(
            drawn.len(),
            2,
            "both tools' prompts for documents without sites"
        );
    }

    /// A control document's numbers are unrelated: none is the sum, difference, product,
    /// quotient or percentage of two earlier ones (no draw of the embedded corpus turns on the
    /// product, quotient or percentage check, so those are pinned here).
    #[test]
    fn unrelated_refuses_every_relation_to_two_earlier_numbers() {
        assert!(unrelated(&[7, 1999, 300]));
        for related in [[2, 3, 5], [9, 4, 5], [2, 3, 6], [8, 2, 4], [50, 200, 25]] {
            assert!(!unrelated(&related), "{related:?}");
        }
        for doc in generate(3, 2000) {
            if doc.kind == DocKind::Control {
                let nums: Vec<usize> = doc
                    .text
                    .split(|c: char| !c.is_ascii_digit())
                    .filter_map(|w| w.parse().ok())
                    .collect();
                assert!(unrelated(&nums), "{doc:?}");
            }
        }
    }

    /// A corpus line's "kind" is read back exactly: the four lowercase names, nothing else.
    #[test]
    fn doc_kinds_are_named_exactly() {
        for kind in [
            DocKind::Arithmetic,
            DocKind::Calendar,
            DocKind::Control,
            DocKind::Plain,
        ] {
            assert_eq!(DocKind::from_name(kind.name()), Some(kind));
        }
        for other in ["Arithmetic", "PLAIN", "", "arith"] {
            assert_eq!(DocKind::from_name(other), None, "{other}");
        }
    }

    /// C*'s form writes calls at 80% of the sites over a large set, not 70% or 90%
    /// (docs/demo-model.md): 4000 documents put the share within a few thousandths.
    #[test]
    fn c_star_training_sequences_call_at_four_in_five_sites() {
        let docs = generate(17, 4000);
        let seqs = training_sequences(17, 4000);
        let sites: usize = docs.iter().map(|d| d.sites.len()).sum();
        let calls: usize = seqs
            .chunks(2)
            .map(|p| p[0][0].matches(" -> ").count())
            .sum();
        let share = calls as f64 / sites as f64;
        assert!((0.77..0.83).contains(&share), "{calls} of {sites} sites");
    }

    /// The tokenizer learns from the very texts the model trains on: each training sequence's
    /// pieces joined as they are concatenated in training, with nothing between them.
    #[test]
    fn tokenizer_texts_are_the_training_sequences_concatenated() {
        let texts = tokenizer_texts(23, 60);
        let seqs = training_sequences(23, 60);
        assert_eq!(texts.len(), seqs.len());
        for (t, p) in texts.iter().zip(&seqs) {
            assert_eq!(*t, p.concat());
        }
        // "Output: " then the annotated text, not "Output:  " (a space added between pieces).
        assert!(texts
            .iter()
            .any(|t| t.contains("\nOutput: ") && !t.contains("Output:  ")));
    }

    /// Any whitespace before the number is skipped, a newline or a tab as much as a space.
    #[test]
    fn number_after_skips_newlines_and_tabs() {
        assert_eq!(number_after("so\n70 in all", 2), Some(70.0));
        assert_eq!(number_after("cost:\t 12.5 each", 5), Some(12.5));
        assert!(crate::demo::eval::result_matches_text(
            "70",
            "so\n70 in all",
            2
        ));
    }
}
