//! QA and MT (and any other user service) through an external command or HTTP endpoint.
//!
//! A failing, slow or absent service fails the candidate, never the run: every attempt has
//! a time limit, and a failed attempt is retried at most `retries` more times.
//!
//! - Command: `argv` is spawned directly (no shell, so the model's text is never
//!   interpreted); the input plus a newline is written to its stdin, and its stdout,
//!   trimmed, is the result (invalid UTF-8 replaced). Non-zero exit, empty output, more than
//!   [`MAX_OUTPUT_BYTES`] of output (the child is killed as soon as it has printed that much,
//!   whatever its exit status), or running past the timeout (the child is killed) is an
//!   error. A program that exits while a process it left in the background still holds
//!   its stdout open fails once the timeout has passed, with an error saying so (not a
//!   timeout, and not retried): wrappers should `exec` the real program. On Unix the command
//!   runs in a process group of its own, and both failures kill the whole group, so nothing a
//!   failed call started outlives it. A background process whose program succeeded (it closed
//!   its stdout) is left alone: a daemon a tool starts on purpose keeps running. A process
//!   ending on a signal kills every running command's group first ([`stop_tools_on_signals`]).
//! - HTTP: `POST url` with JSON `{"input": ..., "tool": name}`; the reply must be a 2xx
//!   with JSON `{"result": "..."}` (an `{"error": "..."}` reply is reported). The body is
//!   read as bytes whatever its Content-Type, invalid UTF-8 replaced, and a failed status
//!   stays in the error even when its body cannot be read. The timeout covers the whole
//!   exchange. Only `http://` URLs, checked when the tool is configured (a URI with a host
//!   and a port from 1 to 65535, if any): the client is built without TLS, as these
//!   services are expected on the local machine or network; the `HTTP(S)_PROXY` and
//!   `NO_PROXY` variables are honoured.
//!
//! Retried: timeouts, non-zero exits, connection failures, HTTP 5xx, 408 and 429. Not
//! retried, as another try would fail the same way: a command that cannot be spawned, empty
//! or oversized output, stdout held open after the program exited, other HTTP 4xx, a reply
//! that is not the expected JSON. Between tries the tool waits 50 ms, doubling, at most 1 s.

mod command;
mod http;
mod stop;

use std::thread;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{DocContext, Tool, ToolConfigError, ToolError};
use command::{check_program, run_command};
use http::{check_url, post_json};
pub use stop::stop_command_tools;
#[cfg(unix)]
pub use stop::{set_stop_note, stop_tools_on_signals};

/// Most bytes of output (stdout, or an HTTP reply body) accepted from a service.
pub const MAX_OUTPUT_BYTES: usize = 1 << 20;

/// Most retries a configuration may ask for.
const MAX_RETRIES: u32 = 10;

/// How an [`ExternalTool`] reaches its service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExternalBackend {
    /// Spawn `argv[0]` with arguments `argv[1..]`; input on stdin, result on stdout.
    Command {
        /// Program and arguments; no shell is involved.
        argv: Vec<String>,
    },
    /// POST JSON to `url` (http:// only).
    Http {
        /// Endpoint, e.g. "http://127.0.0.1:8080/qa".
        url: String,
    },
}

/// A tool answered by an external service, e.g. QA or MT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalTool {
    /// Name as it appears in calls, e.g. "QA".
    pub name: String,
    /// Where the service is.
    pub backend: ExternalBackend,
    /// Limit for one attempt.
    pub timeout: Duration,
    /// Extra attempts after a retryable failure.
    pub retries: u32,
}

/// Settings of an external tool; exactly one of `command` and `url` must be set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExternalToolConfig {
    /// Program and arguments to run for each call, e.g. `["python3", "qa.py"]`.
    pub command: Option<Vec<String>>,
    /// HTTP endpoint to POST each call to, e.g. "http://127.0.0.1:8080/qa".
    pub url: Option<String>,
    /// Limit for one attempt, in milliseconds (default 10000).
    pub timeout_ms: u64,
    /// Extra attempts after a retryable failure (default 2, at most 10).
    pub retries: u32,
}

impl Default for ExternalToolConfig {
    fn default() -> Self {
        Self {
            command: None,
            url: None,
            timeout_ms: 10_000,
            retries: 2,
        }
    }
}

impl ExternalTool {
    /// A tool that runs `argv` (10 s timeout, 2 retries).
    pub fn command(name: impl Into<String>, argv: Vec<String>) -> Self {
        Self::with_backend(name, ExternalBackend::Command { argv })
    }

    /// A tool that POSTs to `url` (10 s timeout, 2 retries).
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self::with_backend(name, ExternalBackend::Http { url: url.into() })
    }

    fn with_backend(name: impl Into<String>, backend: ExternalBackend) -> Self {
        let defaults = ExternalToolConfig::default();
        Self {
            name: name.into(),
            backend,
            timeout: Duration::from_millis(defaults.timeout_ms),
            retries: defaults.retries,
        }
    }

    /// Sets the per-attempt time limit.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets the number of extra attempts.
    pub fn with_retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The tool `config` describes, called `name`; checks the settings.
    pub fn from_config(name: &str, config: &ExternalToolConfig) -> Result<Self, ToolConfigError> {
        let invalid = |message: String| ToolConfigError::Invalid {
            tool: name.to_string(),
            message,
        };
        let backend = match (&config.command, &config.url) {
            (Some(argv), None) => {
                if argv.first().is_none_or(|program| program.is_empty()) {
                    return Err(invalid("command must name a program".into()));
                }
                ExternalBackend::Command { argv: argv.clone() }
            }
            (None, Some(url)) => {
                if !url.starts_with("http://") {
                    return Err(invalid(format!(
                        "url {url:?} must start with http:// (https is not built in)"
                    )));
                }
                check_url(url)
                    .map_err(|why| invalid(format!("url {url:?} is not valid: {why}")))?;
                ExternalBackend::Http { url: url.clone() }
            }
            _ => return Err(invalid("set exactly one of `command` and `url`".into())),
        };
        if config.timeout_ms == 0 {
            return Err(invalid("timeout_ms must be at least 1".into()));
        }
        if config.retries > MAX_RETRIES {
            return Err(invalid(format!(
                "retries is {}, at most {MAX_RETRIES} allowed",
                config.retries
            )));
        }
        Ok(Self {
            name: name.to_string(),
            backend,
            timeout: Duration::from_millis(config.timeout_ms),
            retries: config.retries,
        })
    }

    fn attempt(&self, input: &str) -> Result<String, Attempt> {
        match &self.backend {
            ExternalBackend::Command { argv } => run_command(argv, input, self.timeout),
            ExternalBackend::Http { url } => post_json(url, &self.name, input, self.timeout),
        }
    }
}

impl Tool for ExternalTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn check_ready(&self) -> Result<(), String> {
        match &self.backend {
            ExternalBackend::Command { argv } => {
                let program = argv.first().map_or("", String::as_str);
                check_program(program)
                    .map_err(|why| format!("command's program {program:?} cannot run: {why}"))
            }
            // A service may come up by the time the first call is made.
            ExternalBackend::Http { .. } => Ok(()),
        }
    }

    fn call(&self, input: &str, _doc: &DocContext<'_>) -> Result<String, ToolError> {
        let mut backoff = Duration::from_millis(50);
        let mut tries = 0;
        loop {
            tries += 1;
            match self.attempt(input) {
                Ok(result) => return Ok(result),
                Err(Attempt { error, retry }) => {
                    if !retry || tries > self.retries {
                        return Err(match error {
                            ToolError::Failed(msg) if tries > 1 => {
                                ToolError::Failed(format!("{msg} (after {tries} tries)"))
                            }
                            ToolError::Timeout { after, .. } => ToolError::Timeout { after, tries },
                            other => other,
                        });
                    }
                }
            }
            thread::sleep(backoff);
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }
}

/// One failed attempt, and whether another could go differently.
#[derive(Debug)]
struct Attempt {
    error: ToolError,
    retry: bool,
}

fn final_err(message: String) -> Attempt {
    Attempt {
        error: ToolError::Failed(message),
        retry: false,
    }
}

fn retry_err(message: String) -> Attempt {
    Attempt {
        error: ToolError::Failed(message),
        retry: true,
    }
}

fn timeout_err(timeout: Duration) -> Attempt {
    Attempt {
        error: ToolError::Timeout {
            after: timeout,
            tries: 1,
        },
        retry: true,
    }
}

/// The first `max` characters of `text`, with "…" if cut.
fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// What the tests of each part share.
#[cfg(test)]
mod testing {
    use super::*;
    use std::time::Instant;

    pub(super) fn argv(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|s| s.to_string()).collect()
    }

    pub(super) fn run(tool: &ExternalTool, input: &str) -> Result<String, ToolError> {
        tool.call(input, &DocContext::default())
    }

    pub(super) fn sh(script: &str) -> ExternalTool {
        ExternalTool::command("QA", argv(&["sh", "-c", script]))
            .with_timeout(Duration::from_secs(5))
            .with_retries(0)
    }

    /// Whether `pid` is gone (or a zombie waiting for init) within `wait`.
    #[cfg(target_os = "linux")]
    pub(super) fn ends_within(pid: &str, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        loop {
            let gone = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => true,
                // The state follows the parenthesised command name.
                Ok(stat) => stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z')),
            };
            if gone || Instant::now() > deadline {
                return gone;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{argv, run, sh};
    use super::*;

    #[test]
    fn retries_are_bounded_and_can_recover() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("tries");
        let script = format!("echo x >> '{}'; exit 1", log.display());
        let err = run(&sh(&script).with_retries(2), "x").unwrap_err();
        assert!(err.to_string().contains("after 3 tries"), "{err}");
        let tries = std::fs::read_to_string(&log).unwrap().lines().count();
        assert_eq!(tries, 3);

        let flag = dir.path().join("flag");
        let flaky = format!(
            "if [ -e '{0}' ]; then echo recovered; else touch '{0}'; exit 1; fi",
            flag.display()
        );
        assert_eq!(
            run(&sh(&flaky).with_retries(1), "x"),
            Ok("recovered".into())
        );
    }

    #[test]
    fn a_retried_timeout_says_how_many_tries() {
        let tool = ExternalTool::command("QA", argv(&["sleep", "5"]))
            .with_timeout(Duration::from_millis(100))
            .with_retries(1);
        let err = run(&tool, "x").unwrap_err();
        assert_eq!(
            err.to_string(),
            "timed out after 100ms (the last of 2 tries)"
        );
    }

    fn url(url: &str) -> ExternalToolConfig {
        ExternalToolConfig {
            url: Some(url.into()),
            ..Default::default()
        }
    }

    #[test]
    fn urls_are_checked_when_configured() {
        for good in [
            "http://x",
            "http://127.0.0.1:8080/qa",
            "http://localhost:65535/a/b?c=d",
            "http://[::1]:8080/qa",
            "http://[::1]/qa",
            "http://user:pw@host:80/qa",
        ] {
            let tool = ExternalTool::from_config("QA", &url(good));
            assert!(tool.is_ok(), "{good}: {:?}", tool.err());
        }
        let err = ExternalTool::from_config("MT", &url("http://127.0.0.1:99999/x")).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("tool MT:") && msg.contains("http://127.0.0.1:99999/x"),
            "{msg}"
        );
        assert!(msg.contains("99999"), "{msg}");
    }

    #[test]
    fn config_validation() {
        let ok = ExternalToolConfig {
            command: Some(argv(&["cat"])),
            ..Default::default()
        };
        let tool = ExternalTool::from_config("QA", &ok).unwrap();
        assert_eq!(tool.timeout, Duration::from_secs(10));
        assert_eq!(tool.retries, 2);
        for bad in [
            ExternalToolConfig::default(),
            ExternalToolConfig {
                command: Some(vec![]),
                ..Default::default()
            },
            ExternalToolConfig {
                command: Some(argv(&["cat"])),
                url: Some("http://x".into()),
                ..Default::default()
            },
            ExternalToolConfig {
                url: Some("https://example.com".into()),
                ..Default::default()
            },
            url("http://"),
            url("http:// spaces/x"),
            url("http://127.0.0.1:99999/x"),
            url("http://127.0.0.1:0/x"),
            url("http://127.0.0.1:8o80/x"),
            url("http://:8080/x"),
            url("http://user@:8080/x"),
            ExternalToolConfig {
                timeout_ms: 0,
                ..ok.clone()
            },
            ExternalToolConfig {
                retries: 11,
                ..ok.clone()
            },
        ] {
            let err = ExternalTool::from_config("QA", &bad).unwrap_err();
            assert!(err.to_string().starts_with("tool QA:"), "{err}");
        }
    }

    /// A command whose program is an empty string names none: refused when configured, not
    /// a spawn failure on every call.
    #[test]
    fn a_command_whose_program_is_empty_is_refused() {
        let config = ExternalToolConfig {
            command: Some(argv(&["", "qa.py"])),
            ..Default::default()
        };
        let err = ExternalTool::from_config("QA", &config).unwrap_err();
        assert!(err.to_string().contains("must name a program"), "{err}");
    }

    /// An https URL is refused with the reason (no TLS is built in), not a parse detail.
    #[test]
    fn an_https_url_is_refused_as_not_built_in() {
        let err = ExternalTool::from_config("QA", &url("https://example.com/qa")).unwrap_err();
        assert!(err.to_string().contains("https is not built in"), "{err}");
    }

    /// A bracketed IPv6 host's port is the part after its last colon, checked like any other.
    #[test]
    fn an_ipv6_hosts_port_is_checked() {
        for bad in ["http://[::1]:99999/x", "http://[::1]:0/x"] {
            assert!(ExternalTool::from_config("QA", &url(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn shorten_keeps_max_characters_and_marks_a_cut() {
        assert_eq!(shorten("abc", 3), "abc");
        assert_eq!(shorten("abcd", 3), "abc…");
        assert_eq!(shorten("éèêë", 2), "éè…");
        assert_eq!(shorten("", 0), "");
    }

    /// Between tries the tool waits 50 ms, then 100, then 200 (doubling): each try starts at
    /// least that long after the one before.
    #[test]
    fn retries_wait_50_ms_doubling_between_tries() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("starts");
        let script = format!("date +%s%N >> '{}'; exit 1", log.display());
        assert!(run(&sh(&script).with_retries(3), "x").is_err());
        let starts: Vec<u128> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect();
        assert_eq!(starts.len(), 4);
        for (gap, least_ms) in starts.windows(2).zip([50, 100, 200]) {
            let ms = (gap[1] - gap[0]) / 1_000_000;
            assert!(ms >= least_ms, "{ms} ms < {least_ms} ms: {starts:?}");
        }
    }

    /// The configured timeout and retries are the tool's, not the defaults.
    #[test]
    fn a_configured_timeout_and_retries_are_used() {
        let config = ExternalToolConfig {
            command: Some(argv(&["cat"])),
            timeout_ms: 2345,
            retries: 7,
            ..Default::default()
        };
        let tool = ExternalTool::from_config("QA", &config).unwrap();
        assert_eq!(
            (tool.timeout, tool.retries),
            (Duration::from_millis(2345), 7)
        );
    }

    /// The wait between tries stops doubling at 1 s: 50, 100, 200, 400, 800, then 1000 ms.
    #[test]
    fn the_wait_between_tries_stops_doubling_at_one_second() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("starts");
        let script = format!("date +%s%N >> '{}'; exit 1", log.display());
        assert!(run(&sh(&script).with_retries(7), "x").is_err());
        let starts: Vec<u128> = std::fs::read_to_string(&log)
            .unwrap()
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect();
        assert_eq!(starts.len(), 8);
        let gaps: Vec<u128> = starts
            .windows(2)
            .map(|w| (w[1] - w[0]) / 1_000_000)
            .collect();
        // Without the bound the last two would be 1.6 s and 3.2 s; the upper bound leaves a
        // loaded machine 2 s to start a shell.
        for &ms in &gaps[5..] {
            assert!((1000..3000).contains(&ms), "{gaps:?}");
        }
    }
}
