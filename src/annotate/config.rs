//! The annotate run's settings, read from TOML (`toolsift annotate --config toolsift.toml`);
//! `toolsift annotate --print-config` prints the defaults below as a file to start from.
//!
//! Per-tool sampling and filter settings live under `[per_tool.<tool>]` (tool keys: calculator,
//! calendar, wikisearch, qa, mt); the tools' own settings (index, services, fallback date) under
//! `[tools.<tool>]` (see `tools::ToolsConfig`). A tool of the user's own has its settings under
//! `[per_tool.custom.<Name>]` (its prompt required) and, run as a service, `[tools.custom.<Name>]`.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::prompts;
use super::tool_kind::{ToolKind, ToolName};
use super::tools::ToolsConfig;
use crate::error::{Error, Result};
use crate::score::{CallForm, LossWeights, Placement};

/// Sampling, filter and heuristic settings of one tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolParams {
    /// Keep positions whose call probability p("[") + p(" [") is above tau_s...
    pub tau_s: f64,
    /// ...and at most the k most probable of them.
    pub k: usize,
    /// Calls sampled per position.
    pub m: usize,
    /// Keep a call iff L- - L+ >= tau_f.
    pub tau_f: f64,
    /// Heuristic: only texts with at least this many numbers (0: off). Paper: calculator, 3.
    #[serde(default)]
    pub min_numbers: usize,
    /// Heuristic, opt-in: the paper's Calculator filter (`heuristics::shows_arithmetic`): a text
    /// is tried if its searched head shows arithmetic, and one that passes `min_numbers` only
    /// with a probability of 1%. Left out of the serialized settings when off, so journals of
    /// runs that predate it still resume.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_arithmetic: bool,
    /// Heuristic: only documents with a date (their "date" field, a date in their URL, or
    /// `[tools.calendar] date`). Paper: calendar.
    #[serde(default)]
    pub require_date: bool,
    /// Heuristic: only texts with at least this many words containing non-ASCII letters, a
    /// stand-in for the paper's "contains non-English text" (0: off). MT: 1.
    #[serde(default)]
    pub min_foreign_words: usize,
    /// Opt-in: drop a call whose input appears in the text after its position but not before it
    /// (`calls::input_only_ahead`; the paper's post-filter for MT), before it is executed. Left
    /// out of the serialized settings when off, so journals of runs that predate it still
    /// resume.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drop_lookahead_inputs: bool,
    /// The annotation prompt P(x): must contain "{x}" exactly once (the text), and should end
    /// with "Output: " (the model continues with the annotated text).
    pub prompt: String,
}

impl ToolParams {
    /// The paper's defaults: tau_s 0.05, k 5, m 5, tau_f 1.0; calculator and MT tau_s 0, k 20,
    /// m 10, tau_f 0.5; plus the paper's heuristics.
    pub fn paper(tool: ToolKind) -> Self {
        let (tau_s, k, m, tau_f) = match tool {
            ToolKind::Calculator | ToolKind::Mt => (0.0, 20, 10, 0.5),
            _ => (0.05, 5, 5, 1.0),
        };
        ToolParams {
            tau_s,
            k,
            m,
            tau_f,
            min_numbers: if tool == ToolKind::Calculator { 3 } else { 0 },
            require_arithmetic: false,
            require_date: tool == ToolKind::Calendar,
            min_foreign_words: if tool == ToolKind::Mt { 1 } else { 0 },
            drop_lookahead_inputs: false,
            prompt: prompts::default_prompt(tool).to_string(),
        }
    }

    /// A custom tool's defaults around its `prompt`: the paper's for a tool without settings of
    /// its own (tau_s 0.05, k 5, m 5, tau_f 1.0), and no heuristic (every text is tried).
    pub fn custom(prompt: String) -> Self {
        ToolParams {
            prompt,
            min_numbers: 0,
            require_date: false,
            min_foreign_words: 0,
            ..ToolParams::paper(ToolKind::Qa)
        }
    }

    /// `table` names the settings in errors: "[per_tool.qa]".
    fn validate(&self, table: &str) -> Result<()> {
        let bad = |msg: String| Err(Error::input(format!("{table} {msg}")));
        if !(0.0..=1.0).contains(&self.tau_s) {
            return bad(format!("tau_s = {} is not a probability", self.tau_s));
        }
        if !self.tau_f.is_finite() {
            return bad("tau_f must be finite".into());
        }
        if self.prompt.matches("{x}").count() != 1 {
            return bad("prompt must contain \"{x}\" exactly once".into());
        }
        // A bound on one document's samples: they decode in groups within the memory budget,
        // but every sample's tokens are held until the document is done.
        if self.k.checked_mul(self.m).is_none_or(|n| n > MAX_SAMPLES) {
            return bad(format!(
                "k * m = {} * {} samples per document; at most {MAX_SAMPLES}",
                self.k, self.m
            ));
        }
        Ok(())
    }
}

/// Most calls sampled per document and tool (k * m; the paper's largest is 20 * 10).
pub const MAX_SAMPLES: usize = 10_000;

/// The largest settings file read (`annotate --config`, `generate --config`), in bytes: a few KB
/// when it is one; a larger file is refused unread (is it the right file?).
pub const MAX_SETTINGS_BYTES: u64 = 1 << 20;

/// Per-tool settings, one table each. A key left out of a table keeps that tool's default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "PerToolPartial")]
pub struct PerTool {
    /// `[per_tool.calculator]`; default `ToolParams::paper(ToolKind::Calculator)` (tau_s 0,
    /// k 20, m 10, tau_f 0.5, min_numbers 3).
    pub calculator: ToolParams,
    /// `[per_tool.calendar]`; default `ToolParams::paper(ToolKind::Calendar)` (tau_s 0.05,
    /// k 5, m 5, tau_f 1.0, require_date).
    pub calendar: ToolParams,
    /// `[per_tool.wikisearch]`; default `ToolParams::paper(ToolKind::WikiSearch)` (tau_s 0.05,
    /// k 5, m 5, tau_f 1.0, no heuristic).
    pub wikisearch: ToolParams,
    /// `[per_tool.qa]`; default `ToolParams::paper(ToolKind::Qa)` (tau_s 0.05, k 5, m 5,
    /// tau_f 1.0, no heuristic).
    pub qa: ToolParams,
    /// `[per_tool.mt]`; default `ToolParams::paper(ToolKind::Mt)` (tau_s 0, k 20, m 10,
    /// tau_f 0.5, min_foreign_words 1).
    pub mt: ToolParams,
    /// Tools of the user's own, by the name their calls are written with
    /// (`[per_tool.custom.<Name>]`): the prompt is required, the rest defaults as
    /// [`ToolParams::custom`]. Left out of the serialized settings when empty, so journals of
    /// runs that predate it still resume.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub custom: BTreeMap<String, ToolParams>,
}

/// `ToolParams` as read: every key optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ParamsPartial {
    tau_s: Option<f64>,
    k: Option<usize>,
    m: Option<usize>,
    tau_f: Option<f64>,
    min_numbers: Option<usize>,
    require_arithmetic: Option<bool>,
    require_date: Option<bool>,
    min_foreign_words: Option<usize>,
    drop_lookahead_inputs: Option<bool>,
    prompt: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct PerToolPartial {
    calculator: ParamsPartial,
    calendar: ParamsPartial,
    wikisearch: ParamsPartial,
    qa: ParamsPartial,
    mt: ParamsPartial,
    custom: BTreeMap<String, ParamsPartial>,
}

/// `p` over the defaults `d`.
fn merge(d: ToolParams, p: ParamsPartial) -> ToolParams {
    ToolParams {
        tau_s: p.tau_s.unwrap_or(d.tau_s),
        k: p.k.unwrap_or(d.k),
        m: p.m.unwrap_or(d.m),
        tau_f: p.tau_f.unwrap_or(d.tau_f),
        min_numbers: p.min_numbers.unwrap_or(d.min_numbers),
        require_arithmetic: p.require_arithmetic.unwrap_or(d.require_arithmetic),
        require_date: p.require_date.unwrap_or(d.require_date),
        min_foreign_words: p.min_foreign_words.unwrap_or(d.min_foreign_words),
        drop_lookahead_inputs: p.drop_lookahead_inputs.unwrap_or(d.drop_lookahead_inputs),
        prompt: p.prompt.unwrap_or(d.prompt),
    }
}

impl TryFrom<PerToolPartial> for PerTool {
    type Error = String;

    fn try_from(p: PerToolPartial) -> std::result::Result<Self, String> {
        let paper = |tool, p| merge(ToolParams::paper(tool), p);
        let mut custom = BTreeMap::new();
        for (name, mut params) in p.custom {
            // No default prompt could teach a model an unknown tool's calls.
            let Some(prompt) = params.prompt.take() else {
                return Err(format!(
                    "[per_tool.custom.{name}] has no prompt: a custom tool needs its annotation \
                     prompt (with \"{{x}}\" once; it should end in \"Output: \")"
                ));
            };
            custom.insert(name, merge(ToolParams::custom(prompt), params));
        }
        Ok(PerTool {
            calculator: paper(ToolKind::Calculator, p.calculator),
            calendar: paper(ToolKind::Calendar, p.calendar),
            wikisearch: paper(ToolKind::WikiSearch, p.wikisearch),
            qa: paper(ToolKind::Qa, p.qa),
            mt: paper(ToolKind::Mt, p.mt),
            custom,
        })
    }
}

impl Default for PerTool {
    fn default() -> Self {
        PerTool {
            calculator: ToolParams::paper(ToolKind::Calculator),
            calendar: ToolParams::paper(ToolKind::Calendar),
            wikisearch: ToolParams::paper(ToolKind::WikiSearch),
            qa: ToolParams::paper(ToolKind::Qa),
            mt: ToolParams::paper(ToolKind::Mt),
            custom: BTreeMap::new(),
        }
    }
}

impl PerTool {
    /// The settings of built-in `tool` (custom tools: `params`).
    pub fn get(&self, tool: ToolKind) -> &ToolParams {
        match tool {
            ToolKind::Calculator => &self.calculator,
            ToolKind::Calendar => &self.calendar,
            ToolKind::WikiSearch => &self.wikisearch,
            ToolKind::Qa => &self.qa,
            ToolKind::Mt => &self.mt,
        }
    }

    /// The settings of built-in `tool`, to change.
    pub fn get_mut(&mut self, tool: ToolKind) -> &mut ToolParams {
        match tool {
            ToolKind::Calculator => &mut self.calculator,
            ToolKind::Calendar => &mut self.calendar,
            ToolKind::WikiSearch => &mut self.wikisearch,
            ToolKind::Qa => &mut self.qa,
            ToolKind::Mt => &mut self.mt,
        }
    }

    /// The settings of `tool`: a built-in's always, a custom tool's if configured.
    pub fn params(&self, tool: &ToolName) -> Option<&ToolParams> {
        match tool {
            ToolName::Builtin(kind) => Some(self.get(*kind)),
            ToolName::Custom(name) => self.custom.get(name),
        }
    }
}

/// Everything an annotate run is configured with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnnotateConfig {
    /// The corpus field holding the text.
    pub text_field: String,
    /// Base seed; document at input line L samples with a seed derived from (seed, L, tool).
    pub seed: u64,
    /// How candidates are scored: "prefix" (the paper's) or "inline".
    pub placement: Placement,
    /// e(c, eps): "arrow" ("[T(i) ->]", the paper's) or "bare" ("[T(i)]").
    pub call_form: CallForm,
    /// Loss weights w_0, w_1, ... (default: 1, .8, .6, .4, .2, divided by 3).
    pub weights: Vec<f64>,
    /// Longest sampled call, in tokens after "[" ("]" included); longer samples are malformed.
    pub max_call_tokens: usize,
    /// Sampling temperature for calls (0: greedy).
    pub temperature: f32,
    /// Sample calls among the most likely `top_k_tokens` tokens only (0: whole vocabulary).
    pub top_k_tokens: usize,
    /// Per-tool sampling, filter and heuristic settings.
    #[serde(deserialize_with = "table_only")]
    pub per_tool: PerTool,
    /// The tools' own settings.
    #[serde(deserialize_with = "table_only")]
    pub tools: ToolsConfig,
}

/// A struct read from a table only. serde reads a struct from an array too, field by field in
/// order, so `[[per_tool]]` (an array of tables) with `tau_s = 0.9` would set the Calculator's
/// tau_s (its first field), and `[[tools]]` with `enabled = false` would disable it: both with
/// no error, `deny_unknown_fields` notwithstanding.
fn table_only<'de, D, T>(deserializer: D) -> std::result::Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Table<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Table<T> {
        type Value = T;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a table of tools ([per_tool.<tool>], [tools.<tool>]), not an array")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            map: A,
        ) -> std::result::Result<T, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    deserializer.deserialize_map(Table(std::marker::PhantomData))
}

impl Default for AnnotateConfig {
    fn default() -> Self {
        AnnotateConfig {
            text_field: "text".into(),
            seed: 0,
            placement: Placement::Prefix,
            call_form: CallForm::Arrow,
            weights: LossWeights::default().as_slice().to_vec(),
            max_call_tokens: 32,
            temperature: 1.0,
            top_k_tokens: 0,
            per_tool: PerTool::default(),
            tools: ToolsConfig::default(),
        }
    }
}

impl AnnotateConfig {
    /// Reads and validates a TOML file; missing keys take their defaults.
    pub fn from_file(path: &Path) -> Result<Self> {
        let err = |msg: String| Error::input(format!("{}: {msg}", path.display()));
        let text = crate::util::fs::read_small_text(path, MAX_SETTINGS_BYTES, err)?;
        Self::from_toml(&text).map_err(|e| Error::input(format!("{}: {e}", path.display())))
    }

    /// Parses and validates TOML text; missing keys take their defaults. Fails (`Error::Input`)
    /// on a syntax error, an unknown key or a value `validate` refuses.
    pub fn from_toml(text: &str) -> Result<Self> {
        let config: AnnotateConfig =
            toml::from_str(text).map_err(|e| Error::input(e.to_string()))?;
        config.validate()?;
        Ok(config)
    }

    /// This configuration as a TOML file (`annotate` records the run's own settings with it;
    /// `AnnotateConfig::default().to_toml()` is the defaults).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
    }

    /// Refuses settings a run could not use or that would mean nothing: the weights, the draw
    /// options, every tool's thresholds and the tools' own settings (`ToolsConfig::check`).
    pub fn validate(&self) -> Result<()> {
        if self.text_field.is_empty() {
            return Err(Error::input("text_field must not be empty"));
        }
        if i64::try_from(self.seed).is_err() {
            // --print-config would write a file that TOML parsers refuse (integers are i64).
            return Err(Error::input(format!(
                "seed {} is past TOML's integer range (at most {})",
                self.seed,
                i64::MAX
            )));
        }
        // Finite, non-negative, one positive at least (else every delta would be 0).
        LossWeights::new(self.weights.clone())?;
        if self.max_call_tokens == 0 {
            return Err(Error::input("max_call_tokens must be at least 1"));
        }
        crate::sample::check_draw_options(self.temperature, None)?;
        // Custom names first: a table under a name that cannot be would only mislead.
        let custom_tables = (self.per_tool.custom.keys().map(|n| ("per_tool", n)))
            .chain(self.tools.custom.keys().map(|n| ("tools", n)));
        for (table, name) in custom_tables {
            ToolName::custom(name).map_err(|e| Error::input(format!("[{table}.custom] {e}")))?;
        }
        for tool in ToolKind::ALL {
            self.per_tool
                .get(tool)
                .validate(&ToolName::from(tool).settings_table())?;
        }
        for (name, params) in &self.per_tool.custom {
            params.validate(&format!("[per_tool.custom.{name}]"))?;
        }
        // A service with no prompt could never be sampled.
        if let Some(name) = self
            .tools
            .custom
            .keys()
            .find(|name| !self.per_tool.custom.contains_key(*name))
        {
            return Err(Error::input(format!(
                "[tools.custom.{name}] has no [per_tool.custom.{name}] with its prompt"
            )));
        }
        self.tools.check().map_err(|e| Error::input(e.to_string()))
    }

    /// The tool `--tools` names: a built-in by its key or call name in any case ("qa", "QA"),
    /// or a tool of `[per_tool.custom]` by its exact name.
    pub fn tool_named(&self, name: &str) -> Result<ToolName> {
        let name = name.trim();
        if let Ok(kind) = ToolKind::from_key(name) {
            return Ok(kind.into());
        }
        if self.per_tool.custom.contains_key(name) {
            return ToolName::custom(name);
        }
        let custom: Vec<&str> = self.per_tool.custom.keys().map(|k| k.as_str()).collect();
        Err(Error::input(format!(
            "--tools: unknown tool {name:?}: expected one of calculator, calendar, wikisearch, \
             qa, mt{}",
            if custom.is_empty() {
                ", or a custom tool configured under [per_tool.custom.<Name>]".to_string()
            } else {
                format!(", or a custom tool: {}", custom.join(", "))
            }
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An array of tables where a table of tools belongs is an error, not the first tool's
    /// settings (serde reads a struct from an array field by field).
    #[test]
    fn tools_and_per_tool_must_be_tables() {
        for text in [
            "[[per_tool]]\ntau_s = 0.9\n",
            "[[tools]]\nenabled = false\n",
        ] {
            let err = AnnotateConfig::from_toml(text).unwrap_err().to_string();
            assert!(err.contains("a table of tools"), "{text:?}: {err}");
        }
        let json: std::result::Result<AnnotateConfig, _> =
            serde_json::from_str(r#"{"tools": [{"enabled": false}]}"#);
        assert!(json.unwrap_err().to_string().contains("a table of tools"));
        // Tables still read.
        let c = AnnotateConfig::from_toml("[per_tool.calculator]\ntau_s = 0.9\n").unwrap();
        assert_eq!(c.per_tool.calculator.tau_s, 0.9);
    }

    #[test]
    fn a_settings_file_past_its_limit_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.toml");
        // Sparse: no disk, and nothing of it would be read anyway.
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(MAX_SETTINGS_BYTES + 1).unwrap();
        let e = AnnotateConfig::from_file(&path).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{}: is larger than 1 MiB", path.display())),
            "{e}"
        );
        std::fs::write(&path, b"[per_tool.calculator]\nk = 7\n\xff\n").unwrap();
        let e = AnnotateConfig::from_file(&path).unwrap_err().to_string();
        assert!(e.contains("is not UTF-8 text"), "{e}");
        std::fs::write(&path, "[per_tool.calculator]\nk = 7\n").unwrap();
        let c = AnnotateConfig::from_file(&path).unwrap();
        assert_eq!(c.per_tool.get(ToolKind::Calculator).k, 7);
    }

    #[test]
    fn paper_defaults() {
        let c = AnnotateConfig::default();
        let calc = c.per_tool.get(ToolKind::Calculator);
        assert_eq!((calc.tau_s, calc.k, calc.m, calc.tau_f), (0.0, 20, 10, 0.5));
        assert_eq!(calc.min_numbers, 3);
        let mt = c.per_tool.get(ToolKind::Mt);
        assert_eq!((mt.tau_s, mt.k, mt.m, mt.tau_f), (0.0, 20, 10, 0.5));
        for t in [ToolKind::Calendar, ToolKind::WikiSearch, ToolKind::Qa] {
            let p = c.per_tool.get(t);
            assert_eq!((p.tau_s, p.k, p.m, p.tau_f), (0.05, 5, 5, 1.0));
        }
        assert!(c.per_tool.calendar.require_date);
        // The heuristics: numbers for the calculator, a date for the calendar, a foreign word
        // for MT, none for WikiSearch and QA.
        let heuristics = |t| {
            let p = c.per_tool.get(t);
            (p.min_numbers, p.require_date, p.min_foreign_words)
        };
        assert_eq!(heuristics(ToolKind::Calculator), (3, false, 0));
        assert_eq!(heuristics(ToolKind::Calendar), (0, true, 0));
        assert_eq!(heuristics(ToolKind::Mt), (0, false, 1));
        assert_eq!(heuristics(ToolKind::WikiSearch), (0, false, 0));
        assert_eq!(heuristics(ToolKind::Qa), (0, false, 0));
    }

    /// Every key of a `[per_tool.<tool>]` table is read over that tool's default, and a table
    /// is its tool's alone: a tool whose table sets one key keeps its own defaults (its own
    /// prompt included) for the rest, and `get` and `get_mut` reach the tool they name.
    #[test]
    fn every_per_tool_key_overrides_its_own_tools_default() {
        let c = AnnotateConfig::from_toml(
            "[per_tool.mt]\ntau_s = 0.25\nk = 3\nm = 4\ntau_f = 0.75\nmin_numbers = 2\n\
             require_date = true\nmin_foreign_words = 5\nprompt = \"M {x}\"\n\
             [per_tool.wikisearch]\nk = 2\n",
        )
        .unwrap();
        let mt = c.per_tool.get(ToolKind::Mt);
        assert_eq!((mt.tau_s, mt.k, mt.m, mt.tau_f), (0.25, 3, 4, 0.75));
        assert_eq!(
            (mt.min_numbers, mt.require_date, mt.min_foreign_words),
            (2, true, 5)
        );
        assert_eq!(mt.prompt, "M {x}");
        let w = c.per_tool.get(ToolKind::WikiSearch);
        assert_eq!(
            w,
            &ToolParams {
                k: 2,
                ..ToolParams::paper(ToolKind::WikiSearch)
            }
        );
        assert_ne!(w.prompt, ToolParams::paper(ToolKind::Qa).prompt);
        assert_eq!(
            c.per_tool.get(ToolKind::Qa),
            &ToolParams::paper(ToolKind::Qa)
        );

        let mut c = AnnotateConfig::default();
        for (i, &t) in ToolKind::ALL.iter().enumerate() {
            c.per_tool.get_mut(t).k = 100 + i;
        }
        let ks = ToolKind::ALL.map(|t| c.per_tool.get(t).k);
        assert_eq!(ks, std::array::from_fn(|i| 100 + i));
    }

    /// Each refusal of `validate` on its own, with the table or key it names: tau_s outside
    /// [0, 1] (1 itself is a probability; a NaN is not), a tau_f that is not finite, an empty
    /// text_field, max_call_tokens 0, a temperature below 0 or not a number.
    #[test]
    fn validate_refuses_each_setting_a_run_could_not_use() {
        for text in [
            "[per_tool.qa]\ntau_s = 1.0\n",
            "[per_tool.qa]\ntau_s = 0.0\n",
        ] {
            assert!(AnnotateConfig::from_toml(text).is_ok(), "{text}");
        }
        let refused = |text: &str, says: &str| {
            let e = AnnotateConfig::from_toml(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        };
        refused(
            "[per_tool.qa]\ntau_s = -0.5\n",
            "[per_tool.qa] tau_s = -0.5 is not a probability",
        );
        refused("[per_tool.qa]\ntau_s = nan\n", "is not a probability");
        refused(
            "[per_tool.mt]\ntau_f = inf\n",
            "[per_tool.mt] tau_f must be finite",
        );
        refused("[per_tool.mt]\ntau_f = nan\n", "tau_f must be finite");
        refused("text_field = \"\"\n", "text_field must not be empty");
        refused(
            "max_call_tokens = 0\n",
            "max_call_tokens must be at least 1",
        );
        refused(
            "temperature = -1.0\n",
            "temperature -1 must be finite and >= 0",
        );
        refused("temperature = nan\n", "must be finite and >= 0");
    }

    /// `--tools` names are trimmed before they are matched, a custom tool's too (a built-in's
    /// key is trimmed by `ToolKind::from_key` as well).
    #[test]
    fn tool_named_trims_a_custom_tools_name() {
        let c =
            AnnotateConfig::from_toml("[per_tool.custom.Weather]\nprompt = \"W {x}\"\n").unwrap();
        assert_eq!(
            c.tool_named(" Weather ").unwrap(),
            c.tool_named("Weather").unwrap()
        );
        assert_eq!(c.tool_named(" qa\t").unwrap(), ToolKind::Qa.into());
    }

    /// An unknown --tools name is refused naming it and what it could be: the built-in tools,
    /// and the custom tools the settings configure, or where one would be configured.
    #[test]
    fn tool_named_refuses_an_unknown_name_with_the_known_ones() {
        let bare = AnnotateConfig::default().tool_named("Weather").unwrap_err();
        let two = "[per_tool.custom.Weather]\nprompt = \"W {x}\"\n\
                   [per_tool.custom.Stock]\nprompt = \"S {x}\"\n";
        let custom = AnnotateConfig::from_toml(two)
            .unwrap()
            .tool_named("weather")
            .unwrap_err();
        let known = "expected one of calculator, calendar, wikisearch, qa, mt, or a custom tool";
        for (err, tail) in [
            (bare, " configured under [per_tool.custom.<Name>]"),
            (custom, ": Stock, Weather"),
        ] {
            let err = err.to_string();
            assert!(err.contains("--tools: unknown tool \""), "{err}");
            assert!(err.ends_with(&format!("{known}{tail}")), "{err}");
        }
    }

    /// The opt-in paper filter parses, prints when on and round-trips; off, it is left out of
    /// the settings (journals written before it existed still describe the same run).
    #[test]
    fn require_arithmetic_is_opt_in_and_printed_only_when_on() {
        let c = AnnotateConfig::default();
        assert!(!c.per_tool.calculator.require_arithmetic);
        assert!(!c.to_toml().contains("require_arithmetic"));
        let on = AnnotateConfig::from_toml("[per_tool.calculator]\nrequire_arithmetic = true\n")
            .unwrap();
        assert!(on.per_tool.calculator.require_arithmetic);
        assert!(!on.per_tool.calendar.require_arithmetic);
        let text = on.to_toml();
        assert!(text.contains("require_arithmetic = true"), "{text}");
        assert_eq!(AnnotateConfig::from_toml(&text).unwrap(), on);
    }

    /// The MT post-filter likewise: opt-in, printed only when on.
    #[test]
    fn drop_lookahead_inputs_is_opt_in_and_printed_only_when_on() {
        let c = AnnotateConfig::default();
        assert!(ToolKind::ALL
            .iter()
            .all(|&t| !c.per_tool.get(t).drop_lookahead_inputs));
        assert!(!c.to_toml().contains("drop_lookahead_inputs"));
        let on =
            AnnotateConfig::from_toml("[per_tool.mt]\ndrop_lookahead_inputs = true\n").unwrap();
        assert!(on.per_tool.mt.drop_lookahead_inputs && !on.per_tool.qa.drop_lookahead_inputs);
        let text = on.to_toml();
        assert!(text.contains("drop_lookahead_inputs = true"), "{text}");
        assert_eq!(AnnotateConfig::from_toml(&text).unwrap(), on);
    }

    #[test]
    fn printed_defaults_parse_back() {
        let c = AnnotateConfig::default();
        let text = c.to_toml();
        assert!(text.contains("[per_tool.calculator]"), "{text}");
        assert_eq!(AnnotateConfig::from_toml(&text).unwrap(), c);
    }

    /// A tool of the user's own: its prompt required, the rest the paper's defaults for a tool
    /// without its own; named by `--tools` exactly as the config names it; printed only when
    /// there is one (journals of earlier runs describe the same settings).
    #[test]
    fn custom_tools_take_their_settings_from_per_tool_custom() {
        let text = "[per_tool.custom.Weather]\nprompt = \"W {x} Output: \"\nk = 3\n\
                    [tools.custom.Weather]\nurl = \"http://127.0.0.1:8080/weather\"\n";
        let c = AnnotateConfig::from_toml(text).unwrap();
        let w = &c.per_tool.custom["Weather"];
        assert_eq!((w.tau_s, w.k, w.m, w.tau_f), (0.05, 3, 5, 1.0));
        assert_eq!(
            (w.min_numbers, w.require_date, w.min_foreign_words),
            (0, false, 0)
        );
        let name = c.tool_named("Weather").unwrap();
        assert_eq!(c.per_tool.params(&name), Some(w));
        assert_eq!(c.tool_named("QA").unwrap(), ToolKind::Qa.into());
        let e = c.tool_named("weather").unwrap_err().to_string();
        assert!(e.contains("custom tool: Weather"), "{e}");
        let printed = c.to_toml();
        assert!(printed.contains("[per_tool.custom.Weather]"), "{printed}");
        assert_eq!(AnnotateConfig::from_toml(&printed).unwrap(), c);
        assert!(!AnnotateConfig::default().to_toml().contains("custom"));

        let refused = |text: &str, says: &str| {
            let e = AnnotateConfig::from_toml(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        };
        refused("[per_tool.custom.Weather]\nk = 3\n", "has no prompt");
        refused(
            "[per_tool.custom.Weather]\nprompt = \"no text\"\n",
            "exactly once",
        );
        // Twice: everything after the first would be left in the prompt, "{x}" included.
        refused(
            "[per_tool.calculator]\nprompt = \"{x} and {x}\"\n",
            "exactly once",
        );
        refused(
            "[per_tool.custom.Weather]\nprompt = \"{x}\"\nkk = 3\n",
            "kk",
        );
        refused(
            "[per_tool.custom.\"Two words\"]\nprompt = \"{x}\"\n",
            "letters, digits",
        );
        refused("[per_tool.custom.Calendar]\nprompt = \"{x}\"\n", "built-in");
        refused(
            "[tools.custom.Weather]\ncommand = [\"cat\"]\n",
            "no [per_tool.custom.Weather]",
        );
        // A built-in's name is said first, before the missing prompt table.
        refused(
            "[tools.custom.Qa]\ncommand = [\"cat\"]\n",
            "[tools.custom] custom tool name \"Qa\" is the built-in",
        );
        refused(
            "[per_tool.custom.X]\nprompt = \"{x}\"\n[tools.custom.X]\nurl = \"ftp://x\"\n",
            "tool X",
        );
    }

    #[test]
    fn overrides_and_errors() {
        let c =
            AnnotateConfig::from_toml("seed = 7\n[per_tool.calendar]\nk = 2\nprompt = \"P {x}\"\n")
                .unwrap();
        assert_eq!(c.seed, 7);
        assert_eq!(c.per_tool.calendar.k, 2);
        assert_eq!(
            c.per_tool.calendar.tau_s, 0.05,
            "keys left out keep the tool's default"
        );
        assert!(c.per_tool.calendar.require_date);
        assert_eq!(c.per_tool.calculator.k, 20);
        assert!(AnnotateConfig::from_toml("sed = 1").is_err());
        let e = AnnotateConfig::from_toml("[per_tool.qa]\ntau_s = 2.0").unwrap_err();
        assert!(e.to_string().contains("per_tool.qa"), "{e}");
        // k * m bounded (it sizes one decoding batch), overflow included.
        let e = AnnotateConfig::from_toml("[per_tool.calculator]\nm = 9223372036854775807")
            .unwrap_err();
        assert!(e.to_string().contains("per_tool.calculator] k * m"), "{e}");
        assert!(AnnotateConfig::from_toml("[per_tool.calculator]\nk = 100\nm = 100").is_ok());
        let huge = AnnotateConfig {
            seed: u64::MAX,
            ..Default::default()
        };
        let e = huge.validate().unwrap_err().to_string();
        assert!(e.contains("past TOML's integer range"), "{e}");
        let largest = AnnotateConfig {
            seed: i64::MAX as u64,
            ..Default::default()
        };
        assert_eq!(
            AnnotateConfig::from_toml(&largest.to_toml()).unwrap(),
            largest
        );
        let e = AnnotateConfig::from_toml("weights = [0.0, 0.0]").unwrap_err();
        assert!(e.to_string().contains("positive weight"), "{e}");
    }

    /// The top-level defaults docs/annotate.md gives (and `--print-config` prints): a file
    /// that sets nothing runs with them.
    #[test]
    fn top_level_defaults_are_the_documented_ones() {
        let c = AnnotateConfig::from_toml("").unwrap();
        assert_eq!(c, AnnotateConfig::default());
        assert_eq!((c.text_field.as_str(), c.seed), ("text", 0));
        assert_eq!(
            (c.placement, c.call_form),
            (Placement::Prefix, CallForm::Arrow)
        );
        assert_eq!(
            (c.max_call_tokens, c.temperature, c.top_k_tokens),
            (32, 1.0, 0)
        );
        assert_eq!(c.weights, LossWeights::default().as_slice());
    }

    /// k * m is bounded at MAX_SAMPLES itself, and the refusal says k and m in that order and
    /// names the table, a custom tool's included.
    #[test]
    fn k_times_m_past_the_bound_is_refused_with_k_then_m() {
        let e = AnnotateConfig::from_toml("[per_tool.qa]\nk = 100\nm = 101\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("[per_tool.qa] k * m = 100 * 101 samples per document; at most 10000"),
            "{e}"
        );
        let e = AnnotateConfig::from_toml(
            "[per_tool.custom.Weather]\nprompt = \"W {x}\"\nk = 10001\nm = 1\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("[per_tool.custom.Weather] k * m"), "{e}");
    }

    /// Every built-in's table is validated, each under its own name.
    #[test]
    fn every_built_in_table_is_validated() {
        for t in ToolKind::ALL {
            let text = format!("[per_tool.{}]\ntau_s = 2.0\n", t.key());
            let e = AnnotateConfig::from_toml(&text).unwrap_err().to_string();
            assert!(
                e.contains(&format!("[per_tool.{}] tau_s = 2 is not", t.key())),
                "{text}: {e}"
            );
        }
    }

    /// The smallest values that mean something are accepted: one call token, and the largest
    /// seed TOML can write (one past it is refused: `--print-config` could not print it).
    #[test]
    fn the_smallest_call_length_and_largest_seed_are_accepted() {
        let c = AnnotateConfig::from_toml("max_call_tokens = 1\n").unwrap();
        assert_eq!(c.max_call_tokens, 1);
        let past = AnnotateConfig {
            seed: i64::MAX as u64 + 1,
            ..Default::default()
        };
        let e = past.validate().unwrap_err().to_string();
        assert!(e.contains("past TOML's integer range"), "{e}");
    }

    /// A custom tool's name that cannot be is named with the table it is under.
    #[test]
    fn a_bad_custom_name_is_told_with_its_table() {
        let e = AnnotateConfig::from_toml("[per_tool.custom.\"Two words\"]\nprompt = \"{x}\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("[per_tool.custom] custom tool name \"Two words\""),
            "{e}"
        );
    }

    /// Each custom service needs a prompt table of its own name: another tool's does not do.
    #[test]
    fn a_custom_service_needs_its_own_prompt_table() {
        let e = AnnotateConfig::from_toml(
            "[per_tool.custom.A]\nprompt = \"A {x}\"\n[tools.custom.B]\ncommand = [\"cat\"]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("[tools.custom.B] has no [per_tool.custom.B]"),
            "{e}"
        );
    }

    /// An error in a settings file names the file, as a read error does.
    #[test]
    fn a_settings_files_parse_error_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("settings.toml");
        for (text, says) in [
            ("sed = 1\n", "sed"),
            ("[per_tool.qa]\ntau_s = 2.0\n", "[per_tool.qa] tau_s"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = AnnotateConfig::from_file(&path).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("{}: ", path.display())) && e.contains(says),
                "{text}: {e}"
            );
        }
    }

    /// k = 0 or m = 0 is a tool that samples nothing: accepted, not refused by the k * m bound.
    #[test]
    fn k_or_m_zero_is_accepted() {
        for text in ["[per_tool.qa]\nk = 0\n", "[per_tool.qa]\nm = 0\n"] {
            assert!(AnnotateConfig::from_toml(text).is_ok(), "{text}");
        }
    }
}
