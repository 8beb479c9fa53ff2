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

    pub fn from_key(key: &str) -> Result<Self> {
        ToolKind::ALL
            .into_iter()
            .find(|t| t.key() == key.trim())
            .ok_or_else(|| {
                Error::input(format!(
                    "unknown tool {key:?}: expected one of calculator, calendar, wikisearch, qa, mt"
                ))
            })
    }
}
