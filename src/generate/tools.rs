//! The tools a `generate` run may call, from a config file and `--tools`.

use std::path::Path;

use crate::annotate::config::{AnnotateConfig, MAX_SETTINGS_BYTES};
use crate::annotate::tools::{ToolRegistry, ToolsConfig};
use crate::error::{Error, Result};
use crate::util::fs::read_small_text;

/// The tools of a `generate` run: the `tools` table of a TOML or JSON config file (a `.json`
/// file is read as JSON, anything else as TOML), or the defaults (Calculator and Calendar)
/// without a file; then only the tools named in `only` (call names or annotate's keys,
/// case-insensitive; "none" or an empty list: no tools). Naming a tool that is not configured is
/// an error. The file is read as an annotate config (`AnnotateConfig`), so annotate's config file
/// serves as is and a key annotate does not know (`[tool.calculator]` for `[tools.calculator]`,
/// at any level) is an error naming it, as annotate's; the other keys' values are annotate's to
/// check, not generate's.
pub fn tools_from_config(path: Option<&Path>, only: Option<&[String]>) -> Result<ToolRegistry> {
    let config_err = |path: &Path, msg: String| Error::Config {
        path: path.to_owned(),
        msg,
    };
    let mut config = match path {
        None => ToolsConfig::default(),
        Some(path) => {
            let text = read_small_text(path, MAX_SETTINGS_BYTES, |msg| config_err(path, msg))?;
            let annotate: AnnotateConfig = if path.extension().is_some_and(|e| e == "json") {
                crate::util::json::object_from_str(&text).map_err(|e| config_err(path, e))?
            } else {
                toml::from_str(&text).map_err(|e| config_err(path, e.to_string()))?
            };
            annotate.tools
        }
    };
    if let Some(only) = only {
        let mut names: Vec<&str> = only.iter().map(|s| s.trim()).collect();
        if let [""] = names[..] {
            // An empty or blank value: most often a shell variable that was not set.
            return Err(Error::input(
                "--tools: no tool named (give `--tools none` to run without tools)",
            ));
        }
        if names.iter().any(|n| n.is_empty()) {
            return Err(Error::input(format!(
                "--tools: an empty tool name in {:?} (a stray comma?)",
                only.join(",")
            )));
        }
        if names.iter().any(|n| n.eq_ignore_ascii_case("none")) {
            if names.len() > 1 {
                return Err(Error::input(format!(
                    "--tools: \"none\" (no tools) stands alone, not with other names: {:?}",
                    only.join(",")
                )));
            }
            names.clear();
        }
        let mut available = Vec::new();
        if config.calculator.enabled {
            available.push("Calculator");
        }
        if config.calendar.enabled {
            available.push("Calendar");
        }
        for (name, present) in [
            ("WikiSearch", config.wikisearch.is_some()),
            ("QA", config.qa.is_some()),
            ("MT", config.mt.is_some()),
        ] {
            if present {
                available.push(name);
            }
        }
        // Call names or annotate's config keys ("Calculator" or "calculator", "QA" or "qa");
        // custom tools by their exact names, as annotate takes them.
        let same = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
        let custom = |n: &str| config.custom.contains_key(n);
        if let Some(bad) = names
            .iter()
            .find(|n| !custom(n) && !available.iter().any(|a| same(a, n)))
        {
            available.extend(config.custom.keys().map(String::as_str));
            return Err(Error::input(format!(
                "--tools: {bad:?} is not configured (available: {})",
                available.join(", ")
            )));
        }
        let keep = |n: &str| names.iter().any(|m| same(m, n));
        config.calculator.enabled &= keep("Calculator");
        config.calendar.enabled &= keep("Calendar");
        if !keep("WikiSearch") {
            config.wikisearch = None;
        }
        if !keep("QA") {
            config.qa = None;
        }
        if !keep("MT") {
            config.mt = None;
        }
        config
            .custom
            .retain(|name, _| names.contains(&name.as_str()));
    }
    let registry = ToolRegistry::from_config(&config).map_err(|e| match path {
        Some(path) => config_err(path, e.to_string()),
        None => Error::input(e.to_string()),
    })?;
    // Every tool kept is one generate may call (`Tool::check_ready`: a command tool's program).
    for name in registry.names() {
        if let Some(Err(why)) = registry.get(name).map(|t| t.check_ready()) {
            let msg = format!("tool {name}: {why}");
            return Err(match path {
                Some(path) => config_err(path, msg),
                None => Error::input(msg),
            });
        }
    }
    Ok(registry)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_come_from_the_tools_table_of_a_toml_or_json_file() {
        let dir = tempfile::tempdir().unwrap();
        let toml_path = dir.path().join("c.toml");
        std::fs::write(
            &toml_path,
            "seed = 3\n[per_tool.qa]\nk = 5\n[tools.calculator]\nenabled = false\n[tools.qa]\ncommand = [\"cat\"]\n",
        )
        .unwrap();
        let reg = tools_from_config(Some(&toml_path), None).unwrap();
        assert_eq!(reg.names(), vec!["Calendar", "QA"]);
        let only = ["qa".to_string()];
        assert_eq!(
            tools_from_config(Some(&toml_path), Some(&only))
                .unwrap()
                .names(),
            vec!["QA"]
        );
        let err = tools_from_config(Some(&toml_path), Some(&["Calculator".to_string()]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("Calculator") && err.contains("QA"), "{err}");

        // Custom tools by their exact names.
        let custom_path = dir.path().join("custom.toml");
        std::fs::write(
            &custom_path,
            "[tools.custom.Echo]\ncommand = [\"cat\"]\n[tools.custom.Other]\ncommand = [\"cat\"]\n",
        )
        .unwrap();
        let reg = tools_from_config(Some(&custom_path), None).unwrap();
        assert_eq!(reg.names(), vec!["Calculator", "Calendar", "Echo", "Other"]);
        let only = ["calendar".to_string(), "Echo".to_string()];
        let reg = tools_from_config(Some(&custom_path), Some(&only)).unwrap();
        assert_eq!(reg.names(), vec!["Calendar", "Echo"]);
        let err = tools_from_config(Some(&custom_path), Some(&["echo".to_string()]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("Echo, Other"), "{err}");

        let json_path = dir.path().join("c.json");
        std::fs::write(&json_path, r#"{"seed": 1}"#).unwrap();
        let reg = tools_from_config(Some(&json_path), None).unwrap();
        assert_eq!(reg.names(), vec!["Calculator", "Calendar"]);
        let none = ["none".to_string()];
        assert!(tools_from_config(None, Some(&none)).unwrap().is_empty());
        // An empty --tools is no list (an unset shell variable), not "none".
        assert!(tools_from_config(None, Some(&["".into()])).is_err());
        // "none" alone, and no empty names beside others (a stray comma).
        let names = |s: &str| s.split(',').map(String::from).collect::<Vec<_>>();
        for bad in ["none,calculator", "calculator,", "calculator,,calendar"] {
            let err = tools_from_config(None, Some(&names(bad)))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("--tools:") && err.contains(bad),
                "{bad}: {err}"
            );
        }

        std::fs::write(&json_path, r#"{"tools": {"calculater": {}}}"#).unwrap();
        let err = tools_from_config(Some(&json_path), None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("c.json") && err.contains("calculater"),
            "{err}"
        );
        // A tool that cannot be built names the file and the key ("tool WikiSearch: : No such
        // file or directory" before).
        std::fs::write(&toml_path, "[tools.wikisearch]\nindex = \"\"\n").unwrap();
        let err = tools_from_config(Some(&toml_path), None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&toml_path.display().to_string())
                && err.contains("[tools.wikisearch] index is empty"),
            "{err}"
        );
    }

    /// A top-level key annotate does not know is an error naming it (annotate refuses the same
    /// file), in TOML and JSON; annotate's own keys are accepted.
    #[test]
    fn unknown_top_level_keys_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let toml_path = dir.path().join("c.toml");
        for (text, key) in [
            ("[tool.calculator]\nenabled = false\n", "tool"),
            ("[annotate]\nk = 5\n", "annotate"),
            ("[per_tool.calculater]\nk = 5\n", "calculater"),
        ] {
            std::fs::write(&toml_path, text).unwrap();
            let err = tools_from_config(Some(&toml_path), None)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("c.toml") && err.contains(&format!("`{key}`")),
                "{text:?}: {err}"
            );
        }
        let json_path = dir.path().join("c.json");
        std::fs::write(
            &json_path,
            r#"{"tool": {"calculator": {"enabled": false}}}"#,
        )
        .unwrap();
        let err = tools_from_config(Some(&json_path), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("c.json") && err.contains("`tool`"), "{err}");
        // Annotate's printed defaults serve as is.
        std::fs::write(&toml_path, AnnotateConfig::default().to_toml()).unwrap();
        let reg = tools_from_config(Some(&toml_path), None).unwrap();
        assert_eq!(reg.names(), vec!["Calculator", "Calendar"]);
    }

    /// `--tools` keeps exactly the tools it names: a service not named goes (QA and MT), one
    /// not configured is an error, names are trimmed, and a custom tool is kept by its exact
    /// name only.
    #[test]
    fn only_the_named_tools_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[tools.qa]\ncommand = [\"cat\"]\n[tools.mt]\ncommand = [\"cat\"]\n\
             [tools.custom.Echo]\ncommand = [\"cat\"]\n[tools.custom.ECHO]\ncommand = [\"cat\"]\n",
        )
        .unwrap();
        let names = |only: &[&str]| {
            let only: Vec<String> = only.iter().map(|s| s.to_string()).collect();
            tools_from_config(Some(&path), Some(&only))
                .map(|r| r.names().into_iter().map(String::from).collect::<Vec<_>>())
        };
        assert_eq!(names(&["calendar"]).unwrap(), ["Calendar"]);
        assert_eq!(names(&[" qa ", "\tMT"]).unwrap(), ["QA", "MT"]);
        assert_eq!(names(&["Echo"]).unwrap(), ["Echo"]);
        assert_eq!(names(&["ECHO"]).unwrap(), ["ECHO"]);

        let e = tools_from_config(None, Some(&["mt".into()]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("\"mt\" is not configured (available: Calculator, Calendar)"),
            "{e}"
        );
        let e = tools_from_config(None, Some(&["WikiSearch".into()]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("\"WikiSearch\" is not configured"), "{e}");
    }

    /// A blank `--tools` is told as no tool named (an unset shell variable), not a stray comma.
    #[test]
    fn a_blank_tools_value_is_told_as_such() {
        let e = tools_from_config(None, Some(&[" ".into()]))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("--tools: no tool named"), "{e}");
    }

    /// A kept tool that cannot run (a command tool's program) is an error before generating,
    /// naming the file and the tool.
    #[test]
    fn a_tool_that_cannot_start_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[tools.qa]\ncommand = [\"/no/such/toolsift-program\"]\n",
        )
        .unwrap();
        let e = tools_from_config(Some(&path), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("tool QA: "),
            "{e}"
        );
        // Left out by --tools, it is not checked.
        let only = ["calculator".to_string()];
        let reg = tools_from_config(Some(&path), Some(&only)).unwrap();
        assert_eq!(reg.names(), ["Calculator"]);
    }

    /// WikiSearch, configured but not named by `--tools`, is left out like the services.
    #[test]
    fn wikisearch_not_named_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let docs = dir.path().join("docs.jsonl");
        std::fs::write(&docs, "{\"id\":\"a\",\"text\":\"A zebra.\"}\n").unwrap();
        let index = dir.path().join("idx");
        crate::annotate::tools::build_index(&docs, &index, "text").unwrap();
        let path = dir.path().join("c.toml");
        let text = format!(
            "[tools.wikisearch]\nindex = {:?}\n",
            index.display().to_string()
        );
        std::fs::write(&path, text).unwrap();
        let kept = |only: &str| {
            tools_from_config(Some(&path), Some(&[only.to_string()]))
                .unwrap()
                .names()
                .join(",")
        };
        assert_eq!(kept("calendar"), "Calendar");
        assert_eq!(kept("wikisearch"), "WikiSearch");
    }

    /// QA and MT are kept each by its own name only, and a built-in tool the file disables is
    /// not configured: naming it is an error, not a run without it.
    #[test]
    fn each_service_by_its_own_name_and_a_disabled_tool_is_not_configured() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[tools.qa]\ncommand = [\"cat\"]\n[tools.mt]\ncommand = [\"cat\"]\n\
             [tools.calendar]\nenabled = false\n",
        )
        .unwrap();
        let names = |only: &str| {
            tools_from_config(Some(&path), Some(&[only.to_string()]))
                .map(|r| r.names().join(","))
                .map_err(|e| e.to_string())
        };
        assert_eq!(names("qa").unwrap(), "QA");
        assert_eq!(names("mt").unwrap(), "MT");
        let e = names("calendar").unwrap_err();
        assert!(e.contains("\"calendar\" is not configured"), "{e}");
    }
}
