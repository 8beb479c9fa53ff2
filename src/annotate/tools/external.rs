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

use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{DocContext, Tool, ToolConfigError, ToolError};

/// Most bytes of output (stdout, or an HTTP reply body) accepted from a service.
pub const MAX_OUTPUT_BYTES: usize = 1 << 20;
/// Most stderr bytes kept for an error message.
const STDERR_KEEP: usize = 4096;
/// How long stdout may stay open after the program exited when its timeout is (almost) spent.
const EXIT_GRACE: Duration = Duration::from_millis(100);
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

/// Why `program` cannot be started as `Command::new(program)` would start it, if it cannot: a
/// path (with a slash) must be an executable file, a name that of an executable file in `PATH`
/// (unset: execvp's default, /bin:/usr/bin). For a run about to start (it reads the disk;
/// `Tool::check_ready`), so that a typo is one error naming the tool, not a failure of every
/// call in a run that then finishes. Elsewhere than Unix the lookup has other rules
/// (extensions), and nothing is checked.
#[cfg(unix)]
fn check_program(program: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;
    let runnable = |m: &std::fs::Metadata| m.is_file() && m.permissions().mode() & 0o111 != 0;
    let path = Path::new(program);
    if program.contains('/') {
        return match std::fs::metadata(path) {
            Ok(m) if !m.is_file() => Err("it is not a file".into()),
            Ok(m) if !runnable(&m) => Err("it is not executable".into()),
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        };
    }
    let search = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    let found = std::env::split_paths(&search)
        .any(|dir| std::fs::metadata(dir.join(path)).is_ok_and(|m| runnable(&m)));
    if found {
        Ok(())
    } else {
        Err("no executable file of that name in PATH".into())
    }
}

#[cfg(not(unix))]
fn check_program(_program: &str) -> Result<(), String> {
    Ok(())
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

/// Why `url` (which starts with "http://") cannot be POSTed to, if it cannot: it must parse as
/// a URI (no spaces or other invalid characters) and name a host, and a port must be a number
/// up to 65535. Checked when the tool is configured, so that a typo is not a failure of every
/// call at run time.
fn check_url(url: &str) -> Result<(), String> {
    let uri: ureq::http::Uri = url.parse().map_err(|e| format!("{e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err("the scheme must be http".into());
    }
    let authority = uri.authority().ok_or("no host")?;
    if authority.host().is_empty() {
        return Err("no host".into());
    }
    // "host:" and "host:99999" parse, but name no port a connection can use.
    let host_port = authority.as_str().rsplit('@').next().unwrap_or_default();
    let port_text = host_port
        .rsplit_once(':')
        .filter(|(_, after)| !after.contains(']'))
        .map(|(_, port)| port);
    if let Some(port) = port_text {
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return Err(format!("port {port:?} is not a number from 1 to 65535")),
        }
    }
    Ok(())
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

/// Kills and reaps the child when dropped, so that no early return leaves it running.
struct Reaper(Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Starts the command in a process group of its own (whose id is the child's pid), so that
/// `kill_group` reaches what it leaves behind and nothing else. Out of toolsift's group, it
/// would not die with a run that is killed or interrupted (Ctrl-C signals the terminal's
/// group): on Linux the kernel kills it when the thread that started it ends (the call runs on
/// that thread until the program exits, so only a dead run ends it early).
fn own_group(command: &mut Command) -> &mut Command {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        command.process_group(0);
    }
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let parent = std::process::id();
        // SAFETY: runs in the forked child before exec: prctl(2) and getppid(2) are
        // async-signal-safe and touch no memory of ours.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The run died between the fork and the prctl: the signal will never come.
                if libc::getppid() as u32 != parent {
                    return Err(std::io::Error::other(
                        "toolsift exited while starting the tool",
                    ));
                }
                Ok(())
            });
        }
    }
    command
}

/// The process groups of the command tools running now (each its leader's pid), for
/// [`stop_command_tools`].
static RUNNING: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Set by [`stop_command_tools`]: the process is ending, and no call may report any more.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// Kills the process group of every command tool running now, everything the tools started
/// included, and holds every call in progress or still to come where it is, never to report:
/// a call whose tool was killed here would otherwise be recorded as failed, and a resumed run
/// would not call it again. For a process about to end, as on a signal
/// ([`stop_tools_on_signals`]); a tool's own process dies with the process anyway (Linux), but
/// not what it started.
pub fn stop_command_tools() {
    STOPPING.store(true, Ordering::SeqCst);
    let running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
    for &pid in running.iter() {
        kill_group_of(pid);
    }
}

/// Ends the process on SIGINT, SIGTERM or SIGHUP as the signal would, after
/// [`stop_command_tools`]: so that Ctrl-C, `kill` or a scheduler's stop (Slurm, Kubernetes)
/// leaves no process a command tool started. The signals' default action stays otherwise
/// (the output and journal are as a killed run leaves them: `--resume` goes on). For the
/// `toolsift` command; a program that embeds the driver chooses whether to call it. Not on
/// SIGKILL, which no process can catch. A signal the process was started ignoring stays ignored:
/// `nohup` leaves SIGHUP so, and a non-interactive shell SIGINT for its background jobs, so that
/// the run outlives the terminal or the Ctrl-C.
#[cfg(unix)]
pub fn stop_tools_on_signals() -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let watched: Vec<i32> = [SIGINT, SIGTERM, SIGHUP]
        .into_iter()
        .filter(|&signal| !is_ignored(signal))
        .collect();
    if watched.is_empty() {
        return Ok(());
    }
    let mut signals = signal_hook::iterator::Signals::new(watched)?;
    thread::Builder::new()
        .name("toolsift-signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                stop_command_tools();
                if let Some(note) = STOP_NOTE.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                    let name = match signal {
                        SIGINT => "SIGINT",
                        SIGTERM => "SIGTERM",
                        _ => "SIGHUP",
                    };
                    // On a line of its own: a progress bar may hold the cursor. Not eprintln,
                    // which panics when stderr is gone (`| tee log` ended by the same Ctrl-C),
                    // and not on this thread: another may hold stderr's lock, blocked on a full
                    // pipe nobody reads (`2>&1 | less`, a stalled log driver), and this thread
                    // must go on to end the process. A note that cannot be written in 200 ms
                    // is left unwritten.
                    let line = format!("\ntoolsift: stopped by {name}: {note}\n");
                    let (done, written) = mpsc::channel();
                    let writer = thread::Builder::new().spawn(move || {
                        let _ = std::io::stderr().lock().write_all(line.as_bytes());
                        let _ = done.send(());
                    });
                    if writer.is_ok() {
                        let _ = written.recv_timeout(Duration::from_millis(200));
                    }
                }
                let _ = signal_hook::low_level::emulate_default_handler(signal);
                // Not reached: the default action of these three ends the process.
                std::process::exit(128 + signal);
            }
        })?;
    Ok(())
}

/// Whether `signal`'s action is SIG_IGN now (a handler installed for it would undo that).
#[cfg(unix)]
fn is_ignored(signal: i32) -> bool {
    // SAFETY: sigaction with no new action only writes the current one into `current`, a
    // zeroed plain C struct.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction == libc::SIG_IGN
    }
}

/// What [`stop_tools_on_signals`] prints when a signal ends the run (see [`set_stop_note`]).
#[cfg(unix)]
static STOP_NOTE: Mutex<Option<String>> = Mutex::new(None);

/// The line a signal that ends the run prints on stderr after "toolsift: stopped by SIGINT: ",
/// say where the work done is kept and how to go on ("the journal X keeps the lines done; run
/// the same command again to resume"). Replaces an earlier note; without one the run ends
/// silently, as the signal's default action does.
#[cfg(unix)]
pub fn set_stop_note(note: impl Into<String>) {
    *STOP_NOTE.lock().unwrap_or_else(|e| e.into_inner()) = Some(note.into());
}

/// Where a call stops once [`stop_command_tools`] has run: the process is ending.
fn hold_if_stopping() {
    while STOPPING.load(Ordering::SeqCst) {
        thread::park();
    }
}

/// Lists a started tool's group in [`RUNNING`] while the call runs.
struct Running(u32);

impl Running {
    fn start(child: &Child) -> Self {
        RUNNING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(child.id());
        Running(child.id())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = running.iter().position(|&pid| pid == self.0) {
            running.swap_remove(i);
        }
    }
}

/// Kills every process left in the group `own_group` gave `child`. Called only while the group
/// has a live member (the child itself, or the process that holds its stdout), so its id cannot
/// have been reused for another group.
fn kill_group(child: &Child) {
    kill_group_of(child.id());
}

/// Kills the process group whose leader's pid is `pid`.
fn kill_group_of(pid: u32) {
    #[cfg(unix)]
    if let Ok(pgid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) takes plain integers and touches no memory of ours; a negative pid
        // names the process group.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
    #[cfg(not(unix))]
    let _ = pid;
}

/// Runs `work` on a new thread; failing to start one (OS limits) fails the attempt
/// instead of panicking as `thread::spawn` would.
fn spawn(work: impl FnOnce() + Send + 'static) -> Result<(), Attempt> {
    thread::Builder::new()
        .name("toolsift-external-io".into())
        .spawn(work)
        .map(drop)
        .map_err(|e| retry_err(format!("cannot start an I/O thread: {e}")))
}

/// Reads `pipe` on a thread: up to `keep` bytes are sent back, the rest drained (so the
/// child never blocks on a full pipe); the flag says whether there was more. That is sent as
/// soon as the first byte past `keep` arrives, not at the end of the output: a program that
/// prints without end is stopped then, not at its timeout. With `give_up`, once its flag is set
/// (the call has ended) the thread reads what is there (up to `STOP_DRAIN_BYTES`), sends what
/// it kept and hands the pipe to [`drain`]: a process the program left running in the
/// background (a daemon the tool starts on purpose) may hold the pipe for as long as it lives,
/// and a thread blocked on it for every such call would pile up.
fn read_pipe(
    mut pipe: impl Read + Send + 'static,
    keep: usize,
    give_up: Option<GiveUp>,
) -> Result<mpsc::Receiver<(Vec<u8>, bool)>, Attempt> {
    let (tx, rx) = mpsc::channel();
    spawn(move || {
        let mut kept = Vec::new();
        let mut sent = false;
        let mut chunk = [0u8; 8192];
        let mut after_stop = 0;
        let mut hand_over = false;
        loop {
            if let Some(g) = &give_up {
                if after_stop > STOP_DRAIN_BYTES || !g.wait_readable() {
                    hand_over = true;
                    break;
                }
            }
            let n = match pipe.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            if give_up.as_ref().is_some_and(GiveUp::stopped) {
                after_stop += n;
            }
            if !sent {
                let room = keep - kept.len();
                kept.extend_from_slice(&chunk[..n.min(room)]);
                if n > room {
                    let _ = tx.send((std::mem::take(&mut kept), true));
                    sent = true;
                }
            }
        }
        if !sent {
            let _ = tx.send((kept, false));
        }
        if let (true, Some(g)) = (hand_over, &give_up) {
            g.hand_over(Box::new(pipe));
        }
    })?;
    Ok(rx)
}

/// What a `read_pipe` thread told to give up still reads once the call has ended, before it
/// hands the pipe over: the end of the program's own output, not a daemon's stream without end.
const STOP_DRAIN_BYTES: usize = 64 * 1024;

/// Tells a `read_pipe` thread that the call has ended (its flag, set by `SetOnDrop`).
struct GiveUp {
    #[cfg(unix)]
    fd: std::os::fd::RawFd,
    stop: std::sync::Arc<AtomicBool>,
}

impl GiveUp {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Until the pipe has something to read (or is at its end): true; false once the call has
    /// ended and nothing is left to read now.
    fn wait_readable(&self) -> bool {
        #[cfg(unix)]
        loop {
            let stopping = self.stopped();
            let mut poll = libc::pollfd {
                fd: self.fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: poll(2) on one pollfd of ours, for a descriptor the reading thread owns
            // (the pipe, alive as long as this thread runs).
            let ready = unsafe { libc::poll(&mut poll, 1, if stopping { 0 } else { 100 }) };
            let interrupted = ready < 0
                && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
            if ready != 0 && !interrupted {
                return true; // readable, at its end, or an error the read will report
            }
            if ready == 0 && stopping {
                return false;
            }
        }
        #[cfg(not(unix))]
        !self.stopped()
    }

    /// The pipe goes on being read, and what comes discarded, by [`drain`] (unix); elsewhere it
    /// is closed.
    fn hand_over(&self, pipe: Box<dyn Send>) {
        #[cfg(unix)]
        drain::adopt(self.fd, pipe);
        #[cfg(not(unix))]
        drop(pipe);
    }
}

/// Sets its flag when dropped: the call has ended, whichever way.
struct SetOnDrop(std::sync::Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Pipes whose call has ended but that a process the tool left running still holds: one thread
/// for all of them reads and discards what those processes write, until each lets go of its
/// end. Closing ours instead would kill such a daemon with SIGPIPE at its next write (std
/// resets SIGPIPE to its default in the programs it starts).
#[cfg(unix)]
mod drain {
    use std::os::fd::RawFd;
    use std::sync::{Condvar, Mutex, Once};
    use std::time::Duration;

    /// The pipes, each with what keeps its descriptor open (dropped when it is removed).
    static ADOPTED: Mutex<Vec<(RawFd, Box<dyn Send>)>> = Mutex::new(Vec::new());
    /// Wakes the thread when a pipe is adopted (it sleeps while there is none).
    static ADDED: Condvar = Condvar::new();
    static STARTED: Once = Once::new();

    /// Drains `fd`, kept open by `owner`, from now on.
    pub(super) fn adopt(fd: RawFd, owner: Box<dyn Send>) {
        let mut started = true;
        STARTED.call_once(|| {
            started = std::thread::Builder::new()
                .name("toolsift-drain".into())
                .spawn(run)
                .is_ok();
        });
        if !started {
            return; // no thread to read it (OS limits): closed, as before there was one
        }
        ADOPTED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((fd, owner));
        ADDED.notify_one();
    }

    fn run() {
        let mut scratch = [0u8; 8192];
        loop {
            let mut polls: Vec<libc::pollfd> = {
                let mut adopted = ADOPTED.lock().unwrap_or_else(|e| e.into_inner());
                while adopted.is_empty() {
                    adopted = ADDED.wait(adopted).unwrap_or_else(|e| e.into_inner());
                }
                adopted
                    .iter()
                    .map(|&(fd, _)| libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    })
                    .collect()
            };
            // SAFETY: poll(2) over pollfds of descriptors only this thread closes (by removing
            // them below), all open until then. A pipe adopted meanwhile waits for the next
            // round, at most 200 ms.
            let ready = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, 200) };
            if ready <= 0 {
                continue;
            }
            let mut done = Vec::new();
            for p in polls.iter().filter(|p| p.revents != 0) {
                // SAFETY: read(2) into a live buffer of its length, on an open descriptor that
                // poll says will not block.
                let n = unsafe { libc::read(p.fd, scratch.as_mut_ptr().cast(), scratch.len()) };
                let interrupted = n < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted;
                if n == 0 || (n < 0 && !interrupted) {
                    done.push(p.fd); // every writer let go, or the pipe failed
                }
            }
            if !done.is_empty() {
                ADOPTED
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|(fd, _)| !done.contains(fd));
            }
            std::thread::sleep(Duration::from_millis(1)); // a chatty daemon: yield between rounds
        }
    }
}

fn run_command(argv: &[String], input: &str, timeout: Duration) -> Result<String, Attempt> {
    let Some((program, args)) = argv.split_first() else {
        return Err(final_err("no command configured".into()));
    };
    let now = Instant::now();
    // A timeout too large to add (fields are public) means "no practical limit".
    let deadline = now
        .checked_add(timeout)
        .unwrap_or(now + Duration::from_secs(365 * 24 * 3600));
    let child = own_group(&mut Command::new(program))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| final_err(format!("cannot run {program:?}: {e}")))?;
    let mut child = Reaper(child);
    // Listed until the call ends (dropped before `child`, whose drop reaps the program).
    let _running = Running::start(&child.0);
    if STOPPING.load(Ordering::SeqCst) {
        // Started as the process was being stopped, after the others were killed.
        kill_group(&child.0);
        hold_if_stopping();
    }

    if let Some(mut stdin) = child.0.stdin.take() {
        let mut bytes = input.as_bytes().to_vec();
        bytes.push(b'\n');
        // A child that exits without reading its input is not an error in itself.
        spawn(move || {
            let _ = stdin.write_all(&bytes);
        })?;
    }
    let stdout = child
        .0
        .stdout
        .take()
        .map(|p| read_pipe(p, MAX_OUTPUT_BYTES, None))
        .transpose()?;
    // Read only while the call lasts: a background process (a daemon the tool starts on
    // purpose) may keep stderr for ever, and its reader gives up when the call ends.
    let stop_stderr = SetOnDrop(Default::default());
    let stderr = child
        .0
        .stderr
        .take()
        .map(|p| {
            let give_up = GiveUp {
                #[cfg(unix)]
                fd: std::os::fd::AsRawFd::as_raw_fd(&p),
                stop: stop_stderr.0.clone(),
            };
            read_pipe(p, STDERR_KEEP, Some(give_up))
        })
        .transpose()?;

    // What stdout's reader sent while the program ran: too much output ends the wait.
    let mut printed: Option<(Vec<u8>, bool)> = None;
    let status = wait_until(&mut child.0, deadline, || {
        if let (None, Some(rx)) = (&printed, &stdout) {
            printed = rx.try_recv().ok();
        }
        printed.as_ref().is_some_and(|&(_, more)| more)
    })
    .map_err(|e| retry_err(format!("waiting for {program:?} failed: {e}")));
    // A program killed by `stop_command_tools` did not fail: the process is ending.
    hold_if_stopping();
    let status = status?;
    let too_much = || {
        final_err(format!(
            "{program:?} printed more than {MAX_OUTPUT_BYTES} bytes"
        ))
    };
    let Some(status) = status else {
        // Still running, so the group exists: it goes with everything it started.
        kill_group(&child.0);
        return Err(match printed {
            Some((_, true)) => too_much(),
            _ => timeout_err(timeout),
        });
    };
    // The program has exited: what it printed is in the pipe, so stdout ends at once unless
    // another process (a child it left in the background) still holds it open. A program that
    // exits just at the deadline gets a moment for the reader to see the end of its output.
    let remaining = deadline
        .saturating_duration_since(Instant::now())
        .max(EXIT_GRACE);
    let output = match (printed, stdout) {
        (Some(printed), _) => Some(printed),
        (None, Some(rx)) => rx.recv_timeout(remaining).ok(),
        (None, None) => Some((Vec::new(), false)),
    };
    // The program has ended: stderr's reader gives up once it has read what is there (a
    // process left in the background may hold the pipe), which takes up to its poll's 100 ms.
    stop_stderr.0.store(true, Ordering::SeqCst);
    let err_text = stderr
        .and_then(|rx| rx.recv_timeout(Duration::from_millis(250)).ok())
        .map(|(bytes, _)| String::from_utf8_lossy(&bytes).trim().to_string())
        .unwrap_or_default();
    // Every failure below ends what the call started: the program has exited, and whatever
    // it left in its group goes too (a failed call is retried, and each try would leave one
    // more). The group's id cannot name another group while any of its members lives; with
    // none left, only a pid counter that wrapped round within these microseconds could give
    // the id to a new group.
    let failed = |attempt: Attempt| {
        kill_group(&child.0);
        Err(attempt)
    };
    // Checked first, whatever the exit status, and not retried: every try would wait as
    // long again.
    let Some((out, out_dropped)) = output else {
        return failed(final_err(format!(
            "{program:?} exited but its stdout stayed open for the rest of the {timeout:?} \
             timeout ({status}; a background process held it; its process group was killed; \
             wrappers should exec)"
        )));
    };
    // Before the exit status: however the program ended, too much output is the failure
    // (when the wait saw it first, there was no status to report).
    if out_dropped {
        return failed(too_much());
    }
    if !status.success() {
        let detail = if err_text.is_empty() {
            String::new()
        } else {
            format!(": {}", shorten(&err_text, 300))
        };
        return failed(retry_err(format!("{program:?} {status}{detail}")));
    }
    let text = String::from_utf8_lossy(&out).trim().to_string();
    if text.is_empty() {
        return failed(final_err(format!("{program:?} printed nothing")));
    }
    Ok(text)
}

/// Waits for the child until `deadline`, or until `stop` says to give up (it is asked between
/// polls); Ok(None) if it is still running then.
fn wait_until(
    child: &mut Child,
    deadline: Instant,
    mut stop: impl FnMut() -> bool,
) -> std::io::Result<Option<ExitStatus>> {
    // Poll quickly at first: most services answer in milliseconds.
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline || stop() {
            return Ok(None);
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// The first `max` characters of `text`, with "…" if cut.
fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

#[derive(Serialize)]
struct HttpRequest<'a> {
    input: &'a str,
    tool: &'a str,
}

#[derive(Deserialize)]
struct HttpReply {
    result: Option<serde_json::Value>,
    error: Option<serde_json::Value>,
}

fn post_json(url: &str, tool: &str, input: &str, timeout: Duration) -> Result<String, Attempt> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        // A redirect is the reply (below): followed, a 302 turns the POST into a GET without
        // the input, and its target's answer would be taken for the tool's.
        .max_redirects(0)
        .build()
        .into();
    let transport = |e: ureq::Error| -> Attempt {
        match e {
            ureq::Error::Timeout(_) => timeout_err(timeout),
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
                timeout_err(timeout)
            }
            ureq::Error::Io(_)
            | ureq::Error::ConnectionFailed
            | ureq::Error::HostNotFound
            | ureq::Error::Protocol(_) => retry_err(format!("POST {url}: {e}")),
            other => final_err(format!("POST {url}: {other}")),
        }
    };
    let mut response = agent
        .post(url)
        .send_json(&HttpRequest { input, tool })
        .map_err(transport)?;
    let status = response.status().as_u16();
    let success = (200..300).contains(&status);
    let retry_status = status >= 500 || status == 408 || status == 429;
    let by_status = |message: String| {
        if retry_status {
            retry_err(message)
        } else {
            final_err(message)
        }
    };
    // Before the body: a redirect names its target whatever its body (unreadable, too large).
    if (300..400).contains(&status) {
        let to = response
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok())
            .unwrap_or("nowhere given");
        return Err(final_err(format!(
            "POST {url}: HTTP {status} redirects to {to}; redirects are not followed: give the \
             service's own URL"
        )));
    }
    // Bytes, whatever the Content-Type says (ureq decodes only text/* leniently): invalid
    // UTF-8 is replaced, as in a command's output.
    let body = match response
        .body_mut()
        .with_config()
        .limit(MAX_OUTPUT_BYTES as u64)
        .read_to_vec()
    {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        // A failed reply whose body cannot be read still fails for its status.
        Err(e) if !success => {
            return Err(by_status(format!(
                "POST {url}: HTTP {status} (its body could not be read: {})",
                body_error(e)
            )))
        }
        Err(ureq::Error::BodyExceedsLimit(_)) => {
            return Err(final_err(format!(
                "POST {url}: reply is larger than {MAX_OUTPUT_BYTES} bytes"
            )))
        }
        Err(other) => return Err(transport(other)),
    };
    if !success {
        return Err(by_status(format!(
            "POST {url}: HTTP {status}: {}",
            shorten(body.trim(), 300)
        )));
    }
    let reply: HttpReply = crate::util::json::object_from_str(&body).map_err(|e| {
        final_err(format!(
            "POST {url}: reply is not JSON {{\"result\": ...}}: {e}"
        ))
    })?;
    match (reply.result, reply.error) {
        (Some(serde_json::Value::String(text)), _) if !text.trim().is_empty() => {
            Ok(text.trim().to_string())
        }
        (_, Some(error)) if !error.is_null() => Err(final_err(format!(
            "POST {url}: service error: {}",
            shorten(&json_text(&error), 300)
        ))),
        (Some(serde_json::Value::String(_)), _) => {
            Err(final_err(format!("POST {url}: empty result")))
        }
        _ => Err(final_err(format!(
            "POST {url}: reply has no string \"result\""
        ))),
    }
}

fn body_error(e: ureq::Error) -> String {
    match e {
        ureq::Error::BodyExceedsLimit(_) => format!("larger than {MAX_OUTPUT_BYTES} bytes"),
        other => other.to_string(),
    }
}

fn json_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    fn argv(parts: &[&str]) -> Vec<String> {
        parts.iter().map(|s| s.to_string()).collect()
    }

    fn run(tool: &ExternalTool, input: &str) -> Result<String, ToolError> {
        tool.call(input, &DocContext::default())
    }

    fn sh(script: &str) -> ExternalTool {
        ExternalTool::command("QA", argv(&["sh", "-c", script]))
            .with_timeout(Duration::from_secs(5))
            .with_retries(0)
    }

    /// A stderr reader whose pipe a background process keeps open (here: this test holds the
    /// write end) ends once the call says so, sending what it read; without being told, it
    /// waits. The pipe is then drained by the one drain thread, so that the process can go on
    /// writing (closing it would kill a daemon with SIGPIPE). A call whose daemon keeps stderr
    /// succeeds at once.
    #[cfg(unix)]
    #[test]
    fn a_reader_gives_up_a_pipe_held_open_when_the_call_ends() {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let mut fds = [0; 2];
        // SAFETY: pipe(2) writes two new descriptors into `fds`, each then owned once.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let (read_end, write_end) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let mut writer = std::fs::File::from(write_end);
        writer.write_all(b"warming up").unwrap();
        let stop = SetOnDrop(Default::default());
        let give_up = GiveUp {
            fd: read_end.as_raw_fd(),
            stop: stop.0.clone(),
        };
        let rx = read_pipe(std::fs::File::from(read_end), 64, Some(give_up)).unwrap();
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "still reading"
        );
        drop(stop);
        let (kept, more) = rx.recv_timeout(Duration::from_secs(2)).expect("gave up");
        assert_eq!((kept.as_slice(), more), (&b"warming up"[..], false));
        // The thread has ended: its sender is gone.
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(2)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
        // Four times a pipe's capacity goes through: someone reads, and nobody closed it.
        let (done, wrote) = mpsc::channel();
        thread::spawn(move || {
            let _ = done.send(writer.write_all(&[b'x'; 256 * 1024]).is_ok());
        });
        assert_eq!(wrote.recv_timeout(Duration::from_secs(10)), Ok(true));

        let started = Instant::now();
        let tool = sh("sleep 3 >/dev/null & echo 42");
        assert_eq!(run(&tool, "x").unwrap(), "42");
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn command_succeeds() {
        let tool = sh("tr a-z A-Z");
        assert_eq!(run(&tool, "hello world"), Ok("HELLO WORLD".into()));
        // Input is data, never shell code.
        assert_eq!(
            run(&sh("cat"), "$(echo pwned); `id`"),
            Ok("$(echo pwned); `id`".into())
        );
        let tool = ExternalTool::command("MT", argv(&["cat"]));
        assert_eq!(run(&tool, "  padded \n"), Ok("padded".into()));
    }

    #[test]
    fn failing_command_is_an_error_with_its_stderr() {
        let err = run(
            &ExternalTool::command("QA", argv(&["false"])).with_retries(0),
            "x",
        );
        assert!(matches!(err, Err(ToolError::Failed(_))), "{err:?}");
        let err = run(&sh("echo 'model not loaded' >&2; exit 3"), "x").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("model not loaded") && msg.contains('3'),
            "{msg}"
        );
        let err = run(&sh("true"), "x").unwrap_err();
        assert!(err.to_string().contains("printed nothing"), "{err}");
    }

    #[test]
    fn missing_binary_fails_at_once() {
        let tool = ExternalTool::command("QA", argv(&["/nonexistent/toolsift-qa"])).with_retries(5);
        let start = Instant::now();
        let err = run(&tool, "x").unwrap_err();
        assert!(err.to_string().contains("toolsift-qa"), "{err}");
        assert!(start.elapsed() < Duration::from_millis(200), "not retried");
    }

    #[test]
    fn slow_command_times_out_quickly() {
        let tool = ExternalTool::command("QA", argv(&["sleep", "5"]))
            .with_timeout(Duration::from_millis(200))
            .with_retries(0);
        let start = Instant::now();
        assert_eq!(
            run(&tool, "x"),
            Err(ToolError::Timeout {
                after: Duration::from_millis(200),
                tries: 1
            })
        );
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
        // A grandchild holding stdout open does not hold the call past its timeout.
        let tool = sh("sleep 5 & echo early").with_timeout(Duration::from_millis(300));
        let start = Instant::now();
        assert!(run(&tool, "x").is_err());
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn stdout_held_open_after_exit_is_named_and_not_retried() {
        let tool = sh("sleep 2 & echo hi")
            .with_timeout(Duration::from_millis(500))
            .with_retries(2);
        let start = Instant::now();
        let err = run(&tool, "x").unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ToolError::Failed(_)), "{err:?}");
        assert!(
            msg.contains("exited but its stdout stayed open") && msg.contains("exec"),
            "{msg}"
        );
        assert!(!msg.contains("tries"), "not retried: {msg}");
        assert!(
            start.elapsed() < Duration::from_millis(1500),
            "{:?}",
            start.elapsed()
        );
        // A wrapper that execs its program is fine; a background process that closes its
        // stdout is too.
        assert_eq!(run(&sh("exec echo hi"), "x"), Ok("hi".into()));
        assert_eq!(
            run(&sh("sleep 2 >/dev/null & echo hi"), "x"),
            Ok("hi".into())
        );
    }

    /// Whether `pid` is gone (or a zombie waiting for init) within `wait`.
    #[cfg(target_os = "linux")]
    fn ends_within(pid: &str, wait: Duration) -> bool {
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

    /// A timed-out command and one whose background process holds its stdout take what they
    /// started with them; a background process that let go of stdout is left running.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_failed_call_kills_what_it_left_running() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = |name: &str| dir.path().join(name).display().to_string();
        let read_pid = |path: &str| std::fs::read_to_string(path).unwrap().trim().to_string();
        let (held, slow, detached) = (pid_file("held"), pid_file("slow"), pid_file("detached"));

        let tool = sh(&format!("sleep 30 & echo $! > {held}; echo hi"))
            .with_timeout(Duration::from_millis(400));
        assert!(matches!(run(&tool, "x"), Err(ToolError::Failed(_))));
        assert!(
            ends_within(&read_pid(&held), Duration::from_secs(2)),
            "the stdout holder survived"
        );

        let tool = sh(&format!("sleep 30 >/dev/null & echo $! > {slow}; sleep 30"))
            .with_timeout(Duration::from_millis(400))
            .with_retries(0);
        assert!(matches!(run(&tool, "x"), Err(ToolError::Timeout { .. })));
        assert!(
            ends_within(&read_pid(&slow), Duration::from_secs(2)),
            "the timed-out call's child survived"
        );

        // Every other failure too, and a failure whose background process holds stdout is
        // that, not a retried exit status that waits out the timeout on every try.
        for (name, tail) in [
            ("exit", "echo hi; exit 1"),
            ("empty", "true"),
            ("crash", "kill -9 $$"),
        ] {
            let path = pid_file(name);
            let tool = sh(&format!(
                "sleep 30 >/dev/null 2>&1 & echo $! >> {path}; {tail}"
            ))
            .with_retries(2);
            assert!(
                matches!(run(&tool, "x"), Err(ToolError::Failed(_))),
                "{name}"
            );
            let started = std::fs::read_to_string(&path).unwrap();
            for pid in started.lines() {
                assert!(
                    ends_within(pid, Duration::from_secs(2)),
                    "{name}: {pid} survived"
                );
            }
        }
        let held_exit = pid_file("held-exit");
        let tool = sh(&format!(
            "sleep 30 & echo $! >> {held_exit}; echo partial; exit 1"
        ))
        .with_timeout(Duration::from_millis(400))
        .with_retries(2);
        let msg = run(&tool, "x").unwrap_err().to_string();
        assert!(
            msg.contains("stdout stayed open") && msg.contains("exit status: 1"),
            "{msg}"
        );
        assert!(!msg.contains("tries"), "not retried: {msg}");
        assert!(ends_within(&read_pid(&held_exit), Duration::from_secs(2)));

        let tool = sh(&format!(
            "sleep 30 >/dev/null & echo $! > {detached}; echo hi"
        ));
        assert_eq!(run(&tool, "x"), Ok("hi".into()));
        let pid = read_pid(&detached);
        assert!(
            !ends_within(&pid, Duration::from_millis(200)),
            "a success kills nothing"
        );
        let _ = Command::new("kill").arg(&pid).status();
    }

    /// This test binary running test `name` alone, with `var` set to `value`: the tests of
    /// what happens to tools when the process running them dies or stops run themselves.
    #[cfg(target_os = "linux")]
    fn this_test_as_a_run(name: &str, var: &str, value: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut run = Command::new(std::env::current_exe().unwrap());
        // --nocapture: what the run prints on stderr reaches the test (libtest would hold it).
        run.args([
            "--exact",
            "--nocapture",
            &format!("annotate::tools::external::tests::{name}"),
        ])
        .env(var, value)
        .stdout(Stdio::null());
        run
    }

    /// The pid a tool wrote to `path` (a line), once it has.
    #[cfg(target_os = "linux")]
    fn pid_written_to(path: &std::path::Path) -> String {
        let started = Instant::now();
        loop {
            match std::fs::read_to_string(path) {
                Ok(p) if p.ends_with('\n') => break p.trim().to_string(),
                _ if started.elapsed() > Duration::from_secs(30) => {
                    panic!("no pid in {}", path.display())
                }
                _ => thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// A tool runs in a process group of its own, so no signal to toolsift's group reaches it:
    /// when the run dies (killed here) mid-call, the kernel kills the tool instead of leaving
    /// it running. The test runs itself as the dying run.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_tool_dies_with_the_run() {
        if let Ok(pid_path) = std::env::var("TOOLSIFT_TEST_DYING_RUN") {
            let tool = sh(&format!("echo $$ > {pid_path}; exec sleep 60"))
                .with_timeout(Duration::from_secs(60));
            let _ = run(&tool, "x");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let pid_path = dir.path().join("tool");
        let mut dying = this_test_as_a_run(
            "a_tool_dies_with_the_run",
            "TOOLSIFT_TEST_DYING_RUN",
            &pid_path,
        )
        .spawn()
        .unwrap();
        let pid = pid_written_to(&pid_path);
        dying.kill().unwrap();
        dying.wait().unwrap();
        assert!(
            ends_within(&pid, Duration::from_secs(5)),
            "the tool outlived the run"
        );
    }

    /// A run ended by a signal (SIGTERM here, as `kill` or a scheduler sends; Ctrl-C's SIGINT
    /// is the same path) takes its tools' process groups with it: the tool and what it started
    /// in the background, which the kernel's death signal alone would leave running. The run
    /// ends by the signal itself, and the killed call is not reported. The test runs itself as
    /// the run.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_signal_ends_the_tools_and_what_they_started() {
        use std::os::unix::process::ExitStatusExt;
        if let Ok(dir) = std::env::var("TOOLSIFT_TEST_SIGNALLED_RUN") {
            stop_tools_on_signals().unwrap();
            set_stop_note("rerun to resume");
            let tool = sh(&format!(
                "sleep 60 >/dev/null & echo $! > {dir}/started; echo $$ > {dir}/tool; wait"
            ))
            .with_timeout(Duration::from_secs(60));
            let reported = run(&tool, "x");
            // Not reached: the call is held until the signal ends the process.
            std::fs::write(format!("{dir}/reported"), format!("{reported:?}")).unwrap();
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| dir.path().join(name);
        let signalled = this_test_as_a_run(
            "a_signal_ends_the_tools_and_what_they_started",
            "TOOLSIFT_TEST_SIGNALLED_RUN",
            dir.path(),
        )
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        let (tool, background) = (
            pid_written_to(&path("tool")),
            pid_written_to(&path("started")),
        );
        let pid = libc::pid_t::try_from(signalled.id()).unwrap();
        // SAFETY: kill(2) on the child this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let ended = signalled.wait_with_output().unwrap();
        let status = ended.status;
        assert_eq!(status.signal(), Some(libc::SIGTERM), "{status}");
        let stderr = String::from_utf8_lossy(&ended.stderr);
        assert!(
            stderr.contains("toolsift: stopped by SIGTERM: rerun to resume"),
            "{stderr}"
        );
        for (what, pid) in [("the tool", &tool), ("its background process", &background)] {
            assert!(
                ends_within(pid, Duration::from_secs(5)),
                "{what} outlived the run"
            );
        }
        assert!(!path("reported").exists(), "the killed call was reported");
    }

    /// A signal the run was started ignoring (SIGHUP under `nohup`) is left ignored: the run
    /// goes on. The test runs itself as the run, ignoring SIGHUP as `nohup` would, and sends
    /// itself one.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_signal_ignored_at_start_stays_ignored() {
        if let Some(marker) = std::env::var_os("TOOLSIFT_TEST_NOHUP_RUN") {
            // SAFETY: setting a signal's action to SIG_IGN, as nohup(1) does before exec.
            unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
            stop_tools_on_signals().unwrap();
            // SAFETY: raise(3) of a signal whose action is SIG_IGN (or, with the bug, the
            // handler that ends the process).
            unsafe { libc::raise(libc::SIGHUP) };
            // Time for the signal thread to act, had it been watching SIGHUP.
            thread::sleep(Duration::from_millis(500));
            std::fs::write(marker, "survived").unwrap();
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("survived");
        let status = this_test_as_a_run(
            "a_signal_ignored_at_start_stays_ignored",
            "TOOLSIFT_TEST_NOHUP_RUN",
            &marker,
        )
        .status()
        .unwrap();
        assert!(
            status.success(),
            "the run ended on an ignored SIGHUP: {status}"
        );
        assert!(marker.exists(), "the run did not run this test");
    }

    /// The race a signal leaves is closed: once `stop_command_tools` has killed a call's tool,
    /// the call never reports (a failed call would be recorded, and not called again on
    /// `--resume`). Here the process is not ended after the stop, so a call that reported
    /// would be seen. The test runs itself as the stopped run (the stop is process-wide).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_call_stopped_never_reports() {
        if let Ok(dir) = std::env::var("TOOLSIFT_TEST_STOPPED_RUN") {
            let tool = sh(&format!("echo $$ > {dir}/tool; exec sleep 60"))
                .with_timeout(Duration::from_secs(60))
                .with_retries(0);
            let (tx, rx) = mpsc::channel();
            thread::spawn(move || tx.send(run(&tool, "x")));
            pid_written_to(&std::path::Path::new(&dir).join("tool"));
            stop_command_tools();
            let reported = rx.recv_timeout(Duration::from_secs(1));
            assert!(reported.is_err(), "the stopped call reported {reported:?}");
            std::fs::write(format!("{dir}/held"), "").unwrap();
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let status = this_test_as_a_run(
            "a_call_stopped_never_reports",
            "TOOLSIFT_TEST_STOPPED_RUN",
            dir.path(),
        )
        .status()
        .unwrap();
        assert!(
            status.success() && dir.path().join("held").exists(),
            "{status}"
        );
        let tool = std::fs::read_to_string(dir.path().join("tool")).unwrap();
        assert!(ends_within(tool.trim(), Duration::from_secs(5)));
    }

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
    fn oversized_output_is_refused() {
        let tool = sh("head -c 1100000 /dev/zero | tr '\\0' a");
        let err = run(&tool, "x").unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
        // Whatever the exit status, and not retried.
        let tool = sh("head -c 1100000 /dev/zero | tr '\\0' a; exit 3").with_retries(2);
        let err = run(&tool, "x").unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
        assert!(!err.to_string().contains("tries"), "{err}");
    }

    /// A program that prints without end is stopped once it has printed too much, not at
    /// its timeout, and not retried (it was: as a timeout, `timeout × tries` per call).
    #[test]
    fn endless_output_is_refused_at_once() {
        let tool = ExternalTool::command("QA", argv(&["yes"]))
            .with_timeout(Duration::from_secs(30))
            .with_retries(2);
        let started = Instant::now();
        let err = run(&tool, "x").unwrap_err();
        assert!(err.to_string().contains("printed more than"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(20), "{err}");
    }

    /// Serves each connection with `respond(request_body)` -> (status, JSON body), or never
    /// answers it (None: the connection is held past the client's timeout); counts them.
    fn server(
        respond: impl Fn(&str) -> Option<(u16, String)> + Send + 'static,
    ) -> (String, Arc<AtomicUsize>) {
        serve(move |body| {
            respond(body).map(|(status, json)| reply(status, "application/json", json.as_bytes()))
        })
    }

    /// Answers each connection with the raw bytes `respond(request_body)` (status line,
    /// headers and body), then closes it; counts the connections.
    fn raw_server(
        respond: impl Fn(&str) -> Vec<u8> + Send + 'static,
    ) -> (String, Arc<AtomicUsize>) {
        serve(move |body| Some(respond(body)))
    }

    /// The loop of `server` and `raw_server`: up to 10 connections, each answered with
    /// `respond(request_body)`'s bytes, or held open for 2 s when it gives none.
    fn serve(
        respond: impl Fn(&str) -> Option<Vec<u8>> + Send + 'static,
    ) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/tool", listener.local_addr().unwrap());
        let count = Arc::new(AtomicUsize::new(0));
        let seen = count.clone();
        thread::spawn(move || {
            for stream in listener.incoming().take(10) {
                let Ok(mut stream) = stream else { return };
                seen.fetch_add(1, Ordering::SeqCst);
                let Some(body) = read_request(&stream) else {
                    continue;
                };
                match respond(&body) {
                    Some(bytes) => {
                        let _ = stream.write_all(&bytes);
                    }
                    None => thread::sleep(Duration::from_secs(2)),
                }
            }
        });
        (url, count)
    }

    fn reply(status: u16, content_type: &str, body: &[u8]) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn http_invalid_utf8_is_replaced_whatever_the_content_type() {
        for content_type in ["application/json", "text/plain", "application/octet-stream"] {
            let (url, count) =
                raw_server(move |_| reply(200, content_type, b"{\"result\": \"a\xff b\"}"));
            assert_eq!(
                run(&http_tool(&url, 2), "x"),
                Ok("a\u{FFFD} b".into()),
                "{content_type}"
            );
            assert_eq!(count.load(Ordering::SeqCst), 1, "fetched once");
        }
        // A failed reply with such a body keeps its status.
        let (url, count) =
            raw_server(|_| reply(503, "application/json", b"{\"error\": \"busy \xff\"}"));
        let msg = run(&http_tool(&url, 1), "x").unwrap_err().to_string();
        assert!(
            msg.contains("HTTP 503") && msg.contains("busy \u{FFFD}"),
            "{msg}"
        );
        assert_eq!(count.load(Ordering::SeqCst), 2, "a 503 is retried");
    }

    #[test]
    fn http_status_survives_an_unreadable_body() {
        // The body is cut short: Content-Length promises more than is sent.
        let cut = |status: u16| {
            move |_: &str| {
                format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n\
                     Content-Length: 100\r\nConnection: close\r\n\r\n{{\"err"
                )
                .into_bytes()
            }
        };
        let (url, count) = raw_server(cut(500));
        let msg = run(&http_tool(&url, 1), "x").unwrap_err().to_string();
        assert!(msg.contains("HTTP 500"), "{msg}");
        assert_eq!(count.load(Ordering::SeqCst), 2, "a 500 is retried");
        let (url, count) = raw_server(cut(404));
        let msg = run(&http_tool(&url, 2), "x").unwrap_err().to_string();
        assert!(msg.contains("HTTP 404"), "{msg}");
        assert_eq!(count.load(Ordering::SeqCst), 1, "a 404 is not retried");
        // An oversized failed reply keeps its status too.
        let (url, _) = raw_server(|_| reply(500, "text/plain", &vec![b'a'; MAX_OUTPUT_BYTES + 1]));
        let msg = run(&http_tool(&url, 0), "x").unwrap_err().to_string();
        assert!(
            msg.contains("HTTP 500") && msg.contains("larger than"),
            "{msg}"
        );
        let (url, _) = raw_server(|_| reply(200, "text/plain", &vec![b'a'; MAX_OUTPUT_BYTES + 1]));
        let msg = run(&http_tool(&url, 0), "x").unwrap_err().to_string();
        assert!(msg.contains("larger than"), "{msg}");
    }

    fn read_request(stream: &TcpStream) -> Option<String> {
        let mut reader = BufReader::new(stream);
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).ok()?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().ok()?;
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).ok()?;
        String::from_utf8(body).ok()
    }

    fn http_tool(url: &str, retries: u32) -> ExternalTool {
        ExternalTool::http("MT", url)
            .with_timeout(Duration::from_millis(300))
            .with_retries(retries)
    }

    #[test]
    fn http_success() {
        let (url, count) = server(|body| {
            let req: serde_json::Value = serde_json::from_str(body).ok()?;
            let input = req["input"].as_str()?.to_uppercase();
            let tool = req["tool"].as_str()?;
            Some((
                200,
                serde_json::json!({ "result": format!("{tool}:{input}") }).to_string(),
            ))
        });
        let tool = http_tool(&url, 0);
        assert_eq!(run(&tool, "bonjour"), Ok("MT:BONJOUR".into()));
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn http_500_is_retried_then_fails() {
        let (url, count) = server(|_| Some((500, "{\"error\":\"overloaded\"}".into())));
        let err = run(&http_tool(&url, 2), "x").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("500") && msg.contains("overloaded"), "{msg}");
        assert_eq!(count.load(Ordering::SeqCst), 3);
    }

    /// A redirect is not followed (a 302 would turn the POST into a GET without the input, and
    /// the target's answer would be taken for the tool's): it is an error naming the target,
    /// whatever its body (301: one cut short, which cannot be read).
    #[test]
    fn http_redirects_are_errors_naming_the_target() {
        for (status, length, body) in [(302, 0, ""), (307, 0, ""), (301, 100, "cut short")] {
            let (url, count) = raw_server(move |_| {
                format!(
                    "HTTP/1.1 {status} X\r\nLocation: /elsewhere\r\nContent-Length: {length}\r\n\
                     Connection: close\r\n\r\n{body}"
                )
                .into_bytes()
            });
            let err = run(&http_tool(&url, 2), "x").unwrap_err().to_string();
            assert!(
                err.contains(&format!("HTTP {status} redirects to /elsewhere")),
                "{err}"
            );
            assert_eq!(count.load(Ordering::SeqCst), 1, "not followed, not retried");
        }
    }

    #[test]
    fn http_4xx_and_bad_replies_are_not_retried() {
        let (url, count) = server(|_| Some((400, "bad".into())));
        assert!(matches!(
            run(&http_tool(&url, 2), "x"),
            Err(ToolError::Failed(_))
        ));
        assert_eq!(count.load(Ordering::SeqCst), 1);

        for (reply, needle) in [
            ("not json", "not JSON"),
            ("{\"result\": 3}", "no string"),
            ("{\"result\": \"  \"}", "empty"),
            ("{\"error\": \"no model\"}", "no model"),
        ] {
            let (url, _) = server(move |_| Some((200, reply.to_string())));
            let err = run(&http_tool(&url, 2), "x").unwrap_err();
            assert!(err.to_string().contains(needle), "{reply}: {err}");
        }
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

    #[test]
    fn http_that_never_answers_times_out() {
        let (url, _) = server(|_| None);
        let start = Instant::now();
        let got = run(&http_tool(&url, 0), "x");
        assert_eq!(
            got,
            Err(ToolError::Timeout {
                after: Duration::from_millis(300),
                tries: 1
            })
        );
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn http_connection_refused_fails() {
        // Bind then drop to get a port with (very likely) nothing listening.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let got = run(&http_tool(&format!("http://127.0.0.1:{port}/x"), 1), "x");
        assert!(
            matches!(
                got,
                Err(ToolError::Failed(_)) | Err(ToolError::Timeout { .. })
            ),
            "{got:?}"
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

    /// A command whose program cannot be started is an error naming the tool and the program,
    /// as `execvp` would look it up: a path is checked as given, a name in `PATH`. Only for the
    /// tools a run will call (`check_tools`): settings that name a program this machine lacks
    /// still load.
    #[cfg(unix)]
    #[test]
    fn a_program_that_cannot_run_is_an_error_before_the_run() {
        use crate::annotate::tools::{ToolKind, ToolName, ToolRegistry, ToolsConfig};
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("qa.sh");
        std::fs::write(&script, "#!/bin/sh\ncat\n").unwrap();
        let not_executable = dir.path().join("notes.txt");
        std::fs::write(&not_executable, "").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let registry = |program: &str| {
            let settings = ToolsConfig {
                qa: Some(ExternalToolConfig {
                    command: Some(argv(&[program, "--flag"])),
                    ..Default::default()
                }),
                ..Default::default()
            };
            settings.check().unwrap();
            ToolRegistry::from_config(&settings).unwrap()
        };
        let qa = [ToolName::Builtin(ToolKind::Qa)];
        let calculator = [ToolName::Builtin(ToolKind::Calculator)];
        for program in ["sh", "/bin/sh", script.to_str().unwrap()] {
            crate::annotate::check_tools(&registry(program), &qa).unwrap();
        }
        let missing = dir.path().join("missing");
        let folder = dir.path().to_str().unwrap().to_owned();
        for (program, why) in [
            (
                "toolsift-no-such-program",
                "no executable file of that name in PATH",
            ),
            (missing.to_str().unwrap(), "No such file or directory"),
            (not_executable.to_str().unwrap(), "it is not executable"),
            (folder.as_str(), "it is not a file"),
        ] {
            let registry = registry(program);
            crate::annotate::check_tools(&registry, &calculator).unwrap();
            let err = crate::annotate::check_tools(&registry, &qa)
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("tool QA: command's program")
                    && err.contains(program)
                    && err.contains(why),
                "{err}"
            );
        }
    }
}
