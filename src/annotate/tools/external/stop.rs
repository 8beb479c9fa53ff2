//! The process groups command tools run in, and their end: with the run (Linux), after a
//! failed call, and on a signal that ends the process, which also holds every call still
//! running so that none reports a failure its tool's killing caused.

use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::thread;
#[cfg(unix)]
use std::{io::Write, sync::mpsc, time::Duration};

/// Starts the command in a process group of its own (whose id is the child's pid), so that
/// `kill_group` reaches what it leaves behind and nothing else. Out of toolsift's group, it
/// would not die with a run that is killed or interrupted (Ctrl-C signals the terminal's
/// group): on Linux the kernel kills it when the thread that started it ends (the call runs on
/// that thread until the program exits, so only a dead run ends it early).
pub(super) fn own_group(command: &mut Command) -> &mut Command {
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
pub(super) static STOPPING: AtomicBool = AtomicBool::new(false);

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
pub(super) fn hold_if_stopping() {
    while STOPPING.load(Ordering::SeqCst) {
        thread::park();
    }
}

/// Lists a started tool's group in [`RUNNING`] while the call runs.
pub(super) struct Running(u32);

impl Running {
    pub(super) fn start(child: &Child) -> Self {
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
pub(super) fn kill_group(child: &Child) {
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

#[cfg(test)]
mod tests {
    use super::super::testing::{ends_within, run, sh};
    use super::*;
    use std::process::Stdio;
    use std::time::Instant;

    /// This test binary running test `name` alone, with `var` set to `value`: the tests of
    /// what happens to tools when the process running them dies or stops run themselves.
    #[cfg(target_os = "linux")]
    fn this_test_as_a_run(name: &str, var: &str, value: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut run = Command::new(std::env::current_exe().unwrap());
        // --nocapture: what the run prints on stderr reaches the test (libtest would hold it).
        run.args([
            "--exact",
            "--nocapture",
            &format!("annotate::tools::external::stop::tests::{name}"),
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
        if let Ok(dir) = std::env::var("TOOLSIFT_TEST_SIGNALLED_RUN") {
            // SAFETY: setting SIGINT's and SIGHUP's action to the default before any handler is
            // installed: a test run started in the background ignores SIGINT, one under nohup
            // SIGHUP, and so would this run.
            unsafe {
                libc::signal(libc::SIGINT, libc::SIG_DFL);
                libc::signal(libc::SIGHUP, libc::SIG_DFL);
            }
            stop_tools_on_signals().unwrap();
            // A later note replaces an earlier one; without any the run ends silently.
            if std::env::var_os("TOOLSIFT_TEST_NO_STOP_NOTE").is_none() {
                set_stop_note("an earlier note");
                set_stop_note("rerun to resume");
            }
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
        let stderr = signal_a_run_in_a_call(dir.path(), libc::SIGTERM, true);
        assert!(
            stderr.contains("toolsift: stopped by SIGTERM: rerun to resume"),
            "{stderr}"
        );
        let reported = dir.path().join("reported");
        assert!(!reported.exists(), "the killed call was reported");
    }

    /// Starts `a_signal_ends_the_tools_and_what_they_started`'s run (a tool call held by a tool
    /// that started a background process), sends it `signal` once both pids are written in
    /// `dir`, checks that the run ended by that signal and took the tool and the background
    /// process with it, and returns the run's stderr. Without `with_note`, the run sets no stop
    /// note.
    #[cfg(target_os = "linux")]
    fn signal_a_run_in_a_call(
        dir: &std::path::Path,
        signal: libc::c_int,
        with_note: bool,
    ) -> String {
        use std::os::unix::process::ExitStatusExt;
        let mut run = this_test_as_a_run(
            "a_signal_ends_the_tools_and_what_they_started",
            "TOOLSIFT_TEST_SIGNALLED_RUN",
            dir,
        );
        if !with_note {
            run.env("TOOLSIFT_TEST_NO_STOP_NOTE", "1");
        }
        let signalled = run.stderr(Stdio::piped()).spawn().unwrap();
        let tool = pid_written_to(&dir.join("tool"));
        let background = pid_written_to(&dir.join("started"));
        let pid = libc::pid_t::try_from(signalled.id()).unwrap();
        // SAFETY: kill(2) on the child this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
        let ended = signalled.wait_with_output().unwrap();
        assert_eq!(ended.status.signal(), Some(signal), "{}", ended.status);
        for (what, pid) in [("the tool", &tool), ("its background process", &background)] {
            assert!(
                ends_within(pid, Duration::from_secs(5)),
                "{what} outlived the run"
            );
        }
        String::from_utf8_lossy(&ended.stderr).into_owned()
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

    /// A call ended is no longer listed: a later stop must not signal its pid, which the
    /// system may have given to another process since.
    #[test]
    fn a_call_ended_is_no_longer_listed() {
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        let running = Running::start(&child);
        assert!(RUNNING.lock().unwrap().contains(&pid));
        drop(running);
        assert!(!RUNNING.lock().unwrap().contains(&pid));
        child.wait().unwrap();
    }

    /// Ctrl-C's SIGINT is named as such in the note (the run otherwise as with SIGTERM).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_sigint_is_named_in_the_stop_note() {
        let dir = tempfile::tempdir().unwrap();
        let stderr = signal_a_run_in_a_call(dir.path(), libc::SIGINT, true);
        assert!(
            stderr.contains("toolsift: stopped by SIGINT: rerun to resume"),
            "{stderr}"
        );
    }

    /// A hang-up (SIGHUP: the terminal closed, or a scheduler's stop) is watched as well, and
    /// named as such in the note, which starts on a line of its own (a progress bar may hold
    /// the cursor).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_sighup_is_named_in_the_stop_note_on_a_line_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let stderr = signal_a_run_in_a_call(dir.path(), libc::SIGHUP, true);
        assert!(
            stderr.contains("\ntoolsift: stopped by SIGHUP: rerun to resume\n"),
            "{stderr:?}"
        );
    }

    /// Without a note the run ends on the signal silently, as its default action does, its
    /// tools still stopped.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_run_without_a_stop_note_ends_silently() {
        let dir = tempfile::tempdir().unwrap();
        let stderr = signal_a_run_in_a_call(dir.path(), libc::SIGTERM, false);
        assert!(!stderr.contains("stopped by"), "{stderr:?}");
    }

    /// A stop kills the group of every call running, not only the first listed. The test runs
    /// itself as the stopped run, and checks there, before that process ends (its end would
    /// take the tools with it anyway).
    #[cfg(target_os = "linux")]
    #[test]
    fn a_stop_kills_every_call_running() {
        if let Ok(dir) = std::env::var("TOOLSIFT_TEST_STOPPED_TWO_RUN") {
            let (tx, rx) = mpsc::channel();
            for name in ["first", "second", "third"] {
                let tool = sh(&format!("echo $$ > {dir}/{name}; exec sleep 60"))
                    .with_timeout(Duration::from_secs(60));
                let tx = tx.clone();
                thread::spawn(move || tx.send(run(&tool, "x")));
            }
            let dir = std::path::Path::new(&dir);
            let pids = ["first", "second", "third"].map(|name| pid_written_to(&dir.join(name)));
            stop_command_tools();
            for pid in &pids {
                assert!(
                    ends_within(pid, Duration::from_secs(5)),
                    "{pid} outlived the stop"
                );
            }
            let reported = rx.recv_timeout(Duration::from_millis(500));
            assert!(reported.is_err(), "a stopped call reported {reported:?}");
            std::fs::write(dir.join("checked"), "").unwrap();
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let status = this_test_as_a_run(
            "a_stop_kills_every_call_running",
            "TOOLSIFT_TEST_STOPPED_TWO_RUN",
            dir.path(),
        )
        .status()
        .unwrap();
        assert!(
            status.success() && dir.path().join("checked").exists(),
            "{status}"
        );
    }

    /// A call that starts its tool after the stop (the stop killed the groups listed then)
    /// kills it at once and is held, not left running until the tool's own end.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_call_started_after_the_stop_is_killed_at_once() {
        if let Ok(dir) = std::env::var("TOOLSIFT_TEST_LATE_CALL_RUN") {
            stop_command_tools();
            let tool = sh(&format!("sleep 1; touch {dir}/alive; exec sleep 60"))
                .with_timeout(Duration::from_secs(60));
            let (tx, rx) = mpsc::channel();
            thread::spawn(move || tx.send(run(&tool, "x")));
            let reported = rx.recv_timeout(Duration::from_secs(3));
            assert!(reported.is_err(), "the call reported {reported:?}");
            let alive = std::path::Path::new(&dir).join("alive");
            assert!(!alive.exists(), "the tool started after the stop ran on");
            std::fs::write(format!("{dir}/held"), "").unwrap();
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let status = this_test_as_a_run(
            "a_call_started_after_the_stop_is_killed_at_once",
            "TOOLSIFT_TEST_LATE_CALL_RUN",
            dir.path(),
        )
        .status()
        .unwrap();
        assert!(
            status.success() && dir.path().join("held").exists(),
            "{status}"
        );
    }
}
