//! The checkpoint's zip archive: where each entry's bytes lie in the memory-mapped file (torch
//! stores them uncompressed), read from the headers with the `zip` crate.

use std::collections::HashMap;
use std::io::Cursor;
use std::ops::Range;
use std::path::Path;

use super::checkpoint_error;
use crate::error::Result;

/// Where one zip entry's bytes lie in the file, as its headers say.
struct ZipEntry {
    data_start: u64,
    size: u64,
    compression: zip::CompressionMethod,
    encrypted: bool,
}

/// The entries of the checkpoint's zip archive, by name, in archive order.
pub(super) struct ZipIndex {
    names: Vec<String>,
    entries: HashMap<String, ZipEntry>,
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
                compression: file.compression(),
                encrypted: file.encrypted(),
            };
            names.push(name.clone());
            entries.insert(name, entry);
        }
        Ok(ZipIndex { names, entries })
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

    /// Where an entry's bytes are in the file, after checking that it exists, is stored as-is
    /// (so that it can be mapped) and lies within the file's `file_len` bytes.
    pub(super) fn data(&self, path: &Path, file_len: usize, name: &str) -> Result<Range<usize>> {
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
