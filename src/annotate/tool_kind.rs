//! The five built-in tools by name: the key used in configs and `--tools`, and the name written
//! in calls. The settings, prompts and tools themselves refer to a tool by this.

use crate::error::{Error, Result};

/// The five built-in tools: the key used in configs and `--tools`, and the name used in calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ToolKind {
    Calculator,
    Calendar,
    WikiSearch,
    Qa,
    Mt,
}

impl ToolKind {
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
}
