//! The checkpoint's zip archive: where each entry's bytes lie in the memory-mapped file (torch
//! stores them uncompressed), read from the headers with the `zip` crate. Every entry's bytes
//! are checked against the CRC-32 its header records, so a flipped byte in a weight is an error
//! rather than a silently different model (the check reads the file once; ~1 s per 10 GB).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::io::Cursor;
use std::ops::Range;
use std::path::Path;

use super::checkpoint_error;
use crate::error::Result;

/// Where one zip entry's bytes lie in the file, as its headers say.
struct ZipEntry {
    data_start: u64,
    size: u64,
    crc32: u32,
    compression: zip::CompressionMethod,
    encrypted: bool,
}

/// Checks that the local header at `header_start` is one of `name` with `compression`, as the
/// central directory says: an archive whose two directories disagree is not what torch wrote,
/// and Python's zipfile (what torch.load reads through) refuses a name that differs.
fn check_local_header(
    map: &[u8],
    header_start: u64,
    name: &[u8],
    compression: zip::CompressionMethod,
) -> std::result::Result<(), String> {
    const FIXED: usize = 30;
    let at = usize::try_from(header_start).unwrap_or(usize::MAX);
    let header = map
        .get(at..at.saturating_add(FIXED))
        .ok_or("its local header lies past the end of the file")?;
    let u16_at = |i: usize| u16::from_le_bytes([header[i], header[i + 1]]);
    let local_name = map
        .get(at + FIXED..at + FIXED + usize::from(u16_at(26)))
        .ok_or("its local header's name lies past the end of the file")?;
    if local_name != name {
        return Err(format!(
            "the local header names it `{}`",
            String::from_utf8_lossy(local_name)
        ));
    }
    // Entries are read as stored (`locate` refuses any other method): the local header must
    // agree, or the bytes read would be compressed ones.
    if compression == zip::CompressionMethod::Stored && u16_at(8) != 0 {
        return Err(format!(
            "the local header says compression method {}, the central directory stored (0)",
            u16_at(8)
        ));
    }
    Ok(())
}

/// Checks that no two entries' bytes overlap (two central records pointing at one entry would
/// give two tensors the same bytes).
/// `spans`: (start, end, name) of each entry's bytes.
fn check_disjoint(mut spans: Vec<(u64, u64, &str)>) -> std::result::Result<(), String> {
    spans.sort_unstable();
    for pair in spans.windows(2) {
        let ((_, end, a), (start, _, b)) = (pair[0], pair[1]);
        if start < end {
            return Err(format!("zip entries `{a}` and `{b}` share bytes"));
        }
    }
    Ok(())
}

/// The entries of the checkpoint's zip archive, by name, in archive order.
pub(super) struct ZipIndex {
    names: Vec<String>,
    entries: HashMap<String, ZipEntry>,
    /// Entries whose CRC-32 has been checked (a storage shared by tensors is checked once).
    checked: RefCell<HashSet<String>>,
}

impl ZipIndex {
    /// Lists the archive's entries and where their data starts (after each local header).
    pub(super) fn read(path: &Path, map: &[u8]) -> Result<Self> {
        let not_zip = |e: zip::result::ZipError| {
            let hint = if map.first() == Some(&0x80) {
                "this looks like the legacy torch.save format of PyTorch < 1.6, which is not \
                 supported; re-save it with a recent torch"
            } else {
                "torch.save writes zip archives since PyTorch 1.6; the file may be truncated"
            };
            checkpoint_error(path, format!("not a readable zip archive ({e}); {hint}"))
        };
        let mut archive = zip::ZipArchive::new(Cursor::new(map)).map_err(not_zip)?;
        // The crate keeps one of two entries of a name (the last); which would torch read?
        if archive.has_duplicate_names() {
            return Err(checkpoint_error(
                path,
                "the zip archive holds two entries of one name (which would be read?); not \
                 what torch.save writes",
            ));
        }
        let mut names = Vec::with_capacity(archive.len());
        let mut entries = HashMap::with_capacity(archive.len());
        for i in 0..archive.len() {
            let file = archive.by_index_raw(i).map_err(not_zip)?;
            let name = String::from_utf8_lossy(file.name_raw()).into_owned();
            let data_start = file.data_start().ok_or_else(|| {
                checkpoint_error(path, format!("zip entry `{name}` has no data offset"))
            })?;
            check_local_header(
                map,
                file.header_start(),
                file.name_raw(),
                file.compression(),
            )
            .map_err(|msg| checkpoint_error(path, format!("zip entry `{name}`: {msg}")))?;
            let entry = ZipEntry {
                data_start,
                size: file.compressed_size(),
                crc32: file.crc32(),
                compression: file.compression(),
                encrypted: file.encrypted(),
            };
            names.push(name.clone());
            entries.insert(name, entry);
        }
        let spans = names.iter().map(|n| {
            let e = &entries[n];
            (
                e.data_start,
                e.data_start.saturating_add(e.size),
                n.as_str(),
            )
        });
        check_disjoint(spans.collect()).map_err(|msg| checkpoint_error(path, msg))?;
        Ok(ZipIndex {
            names,
            entries,
            checked: RefCell::default(),
        })
    }

    /// The top folder that torch.save puts every entry under (the file's stem, or `archive`).
    pub(super) fn archive_name(&self, path: &Path) -> Result<String> {
        self.names
            .iter()
            .find_map(|name| {
                let (top, rest) = name.split_once('/')?;
                (rest == "data.pkl").then(|| top.to_string())
            })
            .ok_or_else(|| {
                checkpoint_error(
                    path,
                    "no `<archive>/data.pkl` entry; not a torch.save checkpoint",
                )
            })
    }

    /// Whether the archive has an entry of that name (for optional entries such as `byteorder`).
    pub(super) fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Where an entry's bytes are in `map` (the whole file), after checking that it exists, is
    /// stored as-is (so that it can be mapped), lies within the file and matches its CRC-32.
    pub(super) fn data(&self, path: &Path, map: &[u8], name: &str) -> Result<Range<usize>> {
        let range = self.locate(path, map.len(), name)?;
        if self.checked.borrow().contains(name) {
            return Ok(range);
        }
        let entry = &self.entries[name];
        let crc = crc32fast::hash(&map[range.clone()]);
        if crc != entry.crc32 {
            return Err(checkpoint_error(
                path,
                format!(
                    "entry `{name}` is corrupt: its bytes have CRC-32 {crc:08x}, the archive \
                     recorded {:08x}",
                    entry.crc32
                ),
            ));
        }
        self.checked.borrow_mut().insert(name.to_string());
        Ok(range)
    }

    /// Where an entry's bytes are, checked as `data` does but for the CRC-32.
    fn locate(&self, path: &Path, file_len: usize, name: &str) -> Result<Range<usize>> {
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| checkpoint_error(path, format!("missing zip entry `{name}`")))?;
        if entry.encrypted {
            return Err(checkpoint_error(
                path,
                format!("entry `{name}` is encrypted"),
            ));
        }
        if entry.compression != zip::CompressionMethod::Stored {
            return Err(checkpoint_error(
                path,
                format!(
                    "entry `{name}` is compressed ({}); torch.save stores entries uncompressed \
                     so that they can be memory-mapped",
                    entry.compression
                ),
            ));
        }
        match entry.data_start.checked_add(entry.size) {
            // Both ends are at most file_len, so they fit in usize.
            Some(end) if end <= file_len as u64 => Ok(entry.data_start as usize..end as usize),
            _ => Err(checkpoint_error(
                path,
                format!(
                    "entry `{name}` ({} bytes at offset {}) extends past the end of the \
                     {file_len}-byte file; it is truncated",
                    entry.size, entry.data_start
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_over_the_same_bytes_are_refused() {
        assert!(check_disjoint(vec![(8, 16, "b"), (0, 8, "a"), (16, 16, "c")]).is_ok());
        let err = check_disjoint(vec![(0, 8, "a"), (4, 12, "b")]).unwrap_err();
        assert_eq!(err, "zip entries `a` and `b` share bytes");
        // One byte is sharing too.
        assert!(check_disjoint(vec![(0, 8, "a"), (7, 12, "b")]).is_err());
    }
}
