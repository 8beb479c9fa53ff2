//! One document through the whole pipeline, for every active tool: heuristics -> P(x) ->
//! positions -> sampled calls -> tools -> scoring -> filter -> splice. Everything a document's
//! result depends on is the document, the config and (seed, line number): never the batch it ran
//! in, so a resumed or sharded run writes the same bytes.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::calls::{cleaned_answer, input_only_ahead, input_problem, parse_call, Malformed};
use super::config::{AnnotateConfig, ToolParams};
use super::corpus::Document;
use super::tool_kind::ToolName;
use super::tools::{DocContext, ToolRegistry};
use super::{heuristics, positions, prompts, splice};
use crate::error::{Error, Result};
use crate::model::tokenizer::Encoding;
use crate::model::Tokenizer;
use crate::sample::{Branch, SampleOptions, Sampler};
use crate::score::{
    call_text, score_or_refuse, validate, LossWeights, ScoreOptions, Scorer, TextCandidate,
};
use crate::util::rng::Rng;

/// Keys a document's heuristic draw (`heuristics::applies`) apart from its sampling seed
/// (`doc_seed`, keyed by line and tool alone).
const HEURISTIC_KEY: u64 = 0x6865_7572_6973_7469;

/// One call of a C* line: every executed candidate, kept or not, with its scores for audit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallRecord {
    /// Byte offset into "text" where the call goes.
    pub position: usize,
    /// The tool's call name ("Calculator", "QA", a custom tool's name), as written in the call.
    pub tool: String,
    /// The call's input as sampled, between the parentheses.
    pub input: String,
    /// The tool's result; null when the tool failed.
    pub result: Option<String>,
    /// L_i(empty), the weighted loss with no call; null when the call has no scores.
    pub l_none: Option<f64>,
    /// L_i(e(c, eps)), the loss with the call but not its result; null when unscored.
    pub l_call: Option<f64>,
    /// L_i(e(c, r)), the loss with the call and its result (L+); null when unscored.
    pub l_call_result: Option<f64>,
    /// L- - L+ = min(l_none, l_call) - l_call_result; null when unscored.
    pub delta: Option<f64>,
    /// Whether the call passed the filter (delta >= the tool's tau_f) and is spliced into
    /// "annotated_text"; false for a call without scores.
    pub kept: bool,
    /// Why the call has no scores (tool failure, too long to score, a loss that is not finite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One line of C*.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CStarRecord {
    /// 1-based input line number (orders shards in `toolsift merge`).
    pub line: u64,
    /// The corpus document's "id" as given (string or integer), or null.
    pub id: Value,
    /// The document's text, unchanged (the whole of it, not only the head the tools read).
    pub text: String,
    /// "text" with the kept calls spliced in at their positions ("[Tool(input) -> result]").
    pub annotated_text: String,
    /// Every executed call, kept or not, ordered by position.
    pub calls: Vec<CallRecord>,
}

impl CStarRecord {
    /// Refuses a call that is not at a character boundary of the text (where C* splices it): a
    /// record read back (a journal, a shard) that was not written as annotate writes it.
    pub(crate) fn check_call_positions(&self) -> std::result::Result<(), String> {
        match self
            .calls
            .iter()
            .find(|c| !self.text.is_char_boundary(c.position))
        {
            Some(c) => Err(format!(
                "a call at byte {} is not at a character boundary of its {}-byte text",
                c.position,
                self.text.len()
            )),
            None => Ok(()),
        }
    }
}

/// Counters of one tool (the paper's Table 2 and where the rest went).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolStats {
    /// Documents the tool was tried on (passed the heuristics and fit the context).
    pub texts_considered: u64,
    /// Documents its heuristics ruled out.
    pub texts_skipped_heuristic: u64,
    /// Always 0: documents whose P(x) ++ x could not fit n_positions even with x cut to 1
    /// position, which cannot happen since the run refuses at its start a prompt that leaves no
    /// room for 2 text tokens. Kept so that journals and summaries keep their fields.
    pub texts_too_long: u64,
    /// Documents considered on a prefix of x only (the rest did not fit n_positions).
    pub texts_truncated: u64,
    /// Positions kept (p_i > tau_s, top k).
    pub positions: u64,
    /// Calls sampled at those positions (up to m each), before any is parsed.
    pub calls_sampled: u64,
    /// Samples that are not a call a tool can take: not "Tool(input)]" (unparsable, no "]" before
    /// the length cap, an arrow or unbalanced parentheses in the input) or an input with a line
    /// break or a special token's text (`calls::input_problem`).
    pub calls_malformed: u64,
    /// Parsable samples naming another tool than the prompt's (unknown or not asked for).
    pub calls_unknown_tool: u64,
    /// Repeats of a call already sampled at the same position (executed and scored once).
    pub calls_duplicate: u64,
    /// Calls whose input appears in the text after their position but not before it, dropped
    /// before execution (`drop_lookahead_inputs`, opt-in).
    pub calls_lookahead: u64,
    /// Calls handed to the tool.
    pub calls_executed: u64,
    /// Executed calls the tool returned no result for.
    pub calls_failed: u64,
    /// Calls with a result that cannot be scored (too long for n_positions), or whose scores are
    /// not finite (the call's `error` says which).
    pub calls_unscorable: u64,
    /// Calls with finite scores (delta computed).
    pub calls_scored: u64,
    /// Scored calls that passed the filter (delta >= tau_f) and were spliced into C*.
    pub calls_kept: u64,
}

impl ToolStats {
    /// Adds every counter of `o` to this one's.
    pub fn add(&mut self, o: &ToolStats) {
        self.texts_considered += o.texts_considered;
        self.texts_skipped_heuristic += o.texts_skipped_heuristic;
        self.texts_too_long += o.texts_too_long;
        self.texts_truncated += o.texts_truncated;
        self.positions += o.positions;
        self.calls_sampled += o.calls_sampled;
        self.calls_malformed += o.calls_malformed;
        self.calls_unknown_tool += o.calls_unknown_tool;
        self.calls_duplicate += o.calls_duplicate;
        self.calls_lookahead += o.calls_lookahead;
        self.calls_executed += o.calls_executed;
        self.calls_failed += o.calls_failed;
        self.calls_unscorable += o.calls_unscorable;
        self.calls_scored += o.calls_scored;
        self.calls_kept += o.calls_kept;
    }
}

/// Seconds per stage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StageSecs {
    /// Position probabilities and call sampling.
    pub sampling: f64,
    /// Tool execution.
    pub tools: f64,
    /// Filtering with the scoring engine.
    pub scoring: f64,
}

impl StageSecs {
    /// Adds each stage's seconds of `o` to this one's.
    pub fn add(&mut self, o: &StageSecs) {
        self.sampling += o.sampling;
        self.tools += o.tools;
        self.scoring += o.scoring;
    }
}

/// What one document contributed to the summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DocStats {
    /// Per tool key ("calculator", ...).
    pub tools: BTreeMap<String, ToolStats>,
    /// Wall-clock seconds the document spent in each stage, over all its tools.
    pub secs: StageSecs,
    /// Candidates scored (for candidates/s).
    pub candidates: u64,
}

/// A tool's prompt, tokenized around the text.
struct Prompt {
    before: Vec<u32>,
    after: Vec<u32>,
}

impl Prompt {
    /// The most text tokens the tool's sampling prefix holds: before ++ x' ++ after ++
    /// x'[..T-1] ++ "[" plus the call, so 2T + |before| + |after| + max_call_tokens <=
    /// n_positions.
    fn max_text_tokens(&self, n_positions: usize, max_call_tokens: usize) -> usize {
        n_positions.saturating_sub(self.fixed_tokens(max_call_tokens)) / 2
    }

    /// The tokens of a sampling prefix that are not the text: the prompt and the call
    /// (saturating: a huge `max_call_tokens` from a config must not wrap around).
    fn fixed_tokens(&self, max_call_tokens: usize) -> usize {
        (self.before.len() + self.after.len()).saturating_add(max_call_tokens)
    }
}

/// The driver's per-document machinery: tokenizer, sampler, scorer, tools and settings.
pub struct Annotator<'a> {
    tokenizer: &'a Tokenizer,
    sampler: &'a dyn Sampler,
    scorer: &'a dyn Scorer,
    registry: &'a ToolRegistry,
    config: AnnotateConfig,
    tools: Vec<ToolName>,
    /// Each active tool's prompt and settings.
    settings: BTreeMap<ToolName, (Prompt, ToolParams)>,
    bracket: Option<u32>,
    space_bracket: Option<u32>,
    stop_tokens: Vec<u32>,
    /// The ids the tokenizer has a text for, sorted (a list, not a table by id: an added token
    /// can sit at a huge id). A model row past tokenizer.json's vocabulary (GPT-J's 50400 rows
    /// over 50257 ids) decodes to nothing.
    known_ids: Vec<u32>,
    score_options: ScoreOptions,
    /// Text tokens any tool reads: its sampling prefix's, plus the loss window after the last
    /// position; a document's text is tokenized that far (`Tokenizer::encode_head`).
    head_tokens: usize,
    /// The tokenizer's special tokens: removed from results (`clean_result`), refused in inputs.
    special_tokens: Vec<String>,
}

/// The part of a document the tools read: the head of its text, tokenized.
struct Head<'d> {
    doc: &'d Document,
    enc: Encoding,
    /// `enc`'s ids.
    x: Arc<[u32]>,
    /// The text `enc` covers.
    text: &'d str,
    /// `doc.id_str()`, for the tools' `DocContext`.
    id: String,
}

impl Head<'_> {
    fn context(&self) -> DocContext<'_> {
        DocContext {
            id: &self.id,
            url: self.doc.url.as_deref(),
            date: self.doc.date.as_deref(),
        }
    }
}

/// A call that reached its tool.
struct Pending<'t> {
    tool: &'t ToolName,
    token: usize,
    byte: usize,
    input: String,
    result: std::result::Result<String, String>,
}

/// Every tool of `tools` is registered in `registry` (else an error naming the first missing one
/// and what is registered) and ready (`Tool::check_ready`: a command tool's program can be
/// started).
pub fn check_tools(registry: &ToolRegistry, tools: &[ToolName]) -> Result<()> {
    for t in tools {
        let Some(tool) = registry.get(t.call_name()) else {
            return Err(Error::input(format!(
                "tool {} is not available: configure it under {} (registered: {})",
                t.key(),
                t.service_table(),
                registry.names().join(", ")
            )));
        };
        tool.check_ready()
            .map_err(|why| Error::input(format!("tool {}: {why}", t.call_name())))?;
    }
    Ok(())
}

impl<'a> Annotator<'a> {
    /// `tools`: the active tools ([`ToolKind`](super::ToolKind)s or [`ToolName`]s), each of
    /// which must be registered in `registry` under its call name, a custom one with its
    /// settings in `config.per_tool.custom`.
    pub fn new<T: Clone + Into<ToolName>>(
        tokenizer: &'a Tokenizer,
        sampler: &'a dyn Sampler,
        scorer: &'a dyn Scorer,
        registry: &'a ToolRegistry,
        config: &AnnotateConfig,
        tools: &[T],
    ) -> Result<Self> {
        config.validate()?;
        let mut tools: Vec<ToolName> = tools.iter().cloned().map(Into::into).collect();
        tools.sort();
        tools.dedup();
        // Checked again: a program may build a ToolName::Custom of any name.
        for t in &tools {
            if let ToolName::Custom(name) = t {
                ToolName::custom(name)?;
            }
        }
        check_tools(registry, &tools)?;
        let mut settings = BTreeMap::new();
        let n_positions = scorer.config().n_positions;
        for t in &tools {
            let Some(params) = config.per_tool.params(t) else {
                return Err(Error::input(format!(
                    "custom tool {t}: no settings; give its prompt under {}",
                    t.settings_table()
                )));
            };
            let (before, after) = prompts::split(&params.prompt);
            let prompt = Prompt {
                before: tokenizer.encode_ids(before)?,
                after: tokenizer.encode_ids(after)?,
            };
            // The sampling prefix holds P(x) with x twice and a call (see annotate_document):
            // with no room for 2 text tokens, every document would be skipped as too long.
            if prompt
                .fixed_tokens(config.max_call_tokens)
                .saturating_add(4)
                > n_positions
            {
                return Err(Error::input(format!(
                    "{} prompt: its {} tokens and max_call_tokens ({}) leave no room \
                     for a text in n_positions ({}); shorten the prompt or max_call_tokens",
                    t.settings_table(),
                    prompt.before.len() + prompt.after.len(),
                    config.max_call_tokens,
                    n_positions
                )));
            }
            settings.insert(t.clone(), (prompt, params.clone()));
        }
        let bracket = single_token(tokenizer, "[")?;
        let space_bracket = single_token(tokenizer, " [")?;
        if bracket.is_none() && space_bracket.is_none() {
            return Err(Error::input(format!(
                "{}: neither \"[\" nor \" [\" is a single token; calls cannot be sampled",
                tokenizer.path().display()
            )));
        }
        let known_ids = tokenizer.ids();
        let stop_tokens = closing_tokens(tokenizer, &known_ids);
        let score_options = ScoreOptions {
            placement: config.placement,
            weights: LossWeights::new(config.weights.clone())?,
        };
        let head_tokens = settings
            .values()
            .map(|(p, _)| p.max_text_tokens(n_positions, config.max_call_tokens))
            .max()
            .unwrap_or(0)
            + score_options.weights.as_slice().len();
        Ok(Annotator {
            tokenizer,
            sampler,
            scorer,
            registry,
            config: config.clone(),
            tools,
            settings,
            bracket,
            space_bracket,
            stop_tokens,
            known_ids,
            score_options,
            head_tokens,
            special_tokens: tokenizer.special_tokens(),
        })
    }

    /// The settings the annotator was built with (validated).
    pub fn config(&self) -> &AnnotateConfig {
        &self.config
    }

    /// The active tools, sorted and each once, in the order a document runs them.
    pub fn tools(&self) -> &[ToolName] {
        &self.tools
    }

    /// The ids of the tokens that open a call ("[", " [", those that exist, each once).
    fn open_ids(&self) -> Vec<u32> {
        open_token_ids(self.bracket, self.space_bracket)
    }

    /// The sampling seed of document `line` for `tool`: independent of batching and of which
    /// other tools run.
    pub fn doc_seed(seed: u64, line: u64, tool: &ToolName) -> u64 {
        Rng::keyed(seed, &[line, tool.seed_key()]).next_u64()
    }

    /// Runs every active tool over `doc`: each samples and executes its calls (`tool_calls`),
    /// then the document's calls are filtered in one batch (`score_calls`) and the kept ones
    /// spliced.
    pub fn annotate_document(&self, doc: &Document) -> Result<(CStarRecord, DocStats)> {
        let mut stats = DocStats::default();
        // Only the head of a long text is read; the rest passes into C* as it is.
        // A text the tokenizer refuses is this document's problem (a reject), not the run's.
        let enc = self
            .tokenizer
            .encode_head(&doc.text, self.head_tokens)
            .map_err(|e| match e {
                Error::Tokenizer { msg, .. } => Error::input(format!("cannot tokenize: {msg}")),
                other => other,
            })?;
        let head = Head {
            doc,
            x: enc.ids.clone().into(),
            text: &doc.text[..enc.spans.last().map_or(0, |s| s.1)],
            enc,
            id: doc.id_str(),
        };
        let mut pending: Vec<Pending> = Vec::new();
        for tool in &self.tools {
            pending.extend(self.tool_calls(tool, &head, &mut stats)?);
        }
        let mut calls = self.score_calls(&pending, &head, &mut stats)?;

        // C* order: by position, then tool, then sampling order.
        calls.sort_by_key(|c| c.position);
        let annotated_text = splice_kept(&doc.text, &calls);
        Ok((
            CStarRecord {
                line: doc.line,
                id: doc.id.clone(),
                text: doc.text.clone(),
                annotated_text,
                calls,
            },
            stats,
        ))
    }

    /// `tool`'s calls on the document: its positions (one forward over P(x) ++ x), the calls
    /// sampled there, parsed, deduplicated and executed. None when its heuristics rule the
    /// text out or P(x) leaves it no room.
    fn tool_calls<'t>(
        &self,
        tool: &'t ToolName,
        head: &Head,
        stats: &mut DocStats,
    ) -> Result<Vec<Pending<'t>>> {
        let doc = head.doc;
        let n_positions = self.scorer.config().n_positions;
        let fallback_date = self.config.tools.calendar.date.as_deref();
        let (prompt, params) = &self.settings[tool];
        let st = stats.tools.entry(tool.key().to_string()).or_default();
        let draw = Rng::keyed(
            self.config.seed,
            &[doc.line, tool.seed_key(), HEURISTIC_KEY],
        )
        .uniform();
        let t_max = prompt.max_text_tokens(n_positions, self.config.max_call_tokens);
        let t = head.x.len().min(t_max);
        // The heuristics read the text this tool's positions are searched in, no further.
        let searched = &doc.text[..t.checked_sub(1).map_or(0, |last| head.enc.spans[last].1)];
        if !heuristics::applies(params, doc, searched, fallback_date, draw) {
            st.texts_skipped_heuristic += 1;
            return Ok(Vec::new());
        }
        if t < 2 {
            // Position 1 needs x_1 and x_2 at least: a text of one token has no position (not
            // considered). A longer one always fits: `new` refuses a prompt that leaves no
            // room for 2 text tokens.
            return Ok(Vec::new());
        }
        st.texts_considered += 1;
        if t < head.x.len() {
            st.texts_truncated += 1;
        }
        let start = Instant::now();
        let prompt_ids: Vec<u32> = [&prompt.before[..], &head.x[..t], &prompt.after[..]].concat();
        let seq: Vec<u32> = [&prompt_ids[..], &head.x[..t]].concat();
        let options = SampleOptions {
            max_new_tokens: self.config.max_call_tokens,
            stop_tokens: self.stop_tokens.clone(),
            temperature: self.config.temperature,
            top_k: (self.config.top_k_tokens > 0).then_some(self.config.top_k_tokens),
            seed: Self::doc_seed(self.config.seed, doc.line, tool),
        };
        // One forward over P(x) ++ x gives p_i at every position; the chosen positions'
        // calls are sampled off its cached keys and values.
        let mut chosen = Vec::new();
        let proposal = self.sampler.propose(
            &seq,
            &self.open_ids(),
            &mut |log_probs| {
                let probs = positions::call_probabilities(log_probs, prompt_ids.len(), t);
                chosen = positions::select(
                    &probs,
                    |i| positions::splice_byte(&doc.text, &head.enc, i).is_some(),
                    params.tau_s,
                    params.k,
                );
                if params.m == 0 {
                    return Vec::new();
                }
                chosen
                    .iter()
                    .map(|&(i, _)| Branch {
                        at: prompt_ids.len() + i,
                        token: self.open_for(&doc.text, &head.enc, i),
                        n_samples: params.m,
                    })
                    .collect()
            },
            &options,
        )?;
        st.positions += chosen.len() as u64;
        stats.secs.sampling += start.elapsed().as_secs_f64();

        let start = Instant::now();
        let mut seen = HashSet::new();
        let mut calls = Vec::new();
        for (&(i, _), samples) in chosen.iter().zip(&proposal.samples) {
            let byte = positions::splice_byte(&doc.text, &head.enc, i).unwrap_or(0);
            for sample in samples {
                st.calls_sampled += 1;
                // The decoded text would leave out a token the tokenizer has no text for: the
                // call executed would not be the one the model wrote.
                let known = |t: &u32| self.known_ids.binary_search(t).is_ok();
                if !sample.tokens.iter().all(known) {
                    st.calls_malformed += 1;
                    continue;
                }
                let text = self.tokenizer.decode(&sample.tokens)?;
                let (name, input) = match parse_call(&text) {
                    Ok(c) => c,
                    Err(Malformed::Unterminated | Malformed::Syntax(_)) => {
                        st.calls_malformed += 1;
                        continue;
                    }
                };
                if input_problem(&input, &self.special_tokens).is_some() {
                    st.calls_malformed += 1;
                    continue;
                }
                if name != tool.call_name() {
                    st.calls_unknown_tool += 1;
                    continue;
                }
                if !seen.insert((i, input.clone())) {
                    st.calls_duplicate += 1;
                    continue;
                }
                if params.drop_lookahead_inputs && input_only_ahead(&doc.text, byte, &input) {
                    st.calls_lookahead += 1;
                    continue;
                }
                st.calls_executed += 1;
                let answer = self
                    .registry
                    .call(tool.call_name(), &input, &head.context());
                let result =
                    cleaned_answer(answer, &self.special_tokens).map_err(|e| e.to_string());
                if result.is_err() {
                    st.calls_failed += 1;
                }
                calls.push(Pending {
                    tool,
                    token: i,
                    byte,
                    input,
                    result,
                });
            }
        }
        stats.secs.tools += start.elapsed().as_secs_f64();
        Ok(calls)
    }

    /// Filters every executed call that has a result, all of the document's in one batch: a
    /// record per call, in `pending`'s order, with its losses and whether it is kept, or why
    /// it has none (the tool failed, it cannot be scored).
    fn score_calls(
        &self,
        pending: &[Pending],
        head: &Head,
        stats: &mut DocStats,
    ) -> Result<Vec<CallRecord>> {
        let start = Instant::now();
        let mut calls: Vec<CallRecord> = Vec::with_capacity(pending.len());
        let mut to_score = Vec::new();
        let mut score_index = Vec::new();
        let text: Arc<str> = head.text.into();
        for p in pending {
            let mut record = CallRecord {
                position: p.byte,
                tool: p.tool.call_name().to_string(),
                input: p.input.clone(),
                result: None,
                l_none: None,
                l_call: None,
                l_call_result: None,
                delta: None,
                kept: false,
                error: None,
            };
            match &p.result {
                Err(e) => record.error = Some(format!("tool failed: {e}")),
                Ok(r) => {
                    record.result = Some(r.clone());
                    let candidate = TextCandidate {
                        text: text.clone(),
                        position: p.byte,
                        tool: record.tool.clone(),
                        input: p.input.clone(),
                        result: r.clone(),
                        weights: None,
                    }
                    .to_tokens(
                        self.tokenizer,
                        self.config.placement,
                        self.config.call_form,
                        Some((&head.enc, head.x.clone())),
                    )
                    .and_then(|c| {
                        validate(&c, self.scorer.config(), &self.score_options)
                            .map(|()| c)
                            .map_err(|e| Error::input(e.to_string()))
                    });
                    match candidate {
                        Ok(c) => {
                            debug_assert_eq!(c.position, p.token);
                            score_index.push(calls.len());
                            to_score.push(c);
                        }
                        Err(e) => {
                            let st = stats.tools.entry(p.tool.key().to_string()).or_default();
                            st.calls_unscorable += 1;
                            record.error = Some(format!("cannot be scored: {e}"));
                        }
                    }
                }
            }
            calls.push(record);
        }
        // A scorer's own refusal of a candidate (beyond `validate`) is that call's error; the
        // document's other calls are scored without it.
        let placed = score_index.into_iter().zip(to_score).collect();
        for (k, answer) in score_or_refuse(self.scorer, placed, &self.score_options)? {
            let tool = pending[k].tool;
            let (_, params) = &self.settings[tool];
            let c = &mut calls[k];
            let st = stats.tools.entry(tool.key().to_string()).or_default();
            let s = match answer {
                Ok(s) => {
                    stats.candidates += 1;
                    s
                }
                Err(e) => {
                    // The reason, without the index of a batch the record does not show.
                    let why = match e {
                        Error::Candidate { reason, .. } => reason.to_string(),
                        e => e.to_string(),
                    };
                    st.calls_unscorable += 1;
                    c.error = Some(format!("cannot be scored: {why}"));
                    continue;
                }
            };
            if let Some(why) = s.not_finite() {
                // No scores rather than nulls a reader could take for "not scored yet".
                st.calls_unscorable += 1;
                c.error = Some(why);
                continue;
            }
            c.l_none = Some(s.l_none);
            c.l_call = Some(s.l_call);
            c.l_call_result = Some(s.l_call_result);
            c.delta = Some(s.delta);
            c.kept = s.kept(params.tau_f);
            st.calls_scored += 1;
            st.calls_kept += u64::from(c.kept);
        }
        stats.secs.scoring += start.elapsed().as_secs_f64();
        Ok(calls)
    }

    /// " [" when x_i starts with whitespace (its leading space goes before the call), else "[".
    fn open_for(&self, text: &str, enc: &Encoding, i: usize) -> u32 {
        let byte = positions::splice_byte(text, enc, i).unwrap_or(0);
        let spaced = crate::score::text::spaced_at(text, byte);
        let (first, second) = if spaced {
            (self.space_bracket, self.bracket)
        } else {
            (self.bracket, self.space_bracket)
        };
        first.or(second).unwrap_or(0)
    }
}

/// The kept calls spliced into `text`; calls at one offset best first (highest delta).
pub fn splice_kept(text: &str, calls: &[CallRecord]) -> String {
    let mut kept: Vec<&CallRecord> = calls.iter().filter(|c| c.kept).collect();
    kept.sort_by(|a, b| {
        a.position
            .cmp(&b.position)
            .then(b.delta.unwrap_or(0.0).total_cmp(&a.delta.unwrap_or(0.0)))
    });
    let inserts: Vec<(usize, String)> = kept
        .iter()
        .map(|c| {
            let call = call_text(&c.tool, &c.input, c.result.as_deref(), Default::default());
            (c.position, call)
        })
        .collect();
    splice::splice(text, &inserts)
}

/// The distinct ids among `bracket` and `space_bracket`, in that order: a tokenizer that encodes
/// "[" and " [" to one token (e.g. byte-level BPE with add_prefix_space) must count it once, or
/// p_i = p("[") + p(" [") would count it twice (and could exceed 1).
fn open_token_ids(bracket: Option<u32>, space_bracket: Option<u32>) -> Vec<u32> {
    let mut ids = Vec::with_capacity(2);
    for id in bracket.into_iter().chain(space_bracket) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// The ids among `known_ids` (the tokenizer's own: an added token can sit past a gap in them)
/// whose text contains "]": each ends a call ("]", ")]", "]." ...).
fn closing_tokens(tokenizer: &Tokenizer, known_ids: &[u32]) -> Vec<u32> {
    known_ids
        .iter()
        .copied()
        .filter(|&id| tokenizer.decode(&[id]).is_ok_and(|s| s.contains(']')))
        .collect()
}

fn single_token(tokenizer: &Tokenizer, s: &str) -> Result<Option<u32>> {
    let ids = tokenizer.encode_ids(s)?;
    Ok((ids.len() == 1).then(|| ids[0]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every token whose text holds "]" ends a call, not only "]" itself: the demo tokenizer
    /// has ")]" and "()]" too (the fixture's GPT-J tokenizer has "]" alone).
    #[test]
    fn every_token_holding_a_closing_bracket_ends_a_call() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo/tokenizer.json");
        let tok = Tokenizer::from_file(&path).unwrap();
        let closing: Vec<String> = closing_tokens(&tok, &tok.ids())
            .iter()
            .map(|&id| tok.decode(&[id]).unwrap())
            .collect();
        assert_eq!(closing.len(), 3, "{closing:?}");
        for text in ["]", ")]", "()]"] {
            assert!(closing.iter().any(|c| c == text), "{text}: {closing:?}");
        }
    }

    #[test]
    fn open_ids_are_distinct() {
        assert_eq!(open_token_ids(Some(58), Some(685)), vec![58, 685]);
        assert_eq!(open_token_ids(Some(685), Some(58)), vec![685, 58]);
        // "[" and " [" encoded to one token (add_prefix_space): counted once.
        assert_eq!(open_token_ids(Some(291), Some(291)), vec![291]);
        assert_eq!(open_token_ids(None, Some(291)), vec![291]);
        assert_eq!(open_token_ids(Some(58), None), vec![58]);
        assert_eq!(open_token_ids(None, None), Vec::<u32>::new());
    }

    /// Every counter and every stage is added (a summary adds its documents' stats).
    #[test]
    fn adding_stats_adds_every_field() {
        let numbered = |v: Value| -> Value {
            let map = v.as_object().unwrap();
            let keys = map.keys().enumerate();
            Value::Object(keys.map(|(i, k)| (k.clone(), (i + 1).into())).collect())
        };
        let o: ToolStats = serde_json::from_value(numbered(
            serde_json::to_value(ToolStats::default()).unwrap(),
        ))
        .unwrap();
        let mut sum = ToolStats::default();
        sum.add(&o);
        assert_eq!(sum, o);
        let o: StageSecs = serde_json::from_value(numbered(
            serde_json::to_value(StageSecs::default()).unwrap(),
        ))
        .unwrap();
        let mut sum = StageSecs::default();
        sum.add(&o);
        assert_eq!(sum, o);
    }

    /// A token with text after its "]" ("].", as GPT-J's vocabulary has) ends a call as well.
    #[test]
    fn a_token_with_text_after_its_closing_bracket_ends_a_call() {
        let demo =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/demo/tokenizer.json");
        let mut json: Value = serde_json::from_slice(&std::fs::read(demo).unwrap()).unwrap();
        let vocab = json["model"]["vocab"].as_object_mut().unwrap();
        // "()]" renamed "].", at its id.
        let id = vocab.remove("()]").unwrap();
        vocab.insert("].".into(), id.clone());
        let id = id.as_u64().unwrap() as u32;
        let merges = json["model"]["merges"].as_array_mut().unwrap();
        merges.retain(|m| m != &serde_json::json!(["(", ")]"]));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
        let tok = Tokenizer::from_file(&path).unwrap();
        assert_eq!(tok.decode(&[id]).unwrap(), "].");
        assert!(closing_tokens(&tok, &tok.ids()).contains(&id));
    }
}
