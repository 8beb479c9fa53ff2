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
        let mut names = Vec::with_capacity(archive.len());
        let mut entries = HashMap::with_capacity(archive.len());
        for i in 0..archive.len() {
            let file = archive.by_index_raw(i).map_err(not_zip)?;
            let name = String::from_utf8_lossy(file.name_raw()).into_owned();
            let data_start = file.data_start().ok_or_else(|| {
                checkpoint_error(path, format!("zip entry `{name}` has no data offset"))
            })?;
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
