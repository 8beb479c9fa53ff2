//! The tools a sampled API call is executed against (Toolformer, Schick et al. 2023, §3).
//!
//! Every tool sits behind the object-safe [`Tool`] trait so that a user can register
//! their own in a [`ToolRegistry`]: `generate` calls a tool of any name; the annotate driver
//! (`Annotator::new` with the registry) runs the paper's five tools (`ToolKind`: each has its
//! prompt, heuristics and thresholds; a user's tool may take a built-in's name, e.g. a QA tool
//! written in Rust instead of an external command) and tools of any other name
//! (`ToolName::Custom`, with the prompt and thresholds of `[per_tool.custom.<Name>]`). From the
//! command line, a custom tool is a service like QA and MT: `[tools.custom.<Name>]`. A call that
//! yields no result
//! returns a [`ToolError`]; the caller records the candidate as failed and goes on: no tool
//! failure, slow service or panic inside a tool may stop a run.
//!
//! Built-ins:
//! - [`Calculator`]: `+ - * /` and parentheses, parsed (never evaluated as code).
//! - [`Calendar`]: the document's date, rendered as "Today is Monday, January 30, 2023."
//! - [`WikiSearch`]: BM25 over a local tantivy index built by [`build_index`].
//! - [`ExternalTool`]: QA and MT through a user-configured command or HTTP endpoint.
//!
//! [`ToolsConfig`] is the serde form of all of this, meant to be read from a TOML file.

mod calculator;
mod calendar;
mod external;
mod wikisearch;

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ToolKind, ToolName};

pub use calculator::{evaluate, format_result, Calculator, MAX_DEPTH, MAX_INPUT_LEN};
pub use calendar::{Calendar, CalendarConfig, Date, Weekday};
#[cfg(unix)]
pub use external::{set_stop_note, stop_tools_on_signals};
pub use external::{
    stop_command_tools, ExternalBackend, ExternalTool, ExternalToolConfig, MAX_OUTPUT_BYTES,
};
pub use wikisearch::{
    build_index, IndexError, IndexStats, SearchHit, WikiSearch, WikiSearchConfig,
    DEFAULT_SNIPPET_CHARS,
};

/// What a tool sees of the document a call was sampled in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DocContext<'a> {
    /// The document's id; WikiSearch uses it so that a document never retrieves itself.
    pub id: &'a str,
    /// The document's URL, if the corpus has one (Calendar looks for a date in it).
    pub url: Option<&'a str>,
    /// The document's "date" field, if any (Calendar's first choice).
    pub date: Option<&'a str>,
}

/// Why a call produced no result.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive] // tools construct its variants; a match outside the crate needs a `_` arm
pub enum ToolError {
    /// The call's input cannot be executed by this tool (syntax, length, ...).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The tool ran but has no result (no hit, division by zero, service error, ...).
    #[error("{0}")]
    Failed(String),
    /// The tool did not answer within its time limit on its last attempt (of `tries`).
    #[error("timed out after {after:?}{}", after_tries(*.tries))]
    Timeout {
        /// The time limit of one attempt (an external tool's `timeout_ms`).
        after: Duration,
        /// Attempts made, the last of which timed out (1: the call was not retried).
        tries: u32,
    },
}

/// " (the last of N tries)" when a call was retried, else nothing (an earlier try may have
/// failed otherwise, e.g. a refused connection, and been retried).
fn after_tries(tries: u32) -> String {
    if tries > 1 {
        format!(" (the last of {tries} tries)")
    } else {
        String::new()
    }
}

/// A tool the language model can call, e.g. `[Calculator(400 / 1400) → 0.29]`.
///
/// Implementations must not panic on any input (the registry catches panics anyway) and
/// must bound their own running time: a call blocks the annotating thread.
pub trait Tool: Send + Sync {
    /// Name as it appears in calls: "Calculator", "Calendar", "WikiSearch", "QA", "MT".
    fn name(&self) -> &str;
    /// Executes one call's input; Ok(result text) or why there is none.
    fn call(&self, input: &str, doc: &DocContext<'_>) -> Result<String, ToolError>;
    /// Why the tool cannot take any call, if that can be told before a run starts (a command
    /// tool: its program cannot be started), so that a run stops with one error instead of
    /// failing every call. Checked by [`check_tools`](crate::annotate::check_tools) for the
    /// tools a run will call; the default has nothing to check.
    fn check_ready(&self) -> Result<(), String> {
        Ok(())
    }
}

/// The tools available to a run, by name (case-sensitive, as written in calls).
///
/// Keeps registration order, so that [`ToolRegistry::names`] is stable for reports.
#[derive(Default)]
pub struct ToolRegistry {
    tools: Vec<Box<dyn Tool>>,
    /// The WikiSearch index's hash when `from_config` opened it (`WikiSearch::opened_xxh3`).
    wikisearch_index_xxh3: Option<u64>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("tools", &self.names())
            .finish()
    }
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The hash of the WikiSearch index `from_config` opened (`WikiSearch::opened_xxh3`); None
    /// for a registry without one, or one whose WikiSearch was registered by hand.
    pub fn wikisearch_index_xxh3(&self) -> Option<u64> {
        self.wikisearch_index_xxh3
    }

    /// The registry that `config` describes: Calculator and Calendar unless disabled,
    /// WikiSearch if an index is configured, QA and MT if configured.
    pub fn from_config(config: &ToolsConfig) -> Result<Self, ToolConfigError> {
        let mut registry = Self::new();
        if config.calculator.enabled {
            registry.register(Calculator::new());
        }
        if config.calendar.enabled {
            registry.register(Calendar::from_config(&config.calendar)?);
        }
        if let Some(wiki) = &config.wikisearch {
            let tool = WikiSearch::from_config(wiki)?;
            let hash = tool.opened_xxh3();
            registry.register(tool);
            registry.wikisearch_index_xxh3 = Some(hash);
        }
        if let Some(qa) = &config.qa {
            registry.register(ExternalTool::from_config("QA", qa)?);
        }
        if let Some(mt) = &config.mt {
            registry.register(ExternalTool::from_config("MT", mt)?);
        }
        for (name, service) in &config.custom {
            registry.register(custom_service(name, service)?);
        }
        Ok(registry)
    }

    /// Adds `tool` under its [`Tool::name`]; returns the tool it replaced, if any.
    pub fn register<T: Tool + 'static>(&mut self, tool: T) -> Option<Box<dyn Tool>> {
        self.register_boxed(Box::new(tool))
    }

    /// [`ToolRegistry::register`] for an already boxed tool.
    pub fn register_boxed(&mut self, tool: Box<dyn Tool>) -> Option<Box<dyn Tool>> {
        if tool.name() == "WikiSearch" {
            // Not known to be the index `from_config` opened.
            self.wikisearch_index_xxh3 = None;
        }
        match self.tools.iter().position(|t| t.name() == tool.name()) {
            Some(i) => Some(std::mem::replace(&mut self.tools[i], tool)),
            None => {
                self.tools.push(tool);
                None
            }
        }
    }

    /// The tool called `name`, if registered.
    pub fn get(&self, name: &str) -> Option<&dyn Tool> {
        self.tools
            .iter()
            .find(|t| t.name() == name)
            .map(|t| t.as_ref())
    }

    /// Names of the registered tools, in registration order.
    pub fn names(&self) -> Vec<&str> {
        self.tools.iter().map(|t| t.name()).collect()
    }

    /// Number of registered tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether no tool is registered.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// Runs tool `name` on `input`. An unknown tool, or a tool that panics, fails this call
    /// only (a user's tool must not be able to take the whole run down). The panic's message is
    /// the call's error; under the CLI's hook (`install_quiet_panic_hook`) nothing is printed,
    /// as a damaged WikiSearch index makes tantivy panic on every search.
    pub fn call(&self, name: &str, input: &str, doc: &DocContext<'_>) -> Result<String, ToolError> {
        let tool = self
            .get(name)
            .ok_or_else(|| ToolError::Failed(format!("no tool named {name:?} is registered")))?;
        crate::util::catch_panic_quietly(AssertUnwindSafe(|| tool.call(input, doc))).unwrap_or_else(
            |panic| {
                Err(ToolError::Failed(format!(
                    "tool {name:?} panicked: {panic}"
                )))
            },
        )
    }
}

/// Settings of the Calculator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CalculatorConfig {
    /// Register the Calculator (default true).
    pub enabled: bool,
}

impl Default for CalculatorConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// All tool settings, as they appear under a `[tools]` table of a TOML file, e.g.
///
/// ```toml
/// [tools.calendar]
/// date = "2023-01-30"          # used when a document has no date of its own
/// [tools.wikisearch]
/// index = "wiki-index"          # built by `toolsift index`
/// [tools.qa]
/// command = ["python3", "qa.py"]
/// timeout_ms = 5000
/// [tools.mt]
/// url = "http://127.0.0.1:8080/mt"
/// [tools.custom.Weather]        # a tool of your own, called as "[Weather(Paris)]"
/// url = "http://127.0.0.1:8080/weather"
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ToolsConfig {
    /// Calculator settings.
    pub calculator: CalculatorConfig,
    /// Calendar settings.
    pub calendar: CalendarConfig,
    /// WikiSearch settings; absent means no WikiSearch tool.
    pub wikisearch: Option<WikiSearchConfig>,
    /// The question-answering service; absent means no QA tool.
    pub qa: Option<ExternalToolConfig>,
    /// The machine-translation service; absent means no MT tool.
    pub mt: Option<ExternalToolConfig>,
    /// Services of the user's own tools by call name, each spoken to as QA and MT are. Left out
    /// of the serialized settings when empty, so journals of runs that predate it still resume.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub custom: BTreeMap<String, ExternalToolConfig>,
}

impl ToolsConfig {
    /// Checks every setting that can be checked without opening anything: the Calendar's date,
    /// WikiSearch's snippet length, the QA and MT services' command, URL, timeout and retries
    /// (`ToolRegistry::from_config` checks them the same way, and opens WikiSearch's index). So
    /// that `--print-config` does not print a config the run would refuse.
    pub fn check(&self) -> Result<(), ToolConfigError> {
        Calendar::from_config(&self.calendar)?;
        if let Some(wiki) = &self.wikisearch {
            WikiSearch::check_config(wiki)?;
        }
        if let Some(qa) = &self.qa {
            ExternalTool::from_config("QA", qa)?;
        }
        if let Some(mt) = &self.mt {
            ExternalTool::from_config("MT", mt)?;
        }
        for (name, service) in &self.custom {
            custom_service(name, service)?;
        }
        Ok(())
    }

    /// Whether these settings make `tool` available (what `ToolRegistry::from_config` would
    /// register), without opening anything.
    pub fn provides(&self, tool: &ToolName) -> bool {
        match tool {
            ToolName::Builtin(ToolKind::Calculator) => self.calculator.enabled,
            ToolName::Builtin(ToolKind::Calendar) => self.calendar.enabled,
            ToolName::Builtin(ToolKind::WikiSearch) => self.wikisearch.is_some(),
            ToolName::Builtin(ToolKind::Qa) => self.qa.is_some(),
            ToolName::Builtin(ToolKind::Mt) => self.mt.is_some(),
            ToolName::Custom(name) => self.custom.contains_key(name),
        }
    }

    /// An error naming the first of `tools` that these settings do not provide, and the table
    /// that would: for a run's `--tools`, before the model loads or `--print-config` prints.
    pub fn check_provided(&self, tools: &[ToolName]) -> crate::Result<()> {
        match tools.iter().find(|t| !self.provides(t)) {
            Some(t) => Err(crate::Error::input(format!(
                "tool {} is not available: configure it under {}",
                t.key(),
                t.service_table()
            ))),
            None => Ok(()),
        }
    }
}

/// The service of custom tool `name`, which must be a name calls can have and no built-in's.
fn custom_service(
    name: &str,
    service: &ExternalToolConfig,
) -> Result<ExternalTool, ToolConfigError> {
    ToolName::custom(name).map_err(|e| ToolConfigError::Invalid {
        tool: name.to_string(),
        message: e.to_string(),
    })?;
    ExternalTool::from_config(name, service)
}

/// A tool setting that cannot be used; names the tool and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum ToolConfigError {
    /// A setting's value is wrong.
    #[error("tool {tool}: {message}")]
    Invalid {
        /// The tool's name.
        tool: String,
        /// What is wrong.
        message: String,
    },
    /// WikiSearch's index cannot be opened.
    #[error("tool WikiSearch: {0}")]
    Index(#[from] IndexError),
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Echo;
    impl Tool for Echo {
        fn name(&self) -> &str {
            "Echo"
        }
        fn call(&self, input: &str, _doc: &DocContext<'_>) -> Result<String, ToolError> {
            Ok(input.to_string())
        }
    }

    struct Panicky;
    impl Tool for Panicky {
        fn name(&self) -> &str {
            "Panicky"
        }
        fn call(&self, _input: &str, _doc: &DocContext<'_>) -> Result<String, ToolError> {
            panic!("boom")
        }
    }

    #[test]
    fn registry_registers_replaces_and_calls() {
        let mut reg = ToolRegistry::new();
        assert!(reg.is_empty());
        assert!(reg.register(Calculator::new()).is_none());
        assert!(reg.register(Echo).is_none());
        assert_eq!(reg.names(), vec!["Calculator", "Echo"]);
        assert!(reg.register(Echo).is_some(), "same name replaces");
        assert_eq!(reg.len(), 2);
        let doc = DocContext::default();
        assert_eq!(reg.call("Echo", "hi", &doc), Ok("hi".to_string()));
        assert_eq!(
            reg.call("Calculator", "400 / 1400", &doc),
            Ok("0.29".into())
        );
        assert!(reg.get("calculator").is_none(), "names are case-sensitive");
        assert!(matches!(
            reg.call("Nope", "", &doc),
            Err(ToolError::Failed(_))
        ));
    }

    #[test]
    fn a_panicking_user_tool_fails_the_call_not_the_run() {
        let mut reg = ToolRegistry::new();
        reg.register(Panicky);
        let err = reg
            .call("Panicky", "x", &DocContext::default())
            .unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
    }

    #[test]
    fn config_defaults_and_round_trip() {
        let cfg: ToolsConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(cfg, ToolsConfig::default());
        let reg = ToolRegistry::from_config(&cfg).unwrap();
        assert_eq!(reg.names(), vec!["Calculator", "Calendar"]);

        let json = r#"{"calendar":{"date":"2023-01-30"},
            "qa":{"command":["cat"]},"mt":{"url":"http://127.0.0.1:9/mt","timeout_ms":50}}"#;
        let cfg: ToolsConfig = serde_json::from_str(json).unwrap();
        let qa = cfg.qa.as_ref().unwrap();
        assert_eq!((qa.timeout_ms, qa.retries), (10_000, 2));
        let back: ToolsConfig =
            serde_json::from_str(&serde_json::to_string(&cfg).unwrap()).unwrap();
        assert_eq!(back, cfg);
        let reg = ToolRegistry::from_config(&cfg).unwrap();
        assert_eq!(reg.names(), vec!["Calculator", "Calendar", "QA", "MT"]);
        let doc = DocContext::default();
        assert_eq!(
            reg.call("Calendar", "", &doc),
            Ok("Today is Monday, January 30, 2023.".into())
        );
    }

    #[test]
    fn bad_config_is_an_error_naming_the_tool() {
        let cfg: ToolsConfig =
            serde_json::from_str(r#"{"calendar":{"date":"2023-02-29"}}"#).unwrap();
        let err = ToolRegistry::from_config(&cfg).unwrap_err().to_string();
        assert!(
            err.contains("Calendar") && err.contains("2023-02-29"),
            "{err}"
        );

        assert_eq!(cfg.check().unwrap_err().to_string(), err);

        let cfg: ToolsConfig = serde_json::from_str(r#"{"qa":{}}"#).unwrap();
        let err = ToolRegistry::from_config(&cfg).unwrap_err().to_string();
        assert!(err.contains("QA"), "{err}");
        assert_eq!(cfg.check().unwrap_err().to_string(), err);

        let cfg: ToolsConfig =
            serde_json::from_str(r#"{"mt":{"url":"http://localhost:99999/mt"}}"#).unwrap();
        let err = cfg.check().unwrap_err().to_string();
        assert!(err.contains("MT") && err.contains("99999"), "{err}");

        assert!(serde_json::from_str::<ToolsConfig>(r#"{"calculater":{}}"#).is_err());

        // Told before any index is opened (this one does not exist).
        let cfg: ToolsConfig = serde_json::from_str(
            r#"{"wikisearch":{"index":"/no/such/index","max_snippet_chars":0}}"#,
        )
        .unwrap();
        let err = ToolRegistry::from_config(&cfg).unwrap_err().to_string();
        assert!(
            err.contains("max_snippet_chars must be at least 1"),
            "{err}"
        );
        assert_eq!(cfg.check().unwrap_err().to_string(), err);
    }
}
