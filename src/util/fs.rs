//! File-system helpers of the commands that write outputs: all-or-nothing files
//! (`AtomicFile`: a locked temporary sibling, fsync'ed and renamed into place), the checks an
//! output path gets before a run starts, and path spelling; and `read_at_most` and
//! `read_small_file`, for the small files a loader reads whole.

#[cfg(feature = "annotate")]
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// `name` less its extension when that is exactly `ext` ("cstar.jsonl", "jsonl" -> "cstar").
#[cfg(feature = "annotate")]
pub(crate) fn strip_ext<'a>(name: &'a OsStr, ext: &str) -> Option<&'a OsStr> {
    let p = Path::new(name);
    if p.extension()? == ext {
        p.file_stem()
    } else {
        None
    }
}

/// `base` followed by `suffix`.
#[cfg(feature = "annotate")]
pub(crate) fn with_suffix(base: &OsStr, suffix: &str) -> OsString {
    let mut s = base.to_owned();
    s.push(suffix);
    s
}

/// Whether the folder `dir` does not exist or holds nothing: where a command may write a fresh
/// output (`toolsift index`, `train-demo`).
#[cfg(feature = "annotate")]
pub(crate) fn missing_or_empty(dir: &Path) -> std::io::Result<bool> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(e),
    }
}

/// The whole of a file of at most `max` bytes, or `Ok(None)` when it holds more: refused by its
/// size before a byte is read, and (a file growing as it is read) after at most `max + 1`.
pub fn read_at_most(path: &Path, max: u64) -> std::io::Result<Option<Vec<u8>>> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    if len > max {
        return Ok(None);
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    Ok((bytes.len() as u64 <= max).then_some(bytes))
}

/// A file that is read whole and is a few KB to a few MB when it is what its name says (a
/// checkpoint folder's JSON files, a settings file, a run's summary), or refused unread when it
/// is over `max` bytes: its parser holds tens of bytes per byte of it, so a large file under
/// one of these names (a weights file copied over it, say) would exhaust memory before it is
/// found not to be one. `err` makes the file's own error from a message.
pub(crate) fn read_small_file(
    path: &Path,
    max: u64,
    err: impl Fn(String) -> Error,
) -> Result<Vec<u8>> {
    match read_at_most(path, max) {
        Ok(Some(bytes)) => Ok(bytes),
        Ok(None) => Err(err(format!(
            "is larger than {} MiB, more than such a file needs (is it the right file?)",
            max >> 20
        ))),
        Err(e) => Err(Error::io(path, e)),
    }
}

/// [`read_small_file`] as UTF-8 text.
pub(crate) fn read_small_text(
    path: &Path,
    max: u64,
    err: impl Fn(String) -> Error,
) -> Result<String> {
    let bytes = read_small_file(path, max, &err)?;
    String::from_utf8(bytes).map_err(|e| err(format!("is not UTF-8 text: {e}")))
}

/// Why `out` cannot name a file this run creates or replaces, if it cannot: a folder, a path
/// whose last part is a folder's by its spelling ("x/", "x/.", ".."; the folder need not exist
/// yet), or something there that is neither a regular file nor a link (a device such as
/// /dev/null, a pipe), which the final rename would replace.
pub fn output_file_problem(out: &Path) -> Option<&'static str> {
    if let Some(problem) = folder_problem(out) {
        return Some(problem);
    }
    // Not following a link: the rename replaces the link itself.
    match std::fs::symlink_metadata(out) {
        Ok(m) if !m.is_file() && !m.is_symlink() => Some("is not a regular file"),
        _ => None,
    }
}

/// Why `path` cannot name an output file by being a folder: it is one, or it is spelled as one
/// ("x/", "x/.", "..", ""), existing or not.
pub fn folder_problem(path: &Path) -> Option<&'static str> {
    let bytes = path.as_os_str().as_encoded_bytes();
    let last = bytes
        .rsplit(|&b| std::path::is_separator(b as char))
        .next()
        .unwrap_or_default();
    if path.is_dir() {
        Some("is a folder")
    } else if matches!(last, b"" | b"." | b"..") {
        Some("names a folder (ends in \"/\", \".\" or \"..\")")
    } else {
        None
    }
}

/// Removes `path` if it is there; a missing file is not an error.
pub(crate) fn remove_if_exists(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(path, e)),
        _ => Ok(()),
    }
}

/// Whether `a` and `b` are one existing file, however spelled (`..`, symlinks, hard links):
/// what a command checks before writing `b` while it reads `a`.
pub fn is_same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
    }
}

/// How long a lock held elsewhere is waited for before it counts as another writer's. A lock
/// this process has just released can look held for a moment: a child being started (a tool's
/// command, from any thread) holds a copy of every descriptor from its fork to its exec, and
/// with it the lock. Another run holds its lock for the whole run, so waiting only delays the
/// error.
const LOCK_PATIENCE: Duration = Duration::from_secs(1);

/// Takes `file`'s exclusive advisory lock, waiting up to `LOCK_PATIENCE` for a holder to let go:
/// true when taken, false when it is still held, an error when the file system has no locks.
pub(crate) fn lock_patiently(file: &File) -> std::io::Result<bool> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(true),
            Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < LOCK_PATIENCE => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            Err(std::fs::TryLockError::WouldBlock) => return Ok(false),
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// Takes `file`'s exclusive advisory lock (`lock_patiently`), then checks that
/// `file` is still the one at `path`: between the open and the lock, another process may have
/// renamed or removed it. `busy` and `moved` say what to report in either case. A file system
/// without locks gets a warning, and the caller goes on as before locking existed.
pub(crate) fn lock_in_place(
    file: &File,
    path: &Path,
    busy: impl FnOnce() -> String,
    moved: impl FnOnce() -> String,
) -> Result<()> {
    match lock_patiently(file) {
        Ok(true) => {}
        Ok(false) => return Err(Error::input(busy())),
        Err(e) => tracing::warn!(
            "{}: cannot lock it ({e}); make sure no other toolsift process writes it",
            path.display()
        ),
    }
    if same_file(file, path) {
        Ok(())
    } else {
        Err(Error::input(moved()))
    }
}

/// Whether `file` (open) is the file now at `path`.
pub(crate) fn same_file(file: &File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (file.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        path.exists()
    }
}

/// Writes a file atomically: `write` fills a temporary sibling, which is fsync'ed and renamed.
pub fn write_atomic(path: &Path, write: impl FnOnce(&mut dyn Write) -> Result<()>) -> Result<()> {
    let mut file = AtomicFile::create(path)?;
    write(&mut file)?;
    file.commit()
}

/// A file written under a temporary sibling name (`<path>.tmp`) and renamed into place by
/// `commit`; dropped uncommitted, the temporary file is removed and `path` is untouched.
///
/// The temporary file is locked (an exclusive advisory lock) from its creation until it has
/// been renamed, so two writers of one path (two `merge` runs into one `--out`, say) cannot
/// write into the same temporary file: the second fails within a second (`LOCK_PATIENCE`) with
/// a clear error.
pub struct AtomicFile {
    path: PathBuf,
    tmp: PathBuf,
    writer: Option<BufWriter<File>>,
}

impl AtomicFile {
    /// The temporary sibling `path` is written under: `<path>.tmp`.
    pub fn tmp_path(path: &Path) -> PathBuf {
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        PathBuf::from(tmp)
    }

    /// Opens and locks `<path>.tmp`, emptied once the lock is held (never through a symbolic
    /// link on unix); `path` itself is not touched until `commit`. Fails, naming the temporary
    /// file, when another process holds its lock or renamed it into place meanwhile.
    pub fn create(path: &Path) -> Result<Self> {
        let tmp = Self::tmp_path(path);
        let io = |e| Error::io(&tmp, e);
        // Not truncated before it is locked: the file may be another writer's, in progress. On
        // unix not through a link either: truncating would empty the file it points to.
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(false);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::custom_flags(&mut options, libc::O_NOFOLLOW);
        // Twice at most: a writer that failed or was dropped while this one waited for its lock
        // removed the file it held (not renamed into place), and the name is free again.
        let mut tries = 2;
        let file = loop {
            let file = options.open(&tmp).map_err(io)?;
            let locked = lock_in_place(
                &file,
                &tmp,
                || {
                    format!(
                        "{}: another toolsift process is writing {} (its temporary file is \
                         locked); wait for it to finish or stop it, then rerun",
                        tmp.display(),
                        path.display()
                    )
                },
                // Renamed into place by another writer: truncating it would empty that output.
                || {
                    format!(
                        "{}: another toolsift process wrote it while this one started; rerun to \
                         see its result",
                        path.display()
                    )
                },
            );
            tries -= 1;
            match locked {
                Ok(()) => break file,
                Err(_) if tries > 0 && !same_file(&file, &tmp) && !same_file(&file, path) => {}
                Err(e) => return Err(e),
            }
        };
        file.set_len(0).map_err(io)?;
        Ok(AtomicFile {
            path: path.to_owned(),
            tmp,
            writer: Some(BufWriter::new(file)),
        })
    }

    /// Flushes, fsyncs and renames the file into place (and fsyncs its folder). On a failure
    /// before the rename the temporary file is removed and `path` is untouched; a failure of the
    /// folder's fsync, after it, is reported with the new file in place (not known durable).
    pub fn commit(mut self) -> Result<()> {
        let Some(w) = self.writer.take() else {
            return Ok(());
        };
        let tmp = &self.tmp;
        // On each failure before the rename, the temporary file is removed while this writer
        // still holds it open and locked (see `Drop`); after the rename the name is no longer
        // this writer's, and nothing is removed.
        let file = match w.into_inner() {
            Ok(file) => file,
            Err(e) => {
                let (e, w) = e.into_parts();
                let _ = std::fs::remove_file(tmp);
                drop(w);
                return Err(Error::io(tmp, e));
            }
        };
        let renamed = file
            .sync_all()
            .map_err(|e| Error::io(tmp, e))
            .and_then(|()| std::fs::rename(tmp, &self.path).map_err(|e| Error::io(&self.path, e)));
        if let Err(e) = renamed {
            let _ = std::fs::remove_file(tmp);
            drop(file);
            return Err(e);
        }
        // Unlocked only once renamed (see `AtomicFile`).
        drop(file);
        sync_dir(&self.path)
    }
}

/// Makes the renames and removals of `path`'s folder durable (fsync of the folder), so that a
/// power loss cannot undo them after the caller has gone on (removed the journal, say). A
/// file system that cannot sync a folder, or a folder this user may write but not read (mode
/// 300: it cannot be opened to sync), is let be, with a warning for the latter; any other
/// failure is an error.
pub(crate) fn sync_dir(path: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        tolerate_unsyncable(dir, File::open(dir).and_then(|d| d.sync_all()))?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// `sync_dir`'s verdict on syncing `dir`: a folder that cannot be opened to sync (mode 300) is a
/// warning, a file system that cannot sync a folder is let be, anything else is an error.
#[cfg(unix)]
fn tolerate_unsyncable(dir: &Path, synced: std::io::Result<()>) -> Result<()> {
    match synced {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            tracing::warn!(
                "{}: cannot open the folder to make its renames durable ({e}); going on",
                dir.display()
            );
        }
        Err(e)
            if !matches!(
                e.kind(),
                std::io::ErrorKind::Unsupported | std::io::ErrorKind::InvalidInput
            ) =>
        {
            return Err(Error::io(dir, e));
        }
        _ => {}
    }
    Ok(())
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match &mut self.writer {
            Some(w) => w.write(buf),
            None => Err(std::io::Error::other("written after commit")),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.writer {
            Some(w) => w.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if let Some(w) = self.writer.take() {
            // Removed before the file is closed: closing releases the lock, and a writer
            // waiting for it would then take over a file that this removal unlinks, while a
            // third creates and locks a new one under the same name.
            let _ = std::fs::remove_file(&self.tmp);
            drop(w);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn read_at_most_refuses_what_is_past_its_limit() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"12345").unwrap();
        assert_eq!(
            super::read_at_most(&p, 5).unwrap().as_deref(),
            Some(&b"12345"[..])
        );
        assert_eq!(super::read_at_most(&p, 4).unwrap(), None);
        assert!(super::read_at_most(&dir.path().join("none"), 4).is_err());
    }

    use super::*;

    #[test]
    fn atomic_file_is_all_or_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.jsonl");
        std::fs::write(&p, "old\n").unwrap();
        let mut f = AtomicFile::create(&p).unwrap();
        writeln!(f, "new").unwrap();
        drop(f);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "old\n");
        assert!(!dir.path().join("out.jsonl.tmp").exists());
        let mut f = AtomicFile::create(&p).unwrap();
        writeln!(f, "new").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new\n");
    }

    /// A folder this user may write but not read (mode 300) cannot be opened to sync its
    /// renames: the commit is not an error for that, with its file in place.
    #[cfg(unix)]
    #[test]
    fn a_folder_that_cannot_be_read_still_takes_a_commit() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("w");
        std::fs::create_dir(&sub).unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o300)).unwrap();
        if File::open(&sub).is_ok() {
            eprintln!("SKIPPED: this user reads a mode-300 folder (root)");
            return;
        }
        let p = sub.join("out.jsonl");
        let mut f = AtomicFile::create(&p).unwrap();
        writeln!(f, "new").unwrap();
        let committed = f.commit();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o700)).unwrap();
        committed.unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new\n");
    }

    /// What syncing a folder may fail with and be let be (a folder this user cannot open, as
    /// above, which root never meets; a file system without folder syncs), and what is an
    /// error naming the folder.
    #[cfg(unix)]
    #[test]
    fn only_an_unopenable_folder_or_an_unsupported_sync_is_let_be() {
        use std::io::{Error as IoError, ErrorKind};
        let dir = Path::new("some/folder");
        for kind in [
            ErrorKind::PermissionDenied,
            ErrorKind::Unsupported,
            ErrorKind::InvalidInput,
        ] {
            assert!(
                tolerate_unsyncable(dir, Err(IoError::from(kind))).is_ok(),
                "{kind:?}"
            );
        }
        assert!(tolerate_unsyncable(dir, Ok(())).is_ok());
        for e in [
            IoError::from_raw_os_error(5),
            IoError::from(ErrorKind::NotFound),
        ] {
            let err = tolerate_unsyncable(dir, Err(e)).unwrap_err().to_string();
            assert!(err.starts_with("some/folder: "), "{err}");
        }
    }

    /// A link planted at the temporary name is an error naming it, and the file it points to is
    /// left as it was (opening through it would have truncated it).
    #[cfg(unix)]
    #[test]
    fn a_link_at_the_temporary_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let (p, victim) = (dir.path().join("out.jsonl"), dir.path().join("victim"));
        std::fs::write(&victim, "precious\n").unwrap();
        std::os::unix::fs::symlink(&victim, dir.path().join("out.jsonl.tmp")).unwrap();
        let err = AtomicFile::create(&p).err().expect("a link is refused");
        assert!(err.to_string().contains("out.jsonl.tmp"), "{err}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    }

    #[test]
    fn a_second_writer_of_one_path_is_refused_while_the_first_writes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.jsonl");
        let mut first = AtomicFile::create(&p).unwrap();
        writeln!(first, "first").unwrap();
        first.flush().unwrap();
        let err = AtomicFile::create(&p)
            .err()
            .expect("the temporary file is locked");
        assert!(
            err.to_string().contains("another toolsift process"),
            "{err}"
        );
        // The refused writer neither truncated nor removed the first one's file.
        first.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "first\n");
        // Once the first is done, a second write of the same path goes ahead.
        let mut second = AtomicFile::create(&p).unwrap();
        writeln!(second, "second").unwrap();
        second.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "second\n");
    }

    /// A writer waiting for the lock of one that is then dropped uncommitted (its temporary
    /// file removed, not renamed into place) takes the name over; one waiting for a writer that
    /// commits is told that output was written meanwhile (unless it opened the name only after
    /// the rename, on a machine slow enough: then it simply writes).
    #[test]
    fn a_waiting_writer_takes_over_from_one_that_gave_up() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.jsonl");
        for commit in [false, true] {
            let mut first = AtomicFile::create(&p).unwrap();
            writeln!(first, "first").unwrap();
            let waiting = std::thread::scope(|s| {
                let waiting = s.spawn(|| AtomicFile::create(&p));
                std::thread::sleep(std::time::Duration::from_millis(150));
                if commit {
                    first.commit().unwrap();
                } else {
                    drop(first);
                }
                waiting.join().unwrap()
            });
            match waiting {
                Ok(mut second) => {
                    writeln!(second, "second").unwrap();
                    second.commit().unwrap();
                    assert_eq!(std::fs::read_to_string(&p).unwrap(), "second\n");
                }
                Err(e) => {
                    assert!(commit, "{e}");
                    assert!(
                        e.to_string().contains("wrote it while this one started"),
                        "{e}"
                    );
                    assert_eq!(std::fs::read_to_string(&p).unwrap(), "first\n");
                }
            }
        }
    }

    #[test]
    fn a_stale_temporary_file_is_overwritten_not_appended_to() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.jsonl");
        std::fs::write(
            AtomicFile::tmp_path(&p),
            "left by a crash, longer than the output\n",
        )
        .unwrap();
        let mut f = AtomicFile::create(&p).unwrap();
        writeln!(f, "new").unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new\n");
    }

    /// A path whose last part is "", "." or ".." names a folder even where it does not exist
    /// yet; one ending in a plain name does not.
    #[test]
    fn a_path_ending_in_a_folder_name_is_a_folder() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none");
        for end in ["", ".", ".."] {
            let p = PathBuf::from(format!("{}/{end}", missing.display()));
            assert!(folder_problem(&p).is_some(), "{}", p.display());
        }
        assert_eq!(folder_problem(&missing.join("out.jsonl")), None);
        assert_eq!(folder_problem(dir.path()), Some("is a folder"));
    }

    // ---- from the review of cli/annotate.rs, cli/generate.rs, generate/jsonl.rs, util/fs.rs ----

    /// A rename that fails (a folder holding a file at the output's name) is an error naming the
    /// output, and the temporary file is removed, not left beside it.
    #[test]
    fn a_commit_whose_rename_fails_removes_its_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.jsonl");
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("keep"), "keep").unwrap();
        let mut f = AtomicFile::create(&p).unwrap();
        writeln!(f, "new").unwrap();
        let err = f.commit().unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}: ", p.display())), "{err}");
        assert!(!AtomicFile::tmp_path(&p).exists());
        assert_eq!(std::fs::read_to_string(p.join("keep")).unwrap(), "keep");
    }

    /// A bare file name's folder is the current one (its parent is ""), which syncs.
    #[cfg(unix)]
    #[test]
    fn a_bare_file_name_syncs_the_current_folder() {
        sync_dir(Path::new("out.jsonl")).unwrap();
    }

    /// A file whose size says nothing of what it holds (/proc's say 0) is still refused past
    /// `max`, from what is read, not taken cut to `max` bytes.
    #[cfg(target_os = "linux")]
    #[test]
    fn read_at_most_refuses_a_file_larger_than_its_size_says() {
        let p = Path::new("/proc/self/status");
        assert_eq!(std::fs::metadata(p).unwrap().len(), 0);
        assert_eq!(read_at_most(p, 8).unwrap(), None);
        let whole = read_at_most(p, 1 << 20).unwrap().unwrap();
        assert!(whole.len() > 9 && whole.starts_with(b"Name:"));
    }

    /// An existing folder with nothing in it, or none at all, may take a fresh output; one
    /// holding a file may not.
    #[cfg(feature = "annotate")]
    #[test]
    fn missing_or_empty_is_true_only_without_entries() {
        let dir = tempfile::tempdir().unwrap();
        assert!(missing_or_empty(&dir.path().join("none")).unwrap());
        assert!(missing_or_empty(dir.path()).unwrap());
        std::fs::write(dir.path().join("f"), "").unwrap();
        assert!(!missing_or_empty(dir.path()).unwrap());
    }

    /// A writer that opened the temporary file while another held it, and finds it renamed into
    /// place once the lock is its, fails saying so: it does not start over under a new temporary
    /// file and replace what the other just wrote. (Linux: /proc/self/fd says when it has
    /// opened the file.)
    #[cfg(target_os = "linux")]
    #[test]
    fn a_writer_that_waited_for_one_that_committed_does_not_replace_its_output() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.jsonl");
        let tmp = AtomicFile::tmp_path(&p);
        let opened = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|target| *target == tmp)
                .count()
        };
        let mut first = AtomicFile::create(&p).unwrap();
        writeln!(first, "first").unwrap();
        let waiting = std::thread::scope(|s| {
            let waiting = s.spawn(|| AtomicFile::create(&p).map(|_| ()));
            let started = Instant::now();
            while opened() < 2 && started.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(2));
            }
            assert_eq!(opened(), 2, "the second writer opened the temporary file");
            first.commit().unwrap();
            waiting.join().unwrap()
        });
        let err = waiting.expect_err("the output was written meanwhile");
        assert!(
            err.to_string().contains("wrote it while this one started"),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "first\n");
    }

    /// A device (here /dev/null) cannot be an output the run renames a file over; a link can,
    /// even one to nothing (the rename replaces the link).
    #[cfg(unix)]
    #[test]
    fn an_output_that_is_a_device_is_refused_a_link_is_not() {
        assert_eq!(
            output_file_problem(Path::new("/dev/null")),
            Some("is not a regular file")
        );
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("out.jsonl");
        std::os::unix::fs::symlink(dir.path().join("none"), &link).unwrap();
        assert_eq!(output_file_problem(&link), None);
    }

    /// A small file over its limit is refused saying the limit in MiB.
    #[test]
    fn a_small_file_over_its_limit_says_the_limit_in_mib() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(&p, vec![b' '; (1 << 20) + 1]).unwrap();
        let err = read_small_file(&p, 1 << 20, Error::input)
            .unwrap_err()
            .to_string();
        assert!(err.contains("is larger than 1 MiB"), "{err}");
        assert_eq!(
            read_small_file(&p, 2 << 20, Error::input).unwrap().len(),
            (1 << 20) + 1
        );
    }

    /// A file at the folder's name is neither missing nor empty: it is an error (not a folder),
    /// not a place a fresh output may be written into.
    #[cfg(feature = "annotate")]
    #[test]
    fn missing_or_empty_is_an_error_for_a_file_at_the_folders_name() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("index");
        std::fs::write(&file, "a user's file").unwrap();
        assert!(missing_or_empty(&file).is_err());
    }

    /// A small file that cannot be read (here missing) is an I/O error naming it, not a verdict
    /// on what it holds made through `err`.
    #[test]
    fn a_small_file_that_cannot_be_read_is_an_io_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        match read_small_file(&p, 1 << 20, Error::input) {
            Err(Error::Io { path, error }) => {
                assert_eq!(path, p);
                assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("{other:?}"),
        }
    }

    /// Only a missing file is let be: one that cannot be removed (a folder at its name) is an
    /// error naming it, and the folder is left.
    #[test]
    fn remove_if_exists_refuses_what_it_cannot_remove() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.summary.json");
        remove_if_exists(&p).unwrap();
        std::fs::create_dir(&p).unwrap();
        let err = remove_if_exists(&p).unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}: ", p.display())), "{err}");
        assert!(p.is_dir());
    }

    /// What is written and flushed is in the temporary file (a reader of a run in progress
    /// sees it), not held in the buffer until the commit.
    #[test]
    fn a_flush_reaches_the_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.jsonl");
        let mut f = AtomicFile::create(&p).unwrap();
        writeln!(f, "first").unwrap();
        f.flush().unwrap();
        assert_eq!(
            std::fs::read_to_string(AtomicFile::tmp_path(&p)).unwrap(),
            "first\n"
        );
        f.commit().unwrap();
    }
}
