//! The tools annotate runs, by name: the paper's five built-ins ([`ToolKind`]: the key used in
//! configs and `--tools`, and the name written in calls), and tools of the user's own
//! ([`ToolName::Custom`], by the name written in calls). The settings, prompts and tools
//! themselves refer to a tool by these.

use std::fmt;

use crate::error::{Error, Result};
use crate::score::text::is_call_name;

/// The five built-in tools: the key used in configs and `--tools`, and the name used in calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ToolKind {
    /// "calculator" / "Calculator": arithmetic (`+ - * /`, parentheses).
    Calculator,
    /// "calendar" / "Calendar": the document's date, else `[tools.calendar] date` ("Today is
    /// Monday, January 30, 2023.").
    Calendar,
    /// "wikisearch" / "WikiSearch": BM25 search over a local index.
    WikiSearch,
    /// "qa" / "QA": question answering, through an external command or HTTP service.
    Qa,
    /// "mt" / "MT": machine translation, through an external command or HTTP service.
    Mt,
}

impl ToolKind {
    /// The five, in their order (as `Ord` sorts them and summaries list them).
    pub const ALL: [ToolKind; 5] = [
        ToolKind::Calculator,
        ToolKind::Calendar,
        ToolKind::WikiSearch,
        ToolKind::Qa,
        ToolKind::Mt,
    ];

    /// Config / CLI key: "calculator", "calendar", "wikisearch", "qa", "mt".
    pub fn key(self) -> &'static str {
        match self {
            ToolKind::Calculator => "calculator",
            ToolKind::Calendar => "calendar",
            ToolKind::WikiSearch => "wikisearch",
            ToolKind::Qa => "qa",
            ToolKind::Mt => "mt",
        }
    }

    /// The name written in calls: "[Calculator(...)]".
    pub fn call_name(self) -> &'static str {
        match self {
            ToolKind::Calculator => "Calculator",
            ToolKind::Calendar => "Calendar",
            ToolKind::WikiSearch => "WikiSearch",
            ToolKind::Qa => "QA",
            ToolKind::Mt => "MT",
        }
    }

    /// The tool named by its key ("wikisearch") or its call name ("WikiSearch"), in any case,
    /// as `generate --tools` accepts them.
    pub fn from_key(key: &str) -> Result<Self> {
        let key = key.trim();
        ToolKind::ALL
            .into_iter()
            .find(|t| t.key().eq_ignore_ascii_case(key) || t.call_name().eq_ignore_ascii_case(key))
            .ok_or_else(|| {
                Error::input(format!(
                    "unknown tool {key:?}: expected one of calculator, calendar, wikisearch, qa, mt"
                ))
            })
    }
}

/// A tool annotate runs: one of the paper's five, or a tool of the user's by the name its calls
/// are written with ("[Weather(Paris)]"). A custom tool has no built-in prompt, heuristics or
/// thresholds: its settings are `[per_tool.custom.<Name>]` (the prompt required), and the
/// command-line driver runs it as a service configured under `[tools.custom.<Name>]`; a program
/// registers any [`Tool`](super::tools::Tool) of that name instead.
///
/// Ordered built-ins first (in [`ToolKind::ALL`]'s order), then custom tools by name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ToolName {
    /// One of the paper's five tools.
    Builtin(ToolKind),
    /// A tool of the user's, by its call name (checked by [`ToolName::custom`]).
    Custom(String),
}

impl ToolName {
    /// A custom tool named `name`, which must be a valid call name (letters, digits and "_",
    /// what a sampled call's name may be) and none of the built-ins' keys or call names, in any
    /// case (those are [`ToolName::Builtin`]), nor "none" (`generate --tools none`).
    pub fn custom(name: &str) -> Result<Self> {
        if !is_call_name(name) {
            return Err(Error::input(format!(
                "custom tool name {name:?}: a tool's name is letters, digits and \"_\" (as \
                 calls write it: \"[Name(input)]\")"
            )));
        }
        if name.eq_ignore_ascii_case("none") {
            return Err(Error::input(
                "custom tool name \"none\" is reserved (`--tools none` means no tool)",
            ));
        }
        if let Ok(kind) = ToolKind::from_key(name) {
            return Err(Error::input(format!(
                "custom tool name {name:?} is the built-in {}'s; configure that one under \
                 [per_tool.{}] and [tools.{}]",
                kind.call_name(),
                kind.key(),
                kind.key()
            )));
        }
        Ok(ToolName::Custom(name.to_string()))
    }

    /// The key of the tool's settings and of its counters: a built-in's key ("calculator"),
    /// a custom tool's name.
    pub fn key(&self) -> &str {
        match self {
            ToolName::Builtin(kind) => kind.key(),
            ToolName::Custom(name) => name,
        }
    }

    /// The name written in calls: "Calculator", "Weather".
    pub fn call_name(&self) -> &str {
        match self {
            ToolName::Builtin(kind) => kind.call_name(),
            ToolName::Custom(name) => name,
        }
    }

    /// The tool's settings table, as errors name it: "[per_tool.calculator]",
    /// "[per_tool.custom.Weather]".
    pub fn settings_table(&self) -> String {
        match self {
            ToolName::Builtin(kind) => format!("[per_tool.{}]", kind.key()),
            ToolName::Custom(name) => format!("[per_tool.custom.{name}]"),
        }
    }

    /// Where the command-line driver's settings make the tool available: "[tools.qa]",
    /// "[tools.custom.Weather]".
    pub fn service_table(&self) -> String {
        match self {
            ToolName::Builtin(kind) => format!("[tools.{}]", kind.key()),
            ToolName::Custom(name) => format!("[tools.custom.{name}]"),
        }
    }

    /// The number that keys the tool's random draws: a built-in's index in [`ToolKind::ALL`]
    /// (the values of every earlier release, so their samples are drawn again the same), a
    /// custom tool's name hashed with the top bit set (never a built-in's).
    pub fn seed_key(&self) -> u64 {
        match self {
            ToolName::Builtin(kind) => *kind as u64,
            ToolName::Custom(name) => xxhash_rust::xxh3::xxh3_64(name.as_bytes()) | 1 << 63,
        }
    }
}

impl From<ToolKind> for ToolName {
    fn from(kind: ToolKind) -> Self {
        ToolName::Builtin(kind)
    }
}

impl fmt::Display for ToolName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.call_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_are_named_by_key_or_call_name_in_any_case() {
        for t in ToolKind::ALL {
            assert_eq!(ToolKind::from_key(t.key()).unwrap(), t);
            assert_eq!(ToolKind::from_key(t.call_name()).unwrap(), t);
            assert_eq!(ToolKind::from_key(&t.key().to_uppercase()).unwrap(), t);
        }
        assert!(ToolKind::from_key("search").is_err());
    }

    #[test]
    fn custom_names_are_call_names_and_not_built_ins() {
        let w = ToolName::custom("Weather").unwrap();
        assert_eq!((w.key(), w.call_name()), ("Weather", "Weather"));
        assert_eq!(w.settings_table(), "[per_tool.custom.Weather]");
        assert!(ToolName::custom("None")
            .unwrap_err()
            .to_string()
            .contains("reserved"));
        for bad in ["", "Two words", "Get(", "a]", "x-y"] {
            let e = ToolName::custom(bad).unwrap_err().to_string();
            assert!(e.contains("letters, digits"), "{bad:?}: {e}");
        }
        for builtin in ["calculator", "WikiSearch", "QA", "mt"] {
            let e = ToolName::custom(builtin).unwrap_err().to_string();
            assert!(e.contains("built-in"), "{builtin}: {e}");
        }
        assert!(ToolName::custom("Calculator2").is_ok());
    }

    /// Built-ins keep the seed keys of earlier releases (their samples do not change); custom
    /// tools never take one of them.
    #[test]
    fn seed_keys_of_built_ins_are_their_indices() {
        for (i, t) in ToolKind::ALL.into_iter().enumerate() {
            assert_eq!(ToolName::from(t).seed_key(), i as u64);
        }
        let w = ToolName::custom("Weather").unwrap();
        assert!(w.seed_key() >= 1 << 63);
        assert_ne!(
            w.seed_key(),
            ToolName::custom("Weather2").unwrap().seed_key()
        );
    }

    #[test]
    fn built_ins_sort_before_custom_tools() {
        let mut v = [
            ToolName::custom("Alpha").unwrap(),
            ToolKind::Mt.into(),
            ToolKind::Calculator.into(),
        ];
        v.sort();
        let names: Vec<_> = v.iter().map(|t| t.call_name()).collect();
        assert_eq!(names, ["Calculator", "MT", "Alpha"]);
    }

    /// `--tools " qa"` and the like: a key is trimmed; built-ins display as their call name; a
    /// custom tool's service is under [tools.custom.<Name>].
    #[test]
    fn keys_are_trimmed_and_names_displayed_as_calls_write_them() {
        assert_eq!(ToolKind::from_key(" qa\n").unwrap(), ToolKind::Qa);
        assert_eq!(ToolName::from(ToolKind::Qa).to_string(), "QA");
        assert_eq!(ToolName::from(ToolKind::Qa).service_table(), "[tools.qa]");
        let w = ToolName::custom("Weather").unwrap();
        assert_eq!(w.service_table(), "[tools.custom.Weather]");
        assert_eq!(w.to_string(), "Weather");
    }

    /// "none" is reserved in every case (`--tools none`); a built-in's name is refused naming
    /// the tool as calls write it and its tables by key.
    #[test]
    fn none_is_reserved_in_any_case_and_a_built_in_is_told_by_its_call_name() {
        for none in ["none", "NONE", "None"] {
            let e = ToolName::custom(none).unwrap_err().to_string();
            assert!(e.contains("reserved"), "{none}: {e}");
        }
        let e = ToolName::custom("wikisearch").unwrap_err().to_string();
        assert!(
            e.contains(
                "is the built-in WikiSearch's; configure that one under [per_tool.wikisearch] \
                 and [tools.wikisearch]"
            ),
            "{e}"
        );
    }
}
