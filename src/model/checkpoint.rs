//! Hugging Face GPT-J checkpoint folders: which files hold the weights, reading them memory-mapped,
//! and validating every tensor against the config before anything is computed.
//!
//! Supported layouts, in the order they are looked for (transformers' order, so that a folder
//! holding two checkpoints loads the one transformers loads):
//! - `model.safetensors`;
//! - `model.safetensors.index.json` + shards (`weight_map` names each tensor's shard);
//! - `pytorch_model.bin` (torch.save zip, read without Python; see `torch_bin`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::SafeTensors;

use super::tensor::{DType, Tensor};
use super::{safetensors_header, torch_bin};
use crate::error::{Error, Result};

/// Buffers that old GPT-J checkpoints carry (causal mask, masking constant). They are not weights.
/// Whole name components only: "attn.c_attn.bias" (GPT-2's) is not one.
pub fn is_ignored_buffer(name: &str) -> bool {
    ["attn.bias", "attn.masked_bias"]
        .iter()
        .any(|buffer| name == *buffer || name.ends_with(&format!(".{buffer}")))
}

/// Every tensor of a checkpoint by name, with the file it came from (for error messages).
pub struct TensorMap {
    tensors: HashMap<String, (Tensor, PathBuf)>,
}

impl TensorMap {
    /// The tensor under its Hugging Face name, with the file it was read from; None when the
    /// checkpoint has no such tensor.
    pub fn get(&self, name: &str) -> Option<&(Tensor, PathBuf)> {
        self.tensors.get(name)
    }

    /// Every tensor's name, in no particular order (the ignored buffers are not in the map).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Number of tensors, over all files of the checkpoint.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the checkpoint holds no tensor at all.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    fn insert(&mut self, name: String, tensor: Tensor, path: &Path) -> Result<()> {
        if let Some((_, first)) = self.tensors.get(&name) {
            return Err(Error::Tensor {
                path: path.to_owned(),
                tensor: name.clone(),
                msg: format!("appears twice (also in {})", first.display()),
            });
        }
        self.tensors.insert(name, (tensor, path.to_owned()));
        Ok(())
    }

    /// Reads the weight files of a checkpoint folder. Does not validate names or shapes.
    pub fn open_dir(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let bin = dir.join("pytorch_model.bin");
        let mut map = TensorMap {
            tensors: HashMap::new(),
        };
        if single.is_file() {
            map.read_safetensors(&single)?;
        } else if index.is_file() {
            let weight_map = read_index(&index)?;
            // Each shard with the first tensor listed in it (for errors about the shard).
            let mut shards: BTreeMap<&String, &String> = BTreeMap::new();
            for (tensor, shard) in &weight_map {
                shards.entry(shard).or_insert(tensor);
            }
            for (shard, tensor) in shards {
                let path = dir.join(shard);
                let bad = |msg: String| Error::Tensor {
                    path: index.clone(),
                    tensor: tensor.clone(),
                    msg,
                };
                match std::fs::metadata(&path) {
                    Ok(m) if m.is_file() => {}
                    Ok(_) => {
                        return Err(bad(format!(
                            "is listed in shard {shard:?}, but {} is not a regular file",
                            path.display()
                        )))
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        return Err(bad(format!(
                            "is listed in shard {shard:?}, but {} does not exist",
                            path.display()
                        )))
                    }
                    Err(e) => return Err(Error::io(&path, e)),
                }
                map.read_safetensors(&path)
                    .map_err(|e| as_shard(e, &index))?;
            }
            map.check_index(&index, dir, &weight_map)?;
        } else if bin.is_file() {
            for (name, tensor) in torch_bin::read_torch_bin(&bin, is_ignored_buffer)? {
                map.insert(name, tensor, &bin)?;
            }
        } else if let Some(odd) = [&single, &index, &bin]
            .into_iter()
            .find(|p| p.symlink_metadata().is_ok())
        {
            // A folder (or a device, or a link to nothing) under a weights file's name: say so,
            // not "no weights".
            let msg = if odd.exists() {
                "exists but is not a regular file"
            } else {
                "is a symbolic link to nothing"
            };
            return Err(Error::Checkpoint {
                path: odd.clone(),
                msg: msg.into(),
            });
        } else {
            return Err(Error::Checkpoint {
                path: dir.to_owned(),
                msg: "no weights found: expected model.safetensors, \
                      model.safetensors.index.json or pytorch_model.bin"
                    .into(),
            });
        }
        Ok(map)
    }

    fn read_safetensors(&mut self, path: &Path) -> Result<()> {
        let map = Arc::new(map_file(path)?);
        check_header(&map, path)?;
        let st = SafeTensors::deserialize(&map).map_err(|e| Error::Checkpoint {
            path: path.to_owned(),
            msg: format!("not a valid safetensors file (truncated or corrupt?): {e}"),
        })?;
        let base = map.as_ptr() as usize;
        let mut entries = Vec::new();
        for (name, view) in st.tensors() {
            if is_ignored_buffer(&name) {
                continue;
            }
            let dtype = match view.dtype() {
                safetensors::Dtype::F32 => DType::F32,
                safetensors::Dtype::F16 => DType::F16,
                safetensors::Dtype::BF16 => DType::BF16,
                other => {
                    return Err(Error::Tensor {
                        path: path.to_owned(),
                        tensor: name,
                        msg: format!(
                            "dtype {other:?} is not supported (float32, float16 or bfloat16)"
                        ),
                    })
                }
            };
            let data = view.data();
            let start = data.as_ptr() as usize - base;
            entries.push((name, dtype, view.shape().to_vec(), start, data.len()));
        }
        drop(st);
        for (name, dtype, shape, start, len) in entries {
            let tensor = Tensor::mapped(dtype, shape, map.clone(), start, len);
            self.insert(name, tensor, path)?;
        }
        Ok(())
    }
}

impl TensorMap {
    /// The tensors read from the shards are exactly those `weight_map` lists, each from the
    /// shard it names (buffers the loader ignores aside): an index that does not describe its
    /// shards is a corrupt or mixed-up checkpoint, not something to load around.
    fn check_index(
        &self,
        index: &Path,
        dir: &Path,
        weight_map: &BTreeMap<String, String>,
    ) -> Result<()> {
        let bad = |tensor: &str, msg: String| Error::Tensor {
            path: index.to_owned(),
            tensor: tensor.to_owned(),
            msg,
        };
        for (tensor, file) in weight_map {
            if is_ignored_buffer(tensor) {
                continue;
            }
            match self.tensors.get(tensor) {
                None => return Err(bad(tensor, format!("is listed in {file}, which lacks it"))),
                Some((_, path)) if path != &dir.join(file) => {
                    return Err(bad(
                        tensor,
                        format!("is listed in {file} but is in {}", path.display()),
                    ))
                }
                Some(_) => {}
            }
        }
        if let Some((tensor, (_, path))) = self
            .tensors
            .iter()
            .find(|(name, _)| !weight_map.contains_key(*name))
        {
            return Err(bad(
                tensor,
                format!("is in {} but not in the index's weight_map", path.display()),
            ));
        }
        Ok(())
    }
}

/// An error reading a shard, saying that the index names it: a shard named `config.json` would
/// otherwise be "config.json: not a valid safetensors file", with no word of why it was read.
fn as_shard(e: Error, index: &Path) -> Error {
    let named_by = |msg: String| {
        let index = index.file_name().unwrap_or_default().to_string_lossy();
        format!("{msg} (read as a shard that {index} names)")
    };
    match e {
        Error::Checkpoint { path, msg } => Error::Checkpoint {
            path,
            msg: named_by(msg),
        },
        Error::Tensor { path, tensor, msg } => Error::Tensor {
            path,
            tensor,
            msg: named_by(msg),
        },
        other => other,
    }
}

/// The `weight_map` (tensor -> shard file name) of a `model.safetensors.index.json`. A tensor
/// listed twice is an error: serde_json's own map keeps the last silently, and which shard
/// would hold it?
fn read_index(index: &Path) -> Result<BTreeMap<String, String>> {
    let bad = |msg: String| Error::Checkpoint {
        path: index.to_owned(),
        msg,
    };
    let text = crate::util::fs::read_small_text(index, MAX_INDEX_BYTES, bad)?;
    // A byte order mark is skipped, as in config.json and tokenizer.json.
    let text = crate::util::json::strip_bom(&text);
    let file: IndexFile = serde_json::from_str(text).map_err(|e| {
        if e.is_data() {
            bad(e.to_string())
        } else {
            bad(format!("not valid JSON: {e}"))
        }
    })?;
    let weight_map = file
        .weight_map
        .ok_or_else(|| bad("no \"weight_map\" object".into()))?;
    let mut map = BTreeMap::new();
    for (tensor, file) in weight_map.0 {
        let file = file.as_str();
        if !is_plain_file_name(file) {
            return Err(Error::Tensor {
                path: index.to_owned(),
                tensor,
                msg: format!(
                    "shard {file:?} is not a plain file name (a name in the index's folder: \
                     not empty, no path separator or NUL, not \".\" or \"..\")"
                ),
            });
        }
        if let Some(first) = map.insert(tensor.clone(), file.to_owned()) {
            return Err(Error::Tensor {
                path: index.to_owned(),
                tensor,
                msg: format!(
                    "is listed twice in weight_map (in {first:?} and {file:?}): which shard \
                     holds it?"
                ),
            });
        }
    }
    Ok(map)
}

/// The largest shard index read: GPT-J 6B's is about 25 KB (some 80 bytes a tensor).
const MAX_INDEX_BYTES: u64 = 4 << 20;

/// The part of a shard index the loader reads; every other key is ignored, unchecked.
struct IndexFile {
    /// None when the key is absent or `null`.
    weight_map: Option<WeightMap>,
}

/// `weight_map`'s entries in file order, each as written: a key held twice is kept twice.
/// Each value must be a string, checked as it is read: a value held as JSON could be an array
/// of millions of items.
struct WeightMap(Vec<(String, String)>);

impl<'de> serde::Deserialize<'de> for IndexFile {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Fields;
        impl<'de> serde::de::Visitor<'de> for Fields {
            type Value = IndexFile;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object with a \"weight_map\"")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<IndexFile, A::Error> {
                let mut weight_map = None;
                while let Some(key) = map.next_key::<String>()? {
                    if key != "weight_map" {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    } else if weight_map.is_some() {
                        return Err(serde::de::Error::custom("\"weight_map\" appears twice"));
                    } else {
                        weight_map = Some(map.next_value::<Option<WeightMap>>()?);
                    }
                }
                Ok(IndexFile {
                    weight_map: weight_map.flatten(),
                })
            }
        }
        // Only an object: a derived struct would also read an array of the fields in order.
        d.deserialize_map(Fields)
    }
}

impl<'de> serde::Deserialize<'de> for WeightMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = WeightMap;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a \"weight_map\" object of tensor names to shard files")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<WeightMap, A::Error> {
                let mut entries = Vec::new();
                while let Some(tensor) = map.next_key::<String>()? {
                    let file = map.next_value::<String>().map_err(|e| {
                        serde::de::Error::custom(format!(
                            "weight_map entry {tensor:?} is not a file name: {e}"
                        ))
                    })?;
                    entries.push((tensor, file));
                }
                Ok(WeightMap(entries))
            }
        }
        d.deserialize_map(Entries)
    }
}

/// A name of a file in the folder itself: not empty, "." or "..", no separator, no prefix, no
/// NUL (which no file name holds: the OS error would name neither the index nor the tensor).
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && matches!(
            Path::new(name).components().collect::<Vec<_>>().as_slice(),
            [std::path::Component::Normal(_)]
        )
}

/// torch's limit on a tensor's number of dimensions (the pickle reader applies it too).
const MAX_DIMS: usize = 64;

/// The largest safetensors header read: GPT-J 6B's is about 30 KB (some 100 bytes a tensor),
/// so this is room for some 40,000 tensors. The crate itself allows 100 MB, and holds every
/// JSON value of a header in memory before it checks one (see `safetensors_header`); with the
/// screen, what it holds stays a small multiple of this.
const MAX_HEADER_BYTES: u64 = 4 << 20;

/// Refuses a header longer than [`MAX_HEADER_BYTES`], or one that is not the shape of a
/// safetensors header ([`safetensors_header::screen`]), before the crate parses it
/// (safetensors: an 8-byte little-endian length, then that much JSON).
fn check_header(bytes: &[u8], path: &Path) -> Result<()> {
    let Some(len) = bytes.first_chunk::<8>().map(|b| u64::from_le_bytes(*b)) else {
        return Ok(()); // too short to hold a length: the crate names that
    };
    let bad = |msg: String| Error::Checkpoint {
        path: path.to_owned(),
        msg,
    };
    if len > MAX_HEADER_BYTES {
        return Err(bad(format!(
            "its safetensors header claims {len} bytes, more than the {MAX_HEADER_BYTES} a \
             checkpoint's header needs (corrupt or not a safetensors file?)"
        )));
    }
    let Some(header) = bytes.get(8..8 + len as usize) else {
        return Ok(()); // the file ends inside the header: the crate names that
    };
    let data_bytes = (bytes.len() - 8 - header.len()) as u64;
    safetensors_header::screen(header, MAX_DIMS, data_bytes).map_err(|flaw| match flaw.entry {
        Some(tensor) if tensor != safetensors_header::METADATA => Error::Tensor {
            path: path.to_owned(),
            tensor,
            msg: format!("in the safetensors header: {}", flaw.msg),
        },
        Some(metadata) => bad(format!(
            "its safetensors header's {metadata} is malformed: {}",
            flaw.msg
        )),
        None => bad(format!(
            "not a valid safetensors file (corrupt?): its header: {}",
            flaw.msg
        )),
    })
}

fn map_file(path: &Path) -> Result<Mmap> {
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: the map is read-only; a checkpoint modified while it is mapped is outside our
    // contract (as for every mmap-based loader, safetensors' own included).
    unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))
}

/// Writes `tensors` as one safetensors file (used by the demo trainer and by tests that make
/// random checkpoints), with no metadata, atomically (`util::fs::write_atomic`).
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    crate::util::fs::write_atomic(path, |w| write_safetensors_to(w, path, tensors, None))
}

/// `tensors` as a safetensors file into `w`, with the header's `__metadata__` (`toolsift convert`
/// writes `{"format": "pt"}`, which transformers before 4.48 requires of a PyTorch checkpoint).
/// The bytes are the safetensors crate's own `serialize` (tensors by descending alignment, then
/// name; the header padded to 8 bytes), streamed: the crate's `serialize_to_file` writes through a
/// randomly named temporary file of its own, which an interrupted run leaves behind, as large as
/// the checkpoint, where `AtomicFile`'s is reused. `path` names the file in errors.
fn write_safetensors_to(
    w: &mut dyn std::io::Write,
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: Option<std::collections::HashMap<String, String>>,
) -> Result<()> {
    use safetensors::tensor::{Metadata, TensorInfo};
    let st_dtype = |d: DType| match d {
        DType::F32 => safetensors::Dtype::F32,
        DType::F16 => safetensors::Dtype::F16,
        DType::BF16 => safetensors::Dtype::BF16,
    };
    let mut order: Vec<&(String, Tensor)> = tensors.iter().collect();
    order.sort_by(|(a_name, a), (b_name, b)| {
        st_dtype(b.dtype())
            .cmp(&st_dtype(a.dtype()))
            .then(a_name.cmp(b_name))
    });
    let mut infos = Vec::with_capacity(order.len());
    let mut offset = 0usize;
    for (name, t) in &order {
        let bytes = t.bytes().len();
        let numel = t.shape().iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if numel.and_then(|n| n.checked_mul(t.dtype().size())) != Some(bytes) {
            return Err(Error::Tensor {
                path: path.to_owned(),
                tensor: name.clone(),
                msg: format!("{bytes} bytes do not hold shape {:?}", t.shape()),
            });
        }
        let data_offsets = (offset, offset + bytes);
        offset += bytes;
        infos.push((
            name.clone(),
            TensorInfo {
                dtype: st_dtype(t.dtype()),
                shape: t.shape().to_vec(),
                data_offsets,
            },
        ));
    }
    let header = Metadata::new(metadata, infos)
        .map_err(|e| e.to_string())
        .and_then(|m| serde_json::to_string(&m).map_err(|e| e.to_string()))
        .map_err(|e| Error::Checkpoint {
            path: path.to_owned(),
            msg: format!("could not write its safetensors header: {e}"),
        })?;
    let mut header = header.into_bytes();
    header.resize(header.len().next_multiple_of(8), b' ');
    let io = |e| Error::io(path, e);
    w.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    w.write_all(&header).map_err(io)?;
    for (_, t) in order {
        w.write_all(t.bytes()).map_err(io)?;
    }
    Ok(())
}

/// Writes `model` as a safetensors folder (config.json, model.safetensors, tokenizer.json when the
/// source has one), optionally casting every tensor to `dtype`. Returns the number of tensors.
///
/// config.json keeps every field of the source's (token ids, architectures, ...) with the
/// engine's fields and `torch_dtype` brought up to date. `out` must be another folder than the
/// source's, hold none of the source's files under its names (a hard link or symlink to them),
/// and not hold a sharded checkpoint, whose index would shadow the new file. Every file is
/// written under a temporary name and renamed into place only once all are written, so a
/// conversion that fails while writing leaves an earlier output as it was; the renames are one
/// file at a time (weights, tokenizer.json, config.json last), so one killed between them can
/// leave the new weights beside the earlier small files. An earlier tokenizer.json that the new
/// model lacks is removed.
pub fn convert(model: &super::Model, out: &Path, dtype: Option<DType>) -> Result<usize> {
    use crate::util::fs::AtomicFile;
    use std::io::Write;
    check_convert_destination(model, out)?;
    // Read everything from the source before anything is written.
    let cfg = config_json(model, dtype)?;
    let tokenizer = match &model.tokenizer {
        Some(tok) => Some(std::fs::read(tok.path()).map_err(|e| Error::io(tok.path(), e))?),
        None => None,
    };
    let tensors = converted_tensors(model, out, dtype)?;
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    // config.json's temporary file is taken first: its lock, held until the end, makes this
    // conversion the folder's only writer, so a second `convert` into it fails at once instead
    // of writing into the same temporary weights.
    let cfg_path = out.join("config.json");
    let mut cfg_file = AtomicFile::create(&cfg_path)?;
    // Weights, then the small files, each under its temporary name; renamed into place
    // together.
    let weights_path = out.join("model.safetensors");
    let mut weights_file = AtomicFile::create(&weights_path)?;
    let format = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let written = write_safetensors_to(&mut weights_file, &weights_path, &tensors, Some(format))
        .and_then(|()| {
            cfg_file
                .write_all(cfg.as_bytes())
                .map_err(|e| Error::io(&cfg_path, e))?;
            let tok_file = match &tokenizer {
                Some(bytes) => {
                    let dst = out.join("tokenizer.json");
                    let mut f = AtomicFile::create(&dst)?;
                    f.write_all(bytes).map_err(|e| Error::io(&dst, e))?;
                    Some(f)
                }
                None => None,
            };
            weights_file.commit()?;
            if let Some(f) = tok_file {
                f.commit()?;
            } else {
                crate::util::fs::remove_if_exists(&out.join("tokenizer.json"))?;
            }
            Ok(())
        });
    match written {
        // config.json last: its rename releases the folder to the next writer.
        Ok(()) => cfg_file.commit().map(|()| tensors.len()),
        // The uncommitted files' temporary names are removed as they are dropped, config.json's
        // (the folder's lock) last.
        Err(e) => {
            drop(cfg_file);
            Err(e)
        }
    }
}

/// Refuses a destination `convert` must not write into: not a folder, the source itself, a
/// sharded checkpoint's folder, or one whose config.json, model.safetensors or tokenizer.json is
/// a folder or a link to a source file. Checked before anything is written.
fn check_convert_destination(model: &super::Model, out: &Path) -> Result<()> {
    use crate::util::fs::is_same_file;
    let refuse = |msg: String| Error::Checkpoint {
        path: out.to_owned(),
        msg,
    };
    let loaded = !model.dir.as_os_str().is_empty();
    if !out.exists() && out.is_symlink() {
        return Err(refuse(
            "is a symbolic link to nothing: create the folder it points to, or give another".into(),
        ));
    }
    if out.exists() && !out.is_dir() {
        return Err(refuse(
            "is not a folder: give the folder to write config.json, model.safetensors and \
             tokenizer.json into"
                .into(),
        ));
    }
    if out.is_dir() && loaded && same_dir(out, &model.dir) {
        return Err(refuse(
            "is the folder being converted; write to another folder (converting in place would \
             overwrite the files being read)"
                .into(),
        ));
    }
    if out.join("model.safetensors.index.json").exists() {
        return Err(refuse(
            "holds a sharded checkpoint (model.safetensors.index.json): with the converted \
             model.safetensors beside it the folder would hold two checkpoints; write to \
             another folder"
                .into(),
        ));
    }
    let names = ["config.json", "model.safetensors", "tokenizer.json"];
    // The source's files: a destination that is one of them (a hard link, a symlink) would be
    // truncated while, or before, it is read.
    let mut sources: Vec<PathBuf> = model
        .tokenizer
        .iter()
        .map(|t| t.path().to_owned())
        .collect();
    if loaded {
        if let Ok(entries) = std::fs::read_dir(&model.dir) {
            sources.extend(entries.flatten().map(|e| e.path()));
        }
    }
    for name in names {
        let dst = out.join(name);
        // Checked before anything is written: the renames into place would fail on a folder
        // after the weights had been committed beside an old config.json.
        if dst.is_dir() {
            return Err(refuse(format!(
                "{name} is a folder there, where the converted {name} goes; remove it or write \
                 to another folder"
            )));
        }
        if let Some(src) = sources.iter().find(|src| is_same_file(src, &dst)) {
            return Err(refuse(format!(
                "{name} is the source's {} (a link to it); write to another folder",
                src.display()
            )));
        }
    }
    Ok(())
}

/// `model`'s tensors by their checkpoint names, in `dtype` where one is given; a weight out of
/// that type's range is refused (naming `out`, the conversion's destination).
fn converted_tensors(
    model: &super::Model,
    out: &Path,
    dtype: Option<DType>,
) -> Result<Vec<(String, Tensor)>> {
    let refuse = |msg: String| Error::Checkpoint {
        path: out.to_owned(),
        msg,
    };
    let mut tensors = model.weights.named_tensors(&model.config);
    if let Some(dtype) = dtype {
        for (name, t) in tensors.iter_mut() {
            if t.dtype() != dtype {
                let values = t.to_f32();
                let converted = Tensor::from_f32_as(t.shape().to_vec(), &values, dtype);
                // f16 tops out at 65504: a larger weight would be written as infinity, a
                // checkpoint the loader then refuses.
                let overflow = converted
                    .to_f32()
                    .iter()
                    .zip(&values)
                    .position(|(c, v)| !c.is_finite() && v.is_finite());
                if let Some(k) = overflow {
                    return Err(refuse(format!(
                        "{name}: a weight of {} (element {k}) is out of {}'s range; convert to \
                         bf16 or f32 instead",
                        values[k],
                        dtype.name()
                    )));
                }
                *t = converted;
            }
        }
    }
    Ok(tensors)
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The source's config.json (when the model was loaded from a folder) with the engine's fields
/// and `torch_dtype` (and `dtype`, if it has one) overwritten; the engine's fields alone
/// otherwise.
fn config_json(model: &super::Model, dtype: Option<DType>) -> Result<String> {
    let src = model.dir.join("config.json");
    let mut cfg = if model.dir.as_os_str().is_empty() || !src.is_file() {
        serde_json::Map::new()
    } else {
        let text =
            crate::util::fs::read_small_text(&src, super::config::MAX_CONFIG_BYTES, |msg| {
                Error::Config {
                    path: src.clone(),
                    msg,
                }
            })?;
        // Read as the load read it (a byte order mark skipped).
        match crate::util::json::object_from_str::<serde_json::Map<String, serde_json::Value>>(
            &text,
        ) {
            Ok(map) => map,
            Err(_) => {
                return Err(Error::Checkpoint {
                    path: src,
                    msg: "is no longer a JSON object (changed since the model was loaded?)".into(),
                })
            }
        }
    };
    // A struct serializes to an object.
    if let Ok(serde_json::Value::Object(engine)) = serde_json::to_value(&model.config) {
        cfg.extend(engine);
    }
    // transformers' AutoConfig needs it; the engine's config may have none.
    if cfg.get("model_type").is_none_or(serde_json::Value::is_null) {
        cfg.insert("model_type".into(), "gptj".into());
    }
    if let Some(dtype) = dtype {
        cfg.insert("torch_dtype".into(), dtype.name().into());
        // transformers 4.56+ writes `dtype` instead (and reads it first): a source's would
        // misstate the converted weights.
        if cfg.contains_key("dtype") {
            cfg.insert("dtype".into(), dtype.name().into());
        }
    }
    Ok(serde_json::to_string_pretty(&cfg).expect("a JSON map serializes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gptj_buffer_names() {
        assert!(is_ignored_buffer("transformer.h.0.attn.bias"));
        assert!(is_ignored_buffer("transformer.h.27.attn.masked_bias"));
        // The whole name may be the buffer's (a checkpoint saved from a bare block).
        assert!(is_ignored_buffer("attn.bias"));
        assert!(is_ignored_buffer("attn.masked_bias"));
        assert!(!is_ignored_buffer("transformer.h.0.attn.c_attn.bias"));
        assert!(!is_ignored_buffer("h.0.c_attn.bias"));
        assert!(!is_ignored_buffer("transformer.h.0.mlp.fc_in.bias"));
    }

    /// The streamed file is byte for byte what the safetensors crate's `serialize` makes (its
    /// tensor order, header and padding), metadata or not.
    #[test]
    fn streamed_safetensors_are_the_crates_bytes() {
        let values: Vec<f32> = (0..24).map(|i| i as f32 * 0.37 - 3.0).collect();
        let tensors = vec![
            (
                "b.weight".to_string(),
                Tensor::from_f32_as(vec![2, 3], &values[..6], DType::BF16),
            ),
            (
                "a.weight".to_string(),
                Tensor::from_f32(vec![4, 3], &values[..12]),
            ),
            (
                "c".to_string(),
                Tensor::from_f32_as(vec![5], &values[..5], DType::F16),
            ),
            (
                "a.bias".to_string(),
                Tensor::from_f32(vec![3], &values[..3]),
            ),
            (
                "z".to_string(),
                Tensor::from_f32(vec![1, 1, 1], &values[..1]),
            ),
        ];
        for metadata in [None, Some(HashMap::from([("format".into(), "pt".into())]))] {
            let views: Vec<_> = tensors
                .iter()
                .map(|(name, t)| {
                    let dtype = match t.dtype() {
                        DType::F32 => safetensors::Dtype::F32,
                        DType::F16 => safetensors::Dtype::F16,
                        DType::BF16 => safetensors::Dtype::BF16,
                    };
                    let view =
                        safetensors::tensor::TensorView::new(dtype, t.shape().to_vec(), t.bytes())
                            .unwrap();
                    (name.clone(), view)
                })
                .collect();
            let want = safetensors::tensor::serialize(views, metadata.clone()).unwrap();
            let mut got = Vec::new();
            write_safetensors_to(&mut got, Path::new("t"), &tensors, metadata).unwrap();
            assert_eq!(got, want);
        }
    }
}
