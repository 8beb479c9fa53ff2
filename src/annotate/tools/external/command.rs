//! One call of a command tool: the program spawned in a process group of its own, the input
//! written to its stdin, stdout and stderr read on threads of their own, a deadline, and what
//! each way of ending means (retried or not).

use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::stop::{hold_if_stopping, kill_group, own_group, Running, STOPPING};
use super::{final_err, retry_err, shorten, timeout_err, Attempt, MAX_OUTPUT_BYTES};

/// Most stderr bytes kept for an error message.
const STDERR_KEEP: usize = 4096;

/// How long stdout may stay open after the program exited when its timeout is (almost) spent.
const EXIT_GRACE: Duration = Duration::from_millis(100);

/// Why `program` cannot be started as `Command::new(program)` would start it, if it cannot: a
/// path (with a slash) must be a file this user may execute, a name that of such a file in `PATH`
/// (unset: execvp's default, /bin:/usr/bin). For a run about to start (it reads the disk;
/// `Tool::check_ready`), so that a typo is one error naming the tool, not a failure of every
/// call in a run that then finishes. Elsewhere than Unix the lookup has other rules
/// (extensions), and nothing is checked.
#[cfg(unix)]
pub(super) fn check_program(program: &str) -> Result<(), String> {
    use std::path::Path;
    let runnable =
        |path: &Path| std::fs::metadata(path).is_ok_and(|m| m.is_file()) && may_execute(path);
    let path = Path::new(program);
    if program.contains('/') {
        return match std::fs::metadata(path) {
            Ok(m) if !m.is_file() => Err("it is not a file".into()),
            Ok(_) if !may_execute(path) => Err("it is not executable by this user".into()),
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        };
    }
    let search = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    let found = std::env::split_paths(&search).any(|dir| runnable(&dir.join(path)));
    if found {
        Ok(())
    } else {
        Err("no executable file of that name in PATH".into())
    }
}

/// Whether this process may execute `path`, as execve decides it: the owner's, the group's or
/// the others' execute bit by who the process is (effective ids; root: any execute bit), which
/// the mode bits alone cannot say.
#[cfg(unix)]
fn may_execute(path: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c_path` is a valid NUL-terminated string that outlives the call.
    unsafe {
        libc::faccessat(
            libc::AT_FDCWD,
            c_path.as_ptr(),
            libc::X_OK,
            libc::AT_EACCESS,
        ) == 0
    }
}

#[cfg(not(unix))]
pub(super) fn check_program(_program: &str) -> Result<(), String> {
    Ok(())
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

pub(super) fn run_command(
    argv: &[String],
    input: &str,
    timeout: Duration,
) -> Result<String, Attempt> {
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
    let mut pause = FIRST_POLL;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline || stop() {
            return Ok(None);
        }
        thread::sleep(pause.min(deadline - now));
        pause = next_poll(pause);
    }
}

/// `wait_until` polls quickly at first (most services answer in milliseconds), then every
/// [`LONGEST_POLL`]: a call ends at most that long after its program does.
const FIRST_POLL: Duration = Duration::from_millis(1);
const LONGEST_POLL: Duration = Duration::from_millis(20);

/// The pause after `pause`: twice as long, up to [`LONGEST_POLL`].
fn next_poll(pause: Duration) -> Duration {
    (pause * 2).min(LONGEST_POLL)
}

#[cfg(test)]
mod tests {
    use super::super::testing::{argv, ends_within, run, sh};
    use super::super::{ExternalTool, ExternalToolConfig, ToolError};
    use super::*;

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
            (
                not_executable.to_str().unwrap(),
                "it is not executable by this user",
            ),
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

    /// The check says what starting the program says, whoever runs the tests: an execute bit
    /// for another class of user than this process's does not make a file runnable (except
    /// for root, which any execute bit lets run).
    #[test]
    fn the_check_agrees_with_starting_the_program_for_each_execute_bit() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o001, 0o010, 0o100, 0o644, 0o755] {
            let script = dir.path().join(format!("tool-{mode:o}.sh"));
            std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(mode)).unwrap();
            let checked = check_program(script.to_str().unwrap());
            // A file just written may be busy (ETXTBSY) while a child another test forked
            // holds it open: try again.
            let started = (0..50)
                .map(|_| Command::new(&script).status())
                .find(|r| !matches!(r, Err(e) if e.raw_os_error() == Some(libc::ETXTBSY)))
                .unwrap();
            assert_eq!(
                checked.is_ok(),
                started.is_ok(),
                "mode {mode:o}: {checked:?}"
            );
        }
    }

    /// A background process that holds stdout a little after the program exited is waited
    /// for, up to the timeout: the call succeeds once it lets go.
    #[test]
    fn stdout_held_briefly_after_exit_is_waited_for() {
        let tool = sh("sleep 0.3 & echo hi").with_timeout(Duration::from_secs(3));
        assert_eq!(run(&tool, "x"), Ok("hi".into()));
    }

    /// A failed call's error keeps its stderr even when a background process still holds the
    /// pipe (the reader is told the call ended, instead of waiting for the end of the pipe).
    #[test]
    fn a_failure_keeps_its_stderr_when_a_background_process_holds_it() {
        let tool = sh("sleep 5 >/dev/null & echo 'model not loaded' >&2; exit 3");
        let msg = run(&tool, "x").unwrap_err().to_string();
        assert!(msg.contains("model not loaded"), "{msg}");
    }

    /// A timed-out tool's group is killed with SIGKILL: what it started dies even when it
    /// ignores SIGTERM.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_timeout_kills_a_group_that_ignores_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let pid_path = dir.path().join("bg");
        let tool = sh(&format!(
            "trap '' TERM; sleep 30 >/dev/null & echo $! > {}; sleep 30",
            pid_path.display()
        ))
        // Long enough for a loaded machine to start the script and write the pid.
        .with_timeout(Duration::from_secs(1));
        assert!(matches!(run(&tool, "x"), Err(ToolError::Timeout { .. })));
        let pid = std::fs::read_to_string(&pid_path)
            .unwrap()
            .trim()
            .to_string();
        let ended = ends_within(&pid, Duration::from_secs(2));
        if !ended {
            let _ = Command::new("kill").args(["-9", &pid]).status();
        }
        assert!(ended, "a process ignoring SIGTERM survived the timeout");
    }

    /// The check looks a program up as execvp would, in a run whose working directory and
    /// `PATH` this test chooses (it runs itself with them): a relative path with a slash is
    /// checked from the working directory, not looked up in `PATH`; a name is looked for in
    /// every `PATH` directory in turn, and only an executable file counts (not a folder, not a
    /// file without an execute bit); with `PATH` unset, /bin and /usr/bin are searched.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_program_check_looks_a_program_up_as_execvp_does() {
        use std::os::unix::fs::PermissionsExt;
        match std::env::var("TOOLSIFT_TEST_LOOKUP_RUN").as_deref() {
            Ok("with-path") => {
                assert_eq!(check_program("sub/qa.sh"), Ok(()));
                assert_eq!(check_program("second-tool"), Ok(()));
                for not_runnable in ["a-folder", "notes", "qa.sh"] {
                    assert!(check_program(not_runnable).is_err(), "{not_runnable}");
                }
                return;
            }
            Ok(_) => {
                assert_eq!(check_program("sh"), Ok(()));
                return;
            }
            Err(_) => {}
        }
        let dir = tempfile::tempdir().unwrap();
        let script = |path: &std::path::Path, mode: u32| {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "#!/bin/sh\nexit 0\n").unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        script(&dir.path().join("sub/qa.sh"), 0o755);
        script(&dir.path().join("second/second-tool"), 0o755);
        script(&dir.path().join("second/notes"), 0o644);
        std::fs::create_dir_all(dir.path().join("second/a-folder")).unwrap();
        std::fs::create_dir_all(dir.path().join("first")).unwrap();
        let path = std::env::join_paths([dir.path().join("first"), dir.path().join("second")]);
        for with_path in [true, false] {
            let mut lookup = Command::new(std::env::current_exe().unwrap());
            lookup
                .args([
                    "--exact",
                    "annotate::tools::external::command::tests::\
                     the_program_check_looks_a_program_up_as_execvp_does",
                ])
                .current_dir(dir.path());
            if with_path {
                lookup
                    .env("TOOLSIFT_TEST_LOOKUP_RUN", "with-path")
                    .env("PATH", path.as_ref().unwrap());
            } else {
                lookup
                    .env("TOOLSIFT_TEST_LOOKUP_RUN", "no-path")
                    .env_remove("PATH");
            }
            let ran = lookup.output().unwrap();
            let stdout = String::from_utf8_lossy(&ran.stdout);
            assert!(
                ran.status.success() && stdout.contains("1 passed"),
                "PATH set: {with_path}: {stdout}"
            );
        }
    }

    /// A timed-out program is killed and reaped: no zombie is left for each timed-out call.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_timed_out_program_is_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let pid_path = dir.path().join("tool");
        let tool = sh(&format!("echo $$ > {}; exec sleep 30", pid_path.display()))
            .with_timeout(Duration::from_secs(1));
        assert!(matches!(run(&tool, "x"), Err(ToolError::Timeout { .. })));
        let pid = std::fs::read_to_string(&pid_path).unwrap();
        let proc_entry = format!("/proc/{}", pid.trim());
        let started = Instant::now();
        while std::path::Path::new(&proc_entry).exists() {
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{proc_entry} is still there: not reaped"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The wait's pauses double from 1 ms and stop at 20 ms: a program that ends after a
    /// second is seen to within 20 ms of it, not after up to as long again.
    #[test]
    fn the_waits_pauses_double_up_to_20_ms() {
        let pauses: Vec<u64> = std::iter::successors(Some(FIRST_POLL), |&p| Some(next_poll(p)))
            .take(8)
            .map(|p| p.as_millis() as u64)
            .collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 20, 20, 20]);
    }

    /// A failed call's error is the program, its exit status and its stderr, trimmed and cut
    /// at 300 characters (of the 4096 bytes kept).
    #[test]
    fn a_failures_message_is_the_program_its_status_and_300_characters_of_stderr() {
        let long: String = (0..400u32)
            .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
            .collect();
        let msg = run(&sh(&format!("printf '%s' '{long}' >&2; exit 4")), "x")
            .unwrap_err()
            .to_string();
        assert_eq!(msg, format!("\"sh\" exit status: 4: {}…", &long[..300]));
        let msg = run(
            &sh("printf '\\n  model not loaded \\n\\n' >&2; exit 5"),
            "x",
        )
        .unwrap_err()
        .to_string();
        assert_eq!(msg, "\"sh\" exit status: 5: model not loaded");
    }

    /// One byte over `MAX_OUTPUT_BYTES` is too much (tests/tools.rs: exactly that is not).
    #[test]
    fn output_one_byte_over_the_limit_is_refused() {
        let tool = sh(&format!(
            "head -c {} /dev/zero | tr '\\0' a",
            MAX_OUTPUT_BYTES + 1
        ));
        let err = run(&tool, "x").unwrap_err();
        assert!(err.to_string().contains("printed more than"), "{err}");
    }

    /// A timeout too large to add to the clock (the field is public) is no practical limit,
    /// not one already passed.
    #[test]
    fn a_timeout_too_large_to_add_is_no_limit() {
        let tool = sh("echo hi").with_timeout(Duration::MAX);
        assert_eq!(run(&tool, "x"), Ok("hi".into()));
    }

    /// A program that printed nothing fails at once: another try would print nothing again.
    #[test]
    fn an_empty_output_is_not_retried() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("tries");
        let tool = sh(&format!("echo x >> '{}'", log.display())).with_retries(2);
        let msg = run(&tool, "x").unwrap_err().to_string();
        assert_eq!(msg, "\"sh\" printed nothing");
        let tries = std::fs::read_to_string(&log).unwrap().lines().count();
        assert_eq!(tries, 1);
    }
}
