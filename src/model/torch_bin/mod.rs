//! Reads PyTorch checkpoints (`pytorch_model.bin`) without Python.
//!
//! Since PyTorch 1.6, `torch.save` writes a zip archive: `<archive>/data.pkl` is a pickle of the
//! state dict in which every tensor refers to a storage by key, and `<archive>/data/<key>` holds
//! that storage's raw little-endian bytes, uncompressed. This module lists the zip entries, runs
//! a small pickle interpreter over `data.pkl` that only builds data (it never calls or imports
//! anything), and returns each tensor as a view into the memory-mapped file. `archive` finds the
//! entries' bytes, `pickle` is the interpreter; here the tensors are checked and mapped.

mod archive;
mod pickle;

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use memmap2::Mmap;

use archive::ZipIndex;
use pickle::{TensorRef, Unpickler, Value};

use crate::error::{Error, Result};
use crate::model::tensor::{DType, Tensor};

/// Largest `data.pkl` read: a state dict's pickle is a few hundred bytes per tensor (GPT-J-6B's:
/// ~30 KB). Its interpreter holds up to 8 bytes of stack or marks per pickle byte besides its
/// values, which it caps (`pickle::MAX_VALUES`).
const MAX_PICKLE_BYTES: usize = 4 << 20;

/// Reads every tensor of a torch.save zip checkpoint, memory-mapped.
///
/// Returns (name, Tensor) in file order. The entries whose names `skip` takes are left out
/// unread, so their dtypes need no support: the loader passes
/// [`is_ignored_buffer`](crate::model::checkpoint::is_ignored_buffer), the buffers that old
/// GPT-J checkpoints carry but that are not weights (`*.attn.bias`, a bool causal mask, and
/// `*.attn.masked_bias`, a scalar). Entries of the state dict that are not tensors are skipped
/// too, unless named as a weight or bias (`*.weight`, `*.bias`: an error naming it, a form of
/// tensor this reader does not build). Only float16, float32 and bfloat16 tensors with row-major
/// strides are read.
pub fn read_torch_bin(path: &Path, skip: impl Fn(&str) -> bool) -> Result<Vec<(String, Tensor)>> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: the map is read-only; as with every memory-mapped checkpoint, the file must not be
    // truncated or rewritten by another process while the returned tensors are alive.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    let map = Arc::new(map);

    let zip = ZipIndex::read(path, &map)?;
    let archive = zip.archive_name(path)?;
    let byteorder = format!("{archive}/byteorder");
    if zip.contains(&byteorder) {
        let order = &map[zip.data(path, &map[..], &byteorder)?];
        if order != b"little" {
            return Err(checkpoint_error(
                path,
                format!(
                    "byte order is `{}`; only little-endian checkpoints are supported",
                    String::from_utf8_lossy(order)
                ),
            ));
        }
    }

    let pkl_name = format!("{archive}/data.pkl");
    let pkl = &map[zip.data(path, &map[..], &pkl_name)?];
    if pkl.len() > MAX_PICKLE_BYTES {
        return Err(checkpoint_error(
            path,
            format!(
                "{pkl_name} is {} bytes, more than the {MAX_PICKLE_BYTES} a state dict's pickle \
                 needs (a few hundred per tensor): not a model checkpoint?",
                pkl.len()
            ),
        ));
    }
    let mut unpickler = Unpickler::new(pkl);
    let root = unpickler
        .run()
        .map_err(|msg| checkpoint_error(path, format!("{pkl_name}: {msg}")))?;
    let items = unpickler
        .state_dict(root)
        .map_err(|msg| checkpoint_error(path, format!("{pkl_name}: {msg}")))?;

    let mut tensors = Vec::new();
    let mut seen = HashSet::new();
    let mut storages: HashMap<Rc<str>, (Rc<str>, u64)> = HashMap::new();
    for &(key, value) in items {
        let Value::Str(name) = &unpickler.values[key] else {
            return Err(checkpoint_error(
                path,
                format!(
                    "{pkl_name}: a state dict key is {}, not a string",
                    unpickler.values[key].kind()
                ),
            ));
        };
        if !seen.insert(Rc::clone(name)) {
            return Err(checkpoint_error(
                path,
                format!("{pkl_name}: tensor name `{name}` appears twice"),
            ));
        }
        if skip(name) {
            continue;
        }
        let Value::Tensor(tensor) = &unpickler.values[value] else {
            // A weight in a form this reader does not build (a Parameter with state, a tensor
            // subclass): named here, rather than reported missing later.
            if name.ends_with(".weight") || name.ends_with(".bias") {
                return Err(tensor_error(
                    path,
                    name,
                    format!(
                        "{pkl_name}: pickled as {}, not as a plain tensor \
                         (torch._utils._rebuild_tensor_v2) that toolsift reads; save the state \
                         dict's tensors (`{{k: v.detach().contiguous() for k, v in \
                         model.state_dict().items()}}`) or convert it to safetensors",
                        unpickler.values[value].kind()
                    ),
                ));
            }
            tracing::debug!(
                "{}: skipping `{name}`, which is {} rather than a tensor",
                path.display(),
                unpickler.values[value].kind()
            );
            continue;
        };
        // One storage, one type and size: torch.save refuses to write a storage viewed as two
        // types, and torch.load would read both tensors as the first.
        let storage = &tensor.storage;
        match storages.entry(Rc::clone(&storage.key)) {
            Entry::Vacant(v) => {
                v.insert((Rc::clone(&storage.class), storage.numel));
            }
            Entry::Occupied(o) if *o.get() != (Rc::clone(&storage.class), storage.numel) => {
                let (class, numel) = o.get();
                return Err(tensor_error(
                    path,
                    name,
                    format!(
                        "{pkl_name}: reads storage `{}` as torch.{} of {} elements, which an \
                         earlier tensor reads as torch.{class} of {numel}",
                        storage.key, storage.class, storage.numel
                    ),
                ));
            }
            Entry::Occupied(_) => {}
        }
        let mapped = map_tensor(path, &map, &zip, &archive, name, tensor)?;
        tensors.push((name.to_string(), mapped));
    }
    if tensors.is_empty() {
        return Err(checkpoint_error(path, "no tensors found in the state dict"));
    }
    Ok(tensors)
}

/// Builds the error every malformed-file case ends in.
fn checkpoint_error(path: &Path, msg: impl Into<String>) -> Error {
    Error::Checkpoint {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

/// Builds the error for a problem with one named tensor.
fn tensor_error(path: &Path, tensor: &str, msg: impl Into<String>) -> Error {
    Error::Tensor {
        path: path.to_path_buf(),
        tensor: tensor.to_string(),
        msg: msg.into(),
    }
}

/// The storage classes whose bytes can be handed out as a `Tensor` without conversion.
fn storage_dtype(class: &str) -> Option<DType> {
    match class {
        "HalfStorage" => Some(DType::F16),
        "FloatStorage" => Some(DType::F32),
        "BFloat16Storage" => Some(DType::BF16),
        _ => None,
    }
}

/// Checks one pickled tensor against its storage entry and returns it as a view of the map.
fn map_tensor(
    path: &Path,
    map: &Arc<Mmap>,
    zip: &ZipIndex,
    archive: &str,
    name: &str,
    tensor: &TensorRef,
) -> Result<Tensor> {
    let class = &tensor.storage.class;
    let dtype = storage_dtype(class).ok_or_else(|| {
        tensor_error(
            path,
            name,
            format!(
                "unsupported storage type torch.{class}; only float16, float32 and bfloat16 \
                 tensors are read"
            ),
        )
    })?;
    if tensor.size.len() != tensor.stride.len() {
        return Err(tensor_error(
            path,
            name,
            format!(
                "size {:?} and stride {:?} have different lengths",
                tensor.size, tensor.stride
            ),
        ));
    }
    if !is_contiguous(&tensor.size, &tensor.stride) {
        return Err(tensor_error(
            path,
            name,
            format!(
                "not contiguous (size {:?}, stride {:?}); only row-major tensors are supported",
                tensor.size, tensor.stride
            ),
        ));
    }

    let overflow = || tensor_error(path, name, "size overflows");
    let numel = tensor
        .size
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .ok_or_else(overflow)?;
    let elem = dtype.size() as u64;
    let end_elem = tensor.offset.checked_add(numel).ok_or_else(overflow)?;
    let start_byte = tensor.offset.checked_mul(elem).ok_or_else(overflow)?;
    let end_byte = end_elem.checked_mul(elem).ok_or_else(overflow)?;
    if end_elem > tensor.storage.numel {
        return Err(tensor_error(
            path,
            name,
            format!(
                "elements {}..{end_elem} lie past the end of its storage of {} elements",
                tensor.offset, tensor.storage.numel
            ),
        ));
    }

    let entry_name = format!("{archive}/data/{}", tensor.storage.key);
    // The entry's own errors (missing, corrupt, compressed) name the tensor too.
    let data = zip.data(path, &map[..], &entry_name).map_err(|e| match e {
        Error::Checkpoint { msg, .. } => tensor_error(path, name, msg),
        other => other,
    })?;
    if end_byte > data.len() as u64 {
        return Err(tensor_error(
            path,
            name,
            format!(
                "truncated: needs bytes {start_byte}..{end_byte} of `{entry_name}`, which holds {}",
                data.len()
            ),
        ));
    }
    if tensor.storage.numel.checked_mul(elem) != Some(data.len() as u64) {
        return Err(tensor_error(
            path,
            name,
            format!(
                "its storage `{entry_name}` holds {} bytes, not the {} elements of torch.{class} \
                 the pickle declares",
                data.len(),
                tensor.storage.numel
            ),
        ));
    }
    let shape = tensor
        .size
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| overflow())?;
    // Both fit in usize: they are at most `data.len()`, a length within the map.
    let start = data.start + start_byte as usize;
    let len = (end_byte - start_byte) as usize;
    Ok(Tensor::mapped(dtype, shape, Arc::clone(map), start, len))
}

/// Row-major contiguity as torch defines it: strides of dimensions of size 1 do not matter, and
/// neither does anything about a tensor with no elements.
fn is_contiguous(size: &[u64], stride: &[u64]) -> bool {
    if size.contains(&0) {
        return true;
    }
    let mut expected = 1u64;
    for (&d, &s) in size.iter().zip(stride).rev() {
        if d != 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(d);
    }
    true
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::path::PathBuf;

    use super::*;
    use crate::model::checkpoint::is_ignored_buffer;

    /// The crate's test fixtures.
    fn fixture_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
    }

    /// Writes a zip laid out like torch.save's: `archive/data.pkl` first, then the storages.
    fn write_checkpoint(dir: &Path, pkl: &[u8], storages: &[(&str, &[u8])]) -> PathBuf {
        let mut entries = vec![("archive/data.pkl".to_string(), pkl)];
        entries.extend(
            storages
                .iter()
                .map(|&(key, b)| (format!("archive/data/{key}"), b)),
        );
        write_zip(dir, &entries)
    }

    /// model.bin in `dir`: these entries, stored (uncompressed), in this order.
    fn write_zip(dir: &Path, entries: &[(String, &[u8])]) -> PathBuf {
        let path = dir.join("model.bin");
        let file = File::create(&path).unwrap();
        let mut zip = zip::ZipWriter::new(file);
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        for (name, bytes) in entries {
            zip.start_file(name.as_str(), options).unwrap();
            zip.write_all(bytes).unwrap();
        }
        zip.finish().unwrap();
        path
    }

    /// `read_torch_bin` of a checkpoint written by [`write_checkpoint`] into a temporary folder.
    fn read_checkpoint(pkl: &[u8], storages: &[(&str, &[u8])]) -> Result<Vec<(String, Tensor)>> {
        let dir = tempfile::tempdir().unwrap();
        read_torch_bin(
            &write_checkpoint(dir.path(), pkl, storages),
            is_ignored_buffer,
        )
    }

    /// Protocol-2 opcodes for `_rebuild_tensor_v2` of one storage, as torch.save writes them.
    fn tensor_ops(
        class: &str,
        key: &str,
        numel: u8,
        offset: u8,
        size: &[u8],
        stride: &[u8],
    ) -> Vec<u8> {
        let wide = |v: &[u8]| v.iter().map(|&x| u64::from(x)).collect::<Vec<_>>();
        wide_tensor_ops(
            class,
            key,
            numel.into(),
            offset.into(),
            &wide(size),
            &wide(stride),
        )
    }

    /// [`tensor_ops`] with ints of any size: BININT1 below 256 (the same bytes), 8-byte LONG1
    /// above.
    fn wide_tensor_ops(
        class: &str,
        key: &str,
        numel: u64,
        offset: u64,
        size: &[u64],
        stride: &[u64],
    ) -> Vec<u8> {
        let int = |p: &mut Vec<u8>, v: u64| match u8::try_from(v) {
            Ok(small) => p.extend([b'K', small]),
            Err(_) => {
                p.extend([0x8a, 8]);
                p.extend(v.to_le_bytes());
            }
        };
        let mut p = b"ctorch._utils\n_rebuild_tensor_v2\n((".to_vec();
        p.extend(short_str("storage"));
        p.extend(format!("ctorch\n{class}\n").as_bytes());
        p.extend(short_str(key));
        p.extend(short_str("cpu"));
        int(&mut p, numel);
        p.extend(b"tQ");
        int(&mut p, offset);
        p.push(b'(');
        for &d in size {
            int(&mut p, d);
        }
        p.extend(b"t(");
        for &s in stride {
            int(&mut p, s);
        }
        // requires_grad=False, backward_hooks=OrderedDict()
        p.extend(b"t\x89ccollections\nOrderedDict\n)Rt");
        p.push(b'R');
        p
    }

    /// A SHORT_BINUNICODE opcode.
    fn short_str(s: &str) -> Vec<u8> {
        let mut p = vec![0x8c, s.len() as u8];
        p.extend(s.as_bytes());
        p
    }

    /// A pickled `{name: tensor}` dict.
    fn state_dict_pickle(name: &str, tensor: &[u8]) -> Vec<u8> {
        let mut p = b"\x80\x02}".to_vec();
        p.extend(short_str(name));
        p.extend(tensor);
        p.extend(b"s.");
        p
    }

    /// Little-endian storage bytes.
    fn f32_bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn fixture_matches_safetensors_weights() {
        let tensors = read_torch_bin(
            &fixture_dir().join("tiny-gptj-bin/pytorch_model.bin"),
            is_ignored_buffer,
        )
        .unwrap();
        let st_bytes = std::fs::read(fixture_dir().join("tiny-gptj/model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&st_bytes).unwrap();

        assert_eq!(tensors.len(), st.len(), "every weight and no buffer");
        assert_eq!(tensors[0].0, "transformer.wte.weight", "file order");
        for (name, tensor) in &tensors {
            let expected = st.tensor(name).unwrap();
            assert_eq!(tensor.dtype(), DType::F16, "{name}");
            assert_eq!(tensor.shape(), expected.shape(), "{name}");
            let want: Vec<f32> = expected
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            assert_eq!(tensor.to_f32(), want, "{name}");
        }
    }

    #[test]
    fn truncated_file_is_an_error_naming_it() {
        let bytes = std::fs::read(fixture_dir().join("tiny-gptj-bin/pytorch_model.bin")).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cut.bin");
        for len in [0, 100, bytes.len() / 2, bytes.len() - 30] {
            std::fs::write(&path, &bytes[..len]).unwrap();
            let err = read_torch_bin(&path, is_ignored_buffer).unwrap_err();
            assert!(matches!(err, Error::Checkpoint { .. }), "{len}: {err}");
            assert!(err.to_string().contains("cut.bin"), "{len}: {err}");
        }
    }

    #[test]
    fn random_bytes_are_an_error() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let bytes: Vec<u8> = (0..4096)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (state >> 56) as u8
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("noise.bin");
        std::fs::write(&path, bytes).unwrap();
        let err = read_torch_bin(&path, is_ignored_buffer).unwrap_err();
        assert!(matches!(err, Error::Checkpoint { .. }), "{err}");
    }

    #[test]
    fn missing_file_is_an_io_error() {
        let err = read_torch_bin(
            Path::new("/nonexistent/pytorch_model.bin"),
            is_ignored_buffer,
        )
        .unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
    }

    #[test]
    fn legacy_format_gets_a_hint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.bin");
        std::fs::write(&path, b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.").unwrap();
        let err = read_torch_bin(&path, is_ignored_buffer)
            .unwrap_err()
            .to_string();
        assert!(err.contains("legacy"), "{err}");
    }

    #[test]
    fn view_at_an_offset_of_a_shared_storage() {
        let values: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let pkl = state_dict_pickle(
            "w",
            &tensor_ops("FloatStorage", "0", 8, 2, &[2, 3], &[3, 1]),
        );
        let tensors = read_checkpoint(&pkl, &[("0", &f32_bytes(&values))]).unwrap();
        assert_eq!(tensors.len(), 1);
        assert_eq!(tensors[0].0, "w");
        assert_eq!(tensors[0].1.dtype(), DType::F32);
        assert_eq!(tensors[0].1.shape(), &[2, 3]);
        assert_eq!(tensors[0].1.to_f32(), &values[2..]);
    }

    #[test]
    fn nested_state_dict_is_found() {
        // {"epoch": 3, "state_dict": {"w": tensor}}
        let mut pkl = b"\x80\x02}(".to_vec();
        pkl.extend(short_str("epoch"));
        pkl.extend(b"K\x03");
        pkl.extend(short_str("state_dict"));
        pkl.extend(b"}");
        pkl.extend(short_str("w"));
        pkl.extend(tensor_ops("BFloat16Storage", "0", 2, 0, &[2], &[1]));
        pkl.extend(b"su.");
        let tensors = read_checkpoint(&pkl, &[("0", &[0x80, 0x3f, 0x00, 0x40])]).unwrap();
        assert_eq!(tensors.len(), 1);
        assert_eq!(tensors[0].1.dtype(), DType::BF16);
        assert_eq!(tensors[0].1.to_f32(), vec![1.0, 2.0]);
    }

    #[test]
    fn non_contiguous_tensor_is_rejected() {
        let pkl = state_dict_pickle(
            "w",
            &tensor_ops("FloatStorage", "0", 6, 0, &[2, 3], &[1, 2]),
        );
        let err = read_checkpoint(&pkl, &[("0", &[0; 24])]).unwrap_err();
        let Error::Tensor { tensor, msg, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(tensor, "w");
        assert!(msg.contains("contiguous"), "{err}");
    }

    #[test]
    fn short_storage_is_truncated() {
        let pkl = state_dict_pickle("w", &tensor_ops("HalfStorage", "0", 4, 0, &[4], &[1]));
        let err = read_checkpoint(&pkl, &[("0", &[0; 6])]).unwrap_err();
        let Error::Tensor { tensor, msg, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(tensor, "w");
        assert!(msg.contains("truncated"), "{err}");
    }

    /// A `{a: tensor, b: tensor}` pickle.
    fn two_tensor_pickle(a: &[u8], b: &[u8]) -> Vec<u8> {
        let mut p = b"\x80\x02}(".to_vec();
        p.extend(short_str("a"));
        p.extend(a);
        p.extend(short_str("b"));
        p.extend(b);
        p.extend(b"u.");
        p
    }

    fn tensor_msg(err: &Error) -> (&str, &str) {
        let Error::Tensor { tensor, msg, .. } = err else {
            panic!("{err}");
        };
        (tensor, msg)
    }

    /// A storage read as two types or sizes, or whose entry holds another number of bytes than
    /// its elements take, is an error naming the tensor; one storage shared alike is not.
    #[test]
    fn storages_are_read_as_torch_wrote_them() {
        let floats = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
        let ok = two_tensor_pickle(
            &tensor_ops("FloatStorage", "0", 4, 0, &[2], &[1]),
            &tensor_ops("FloatStorage", "0", 4, 2, &[2], &[1]),
        );
        let tensors = read_checkpoint(&ok, &[("0", &floats)]).unwrap();
        assert_eq!(tensors[1].1.to_f32(), vec![3.0, 4.0]);
        let punned = two_tensor_pickle(
            &tensor_ops("FloatStorage", "0", 4, 0, &[2], &[1]),
            &tensor_ops("HalfStorage", "0", 8, 0, &[8], &[1]),
        );
        let err = read_checkpoint(&punned, &[("0", &floats)]).unwrap_err();
        let (tensor, msg) = tensor_msg(&err);
        assert_eq!(tensor, "b");
        assert!(
            msg.contains("as torch.HalfStorage of 8 elements")
                && msg.contains("torch.FloatStorage of 4"),
            "{err}"
        );
        let oversized = state_dict_pickle("w", &tensor_ops("FloatStorage", "0", 2, 0, &[2], &[1]));
        let err = read_checkpoint(&oversized, &[("0", &floats)]).unwrap_err();
        assert!(
            tensor_msg(&err)
                .1
                .contains("holds 16 bytes, not the 2 elements"),
            "{err}"
        );
    }

    /// Zip entries are what their two headers agree on, each name once.
    #[test]
    fn zip_entries_are_checked_against_each_other() {
        let floats = f32_bytes(&[1.0, 2.0]);
        let pkl = state_dict_pickle("w", &tensor_ops("FloatStorage", "0", 2, 0, &[2], &[1]));
        let dir = tempfile::tempdir().unwrap();
        let good = std::fs::read(write_checkpoint(
            dir.path(),
            &pkl,
            &[("0", &floats), ("1", &floats)],
        ))
        .unwrap();
        let replace = |bytes: &[u8], from: &[u8], to: &[u8], count: usize| {
            let mut out = bytes.to_vec();
            let mut done = 0;
            let mut i = 0;
            while done < count && i + from.len() <= out.len() {
                if &out[i..i + from.len()] == from {
                    out[i..i + from.len()].copy_from_slice(to);
                    done += 1;
                }
                i += 1;
            }
            assert_eq!(done, count);
            out
        };
        let read = |bytes: Vec<u8>| {
            let path = dir.path().join("mutant.bin");
            std::fs::write(&path, bytes).unwrap();
            read_torch_bin(&path, is_ignored_buffer)
                .unwrap_err()
                .to_string()
        };
        // Both headers of entry 1 renamed to entry 0's name.
        let twice = replace(&good, b"archive/data/1", b"archive/data/0", 2);
        let err = read(twice);
        assert!(err.contains("two entries of one name"), "{err}");
        // The local header alone renamed.
        let local = replace(&good, b"archive/data/1", b"archive/data/2", 1);
        let err = read(local);
        assert!(
            err.contains("`archive/data/1`: the local header names it `archive/data/2`"),
            "{err}"
        );
    }

    #[test]
    fn unsupported_dtype_is_a_tensor_error() {
        let pkl = state_dict_pickle("w", &tensor_ops("DoubleStorage", "0", 1, 0, &[1], &[1]));
        let err = read_checkpoint(&pkl, &[("0", &[0; 8])]).unwrap_err();
        assert!(
            matches!(&err, Error::Tensor { tensor, .. } if tensor == "w"),
            "{err}"
        );
        assert!(err.to_string().contains("DoubleStorage"), "{err}");
    }

    #[test]
    fn missing_data_entry_is_an_error() {
        let pkl = state_dict_pickle("w", &tensor_ops("FloatStorage", "7", 1, 0, &[1], &[1]));
        let err = read_checkpoint(&pkl, &[("0", &[0; 4])]).unwrap_err();
        let (tensor, msg) = tensor_msg(&err);
        assert_eq!(tensor, "w", "the tensor whose storage it is is named");
        assert!(msg.contains("missing zip entry `archive/data/7`"), "{err}");
    }

    /// A pickle past any state dict's size is refused before it is interpreted (its values
    /// would take ~100-200 times its bytes).
    #[test]
    fn an_oversized_data_pkl_is_refused_unread() {
        let mut pkl = state_dict_pickle("w", &tensor_ops("FloatStorage", "0", 1, 0, &[1], &[1]));
        pkl.resize(MAX_PICKLE_BYTES + 1, b'N'); // NONE opcodes past the STOP
        let err = read_checkpoint(&pkl, &[("0", &[0; 4])]).unwrap_err();
        assert!(err.to_string().contains("more than the"), "{err}");
    }

    /// A weight that is not a plain tensor is named where it is read, not reported missing; a
    /// non-tensor entry of another name is skipped.
    #[test]
    fn a_weight_the_reader_cannot_build_is_named() {
        let err = read_checkpoint(&state_dict_pickle("h.0.mlp.fc_in.weight", b"K\x05"), &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("h.0.mlp.fc_in.weight") && err.contains("not as a plain tensor"),
            "{err}"
        );
        let err = read_checkpoint(&state_dict_pickle("step_count", b"K\x05"), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("no tensors found"), "{err}");
    }

    #[test]
    fn missing_data_pkl_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.bin");
        let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
        zip.start_file(
            "archive/other.pkl",
            zip::write::SimpleFileOptions::default(),
        )
        .unwrap();
        zip.finish().unwrap();
        let err = read_torch_bin(&path, is_ignored_buffer).unwrap_err();
        assert!(err.to_string().contains("data.pkl"), "{err}");
    }

    #[test]
    fn compressed_entry_is_rejected() {
        let pkl = state_dict_pickle("w", &tensor_ops("FloatStorage", "0", 1, 0, &[1], &[1]));
        let dir = tempfile::tempdir().unwrap();
        let path = write_checkpoint(dir.path(), &pkl, &[("0", &[0; 4])]);
        // Mark every entry deflated in both its local and its central-directory header.
        let mut bytes = std::fs::read(&path).unwrap();
        for i in 0..bytes.len() - 12 {
            if bytes[i..i + 4] == *b"PK\x03\x04" {
                bytes[i + 8] = 8;
            } else if bytes[i..i + 4] == *b"PK\x01\x02" {
                bytes[i + 10] = 8;
            }
        }
        std::fs::write(&path, bytes).unwrap();
        let err = read_torch_bin(&path, is_ignored_buffer).unwrap_err();
        assert!(matches!(err, Error::Checkpoint { .. }), "{err}");
        assert!(err.to_string().contains("compressed"), "{err}");
    }

    #[test]
    fn duplicate_names_are_rejected() {
        let tensor = tensor_ops("FloatStorage", "0", 1, 0, &[1], &[1]);
        let mut pkl = b"\x80\x02}(".to_vec();
        for _ in 0..2 {
            pkl.extend(short_str("w"));
            pkl.extend(&tensor);
        }
        pkl.extend(b"u.");
        let err = read_checkpoint(&pkl, &[("0", &[0; 4])]).unwrap_err();
        assert!(err.to_string().contains("`w` appears twice"), "{err}");
    }

    #[test]
    fn malformed_pickles_are_errors() {
        let cases: [(&[u8], &str); 7] = [
            (b"\x80\x02\xff", "unsupported pickle opcode 0xff"),
            (b"\x80\x02s.", "stack underflow"),
            (b"\x80\x02t.", "no MARK"),
            (b"\x80\x02}", "without a STOP"),
            (b"\x80\x02K\x01Q.", "bad persistent id"),
            (b"\x80\x02h\x05.", "memo entry 5"),
            (b"\x80\x02X\xff\xff\xff\xff", "truncated"),
        ];
        for (pkl, want) in cases {
            let err = Unpickler::new(pkl).run().unwrap_err();
            assert!(err.contains(want), "{pkl:?}: {err}");
        }
    }

    /// A checkpoint whose byteorder entry says "big" is refused (its values would be read
    /// byte-swapped); one that says "little" reads.
    #[test]
    fn a_big_endian_checkpoint_is_refused() {
        let pkl = state_dict_pickle("w", &tensor_ops("FloatStorage", "0", 1, 0, &[1], &[1]));
        let data = f32_bytes(&[1.5]);
        // The entry is "little" exactly: a prefix of it or more after it is not.
        for order in ["little", "big", "lit", "little\n"] {
            let dir = tempfile::tempdir().unwrap();
            let path = write_zip(
                dir.path(),
                &[
                    ("archive/byteorder".into(), order.as_bytes()),
                    ("archive/data.pkl".into(), &pkl[..]),
                    ("archive/data/0".into(), &data[..]),
                ],
            );
            match read_torch_bin(&path, is_ignored_buffer) {
                Ok(tensors) => {
                    assert_eq!(order, "little");
                    assert_eq!(tensors[0].1.to_f32(), [1.5]);
                }
                Err(e) => {
                    assert_ne!(order, "little", "{e}");
                    let want = format!("byte order is `{order}`");
                    assert!(e.to_string().contains(&want), "{e}");
                }
            }
        }
    }

    /// A local header that disagrees with the central directory on compression (deflated there,
    /// stored here) is refused: another zip reader would inflate the bytes this one maps raw.
    #[test]
    fn a_local_header_that_says_compressed_is_refused() {
        let pkl = state_dict_pickle("w", &tensor_ops("FloatStorage", "0", 1, 0, &[1], &[1]));
        let dir = tempfile::tempdir().unwrap();
        let path = write_checkpoint(dir.path(), &pkl, &[("0", &[0; 4])]);
        let mut bytes = std::fs::read(&path).unwrap();
        let local = bytes.windows(4).rposition(|w| w == b"PK\x03\x04").unwrap();
        bytes[local + 8] = 8;
        std::fs::write(&path, bytes).unwrap();
        let err = read_torch_bin(&path, is_ignored_buffer)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "`archive/data/0`: the local header says compression method 8, the central \
                 directory stored (0)"
            ),
            "{err}"
        );
    }

    /// A dimension of size 1 may have any stride (torch gives a transposed [3, 1] column, a
    /// [1, 3] row, the stride [1, 1]): such a tensor is row-major all the same.
    #[test]
    fn a_size_one_dimension_may_have_any_stride() {
        let values = [1.0f32, 2.0, 3.0];
        for stride in [[1, 1], [7, 1]] {
            let tensor = tensor_ops("FloatStorage", "0", 3, 0, &[1, 3], &stride);
            let tensors = read_checkpoint(
                &state_dict_pickle("w", &tensor),
                &[("0", &f32_bytes(&values))],
            )
            .unwrap();
            assert_eq!(tensors[0].1.shape(), &[1, 3]);
            assert_eq!(tensors[0].1.to_f32(), values);
        }
    }

    /// Protocol 4's STACK_GLOBAL (the module, then the name, on the stack) finds
    /// _rebuild_tensor_v2 as GLOBAL does (`torch.save(..., pickle_protocol=4)` writes it).
    #[test]
    fn stack_global_takes_the_module_then_the_name() {
        let values = [1.0f32, 2.0];
        let tensor = tensor_ops("FloatStorage", "0", 2, 0, &[2], &[1]);
        let global = b"ctorch._utils\n_rebuild_tensor_v2\n";
        assert!(tensor.starts_with(global));
        let mut stacked = short_str("torch._utils");
        stacked.extend(short_str("_rebuild_tensor_v2"));
        stacked.push(0x93);
        stacked.extend(&tensor[global.len()..]);
        let tensors = read_checkpoint(
            &state_dict_pickle("w", &stacked),
            &[("0", &f32_bytes(&values))],
        )
        .unwrap();
        assert_eq!(tensors[0].1.to_f32(), values);
    }

    /// LONG1 integers are little-endian two's complement: a negative one is read negative (and
    /// then refused as a size or offset), not as a large positive one.
    #[test]
    fn long_integers_keep_their_sign() {
        for (pkl, want) in [
            (&b"\x80\x02\x8a\x01\xff."[..], -1),
            (b"\x80\x02\x8a\x02\x00\x80.", -32768),
            (b"\x80\x02\x8a\x02\xff\x00.", 255),
            (b"\x80\x02\x8a\x00.", 0),
        ] {
            let mut unpickler = Unpickler::new(pkl);
            let root = unpickler.run().unwrap();
            assert!(
                matches!(unpickler.values[root], Value::Int(v) if v == want),
                "{pkl:?}"
            );
        }
    }

    /// Pickle protocols up to 5 (Python 3.8's highest) are read; 6 is refused by name.
    #[test]
    fn pickle_protocols_up_to_5_are_read() {
        for version in 0..=5u8 {
            let pkl = [0x80, version, b'N', b'.'];
            assert!(Unpickler::new(&pkl).run().is_ok(), "protocol {version}");
        }
        let err = Unpickler::new(b"\x80\x06N.").run().unwrap_err();
        assert!(err.contains("unsupported pickle protocol 6"), "{err}");
    }

    /// MEMOIZE (protocol 4) stores the top of the stack under the next memo key, counted from
    /// 0, which BINGET then reads back.
    #[test]
    fn memoize_numbers_its_entries_from_zero() {
        let pkl = b"\x80\x04K\x07\x94K\x08\x940h\x00h\x01\x86.";
        let mut unpickler = Unpickler::new(pkl);
        let root = unpickler.run().unwrap();
        let Value::Tuple(items) = &unpickler.values[root] else {
            panic!("{}", unpickler.values[root].kind());
        };
        let ints: Vec<i64> = items
            .iter()
            .map(|&i| match unpickler.values[i] {
                Value::Int(v) => v,
                _ => panic!("{}", unpickler.values[i].kind()),
            })
            .collect();
        assert_eq!(ints, [7, 8]);
    }

    /// A data.pkl of exactly the limit is read (the limit is the largest read, not the first
    /// refused).
    #[test]
    fn a_data_pkl_of_exactly_the_limit_is_read() {
        let mut pkl = state_dict_pickle("w", &tensor_ops("FloatStorage", "0", 1, 0, &[1], &[1]));
        pkl.resize(MAX_PICKLE_BYTES, b'N'); // NONE opcodes past the STOP
        let tensors = read_checkpoint(&pkl, &[("0", &f32_bytes(&[2.5]))]).unwrap();
        assert_eq!(tensors[0].1.to_f32(), [2.5]);
    }

    /// Pickles that would index past the stack, a MARK or an integer's 8 bytes are errors, not
    /// panics; so are a BUILD with no object under its state, a persistent id not tagged
    /// 'storage' and a negative BINSTRING length.
    #[test]
    fn malformed_pickles_at_the_bounds_are_errors() {
        let mut bad_tag = b"\x80\x02(".to_vec();
        bad_tag.extend(short_str("blob"));
        bad_tag.extend(b"ctorch\nFloatStorage\n");
        bad_tag.extend(short_str("0"));
        bad_tag.extend(short_str("cpu"));
        bad_tag.extend(b"K\x01tQ.");
        let cases: [(&[u8], &str); 6] = [
            // TUPLE2 over one item
            (b"\x80\x02K\x01\x86.", "stack underflow"),
            // the MARK's items popped before TUPLE
            (b"\x80\x02N(0t.", "stack underflow below MARK"),
            (
                b"\x80\x02\x8a\x09\x01\x02\x03\x04\x05\x06\x07\x08\x09.",
                "9-byte integer",
            ),
            // BUILD's state with no object under it
            (b"\x80\x02Nb}.", "stack underflow"),
            (b"\x80\x02T\xff\xff\xff\xff", "negative string length"),
            (&bad_tag, "bad persistent id"),
        ];
        for (pkl, want) in cases {
            let err = Unpickler::new(pkl).run().unwrap_err();
            assert!(err.contains(want), "{pkl:?}: {err}");
        }
    }

    /// The int an integer pickle reads as.
    fn int_of(pkl: &[u8]) -> i64 {
        let mut unpickler = Unpickler::new(pkl);
        let root = unpickler.run().unwrap();
        match unpickler.values[root] {
            Value::Int(v) => v,
            _ => panic!("{pkl:?}: {}", unpickler.values[root].kind()),
        }
    }

    /// BININT is a signed 32-bit int, BININT2 an unsigned 16-bit one (as in CPython).
    #[test]
    fn fixed_width_integers_are_read_as_cpython_writes_them() {
        assert_eq!(int_of(b"\x80\x02J\xff\xff\xff\xff."), -1);
        assert_eq!(int_of(b"\x80\x02J\x00\x00\x01\x00."), 65536);
        assert_eq!(int_of(b"\x80\x02M\xff\xff."), 65535);
    }

    /// Protocol 4's long forms are read whole: FRAME's 8-byte length, BINUNICODE8's 8-byte
    /// length and LONG_BINPUT/LONG_BINGET's 4-byte memo keys (GPT-J 6B's pickle memoises
    /// past key 255).
    #[test]
    fn protocol_4_long_forms_are_read_whole() {
        let mut pkl = b"\x80\x04\x95".to_vec();
        pkl.extend(25u64.to_le_bytes());
        pkl.push(0x8d);
        pkl.extend(3u64.to_le_bytes());
        pkl.extend(b"abc");
        // LONG_BINPUT 300, POP, LONG_BINGET 300
        pkl.extend(b"r\x2c\x01\x00\x000j\x2c\x01\x00\x00.");
        let mut unpickler = Unpickler::new(&pkl);
        let root = unpickler.run().unwrap();
        assert!(
            matches!(&unpickler.values[root], Value::Str(s) if &**s == "abc"),
            "{}",
            unpickler.values[root].kind()
        );
    }

    /// Appends and set-items on an object the reader does not build (the result of a callable
    /// it does not know) are dropped: that object is never looked into.
    #[test]
    fn items_added_to_an_opaque_object_are_dropped() {
        let pkl = b"\x80\x02cmod\nThing\n)R(K\x01K\x02eK\x03aK\x04K\x05s.";
        let mut unpickler = Unpickler::new(pkl);
        let root = unpickler.run().unwrap();
        assert!(matches!(unpickler.values[root], Value::Object));
    }

    /// The arena holds fewer than `pickle::MAX_VALUES` (2^18) values, the power of two its
    /// doubling stops at: one less is read, that many are refused.
    #[test]
    fn the_value_cap_is_exact() {
        const MAX_VALUES: usize = 1 << 18;
        for (n, ok) in [(MAX_VALUES - 1, true), (MAX_VALUES, false)] {
            let mut pkl = b"\x80\x02".to_vec();
            pkl.resize(2 + n, b'N');
            pkl.push(b'.');
            let result = Unpickler::new(&pkl).run();
            assert_eq!(result.is_ok(), ok, "{n} values: {:?}", result.err());
        }
    }

    /// A weight pickled as an nn.Parameter (`_rebuild_parameter(tensor, requires_grad,
    /// hooks)`) reads as its tensor.
    #[test]
    fn a_parameter_reads_as_its_tensor() {
        let mut p = b"ctorch._utils\n_rebuild_parameter\n(".to_vec();
        p.extend(tensor_ops("FloatStorage", "0", 2, 0, &[2], &[1]));
        p.extend(b"\x89ccollections\nOrderedDict\n)RtR");
        let tensors = read_checkpoint(
            &state_dict_pickle("w", &p),
            &[("0", &f32_bytes(&[1.0, 2.0]))],
        )
        .unwrap();
        assert_eq!(tensors[0].1.to_f32(), [1.0, 2.0]);
    }

    /// `_rebuild_tensor_v2` with fewer than 4 arguments (no stride) is an error, not an index
    /// past its arguments.
    #[test]
    fn a_rebuild_without_a_stride_is_an_error() {
        let mut p = b"ctorch._utils\n_rebuild_tensor_v2\n((".to_vec();
        p.extend(short_str("storage"));
        p.extend(b"ctorch\nFloatStorage\n");
        p.extend(short_str("0"));
        p.extend(short_str("cpu"));
        // storage, offset 0, size (1,)
        p.extend(b"K\x01tQK\x00(K\x01ttR");
        let err = read_checkpoint(&state_dict_pickle("w", &p), &[("0", &[0; 4])]).unwrap_err();
        assert!(err.to_string().contains("fewer than 4"), "{err}");
    }

    /// A negative offset is refused as the bad argument it is, not read as a huge one.
    #[test]
    fn a_negative_offset_is_named_as_such() {
        let tensor = tensor_ops("FloatStorage", "0", 1, 0, &[1], &[1]);
        let at = tensor.windows(4).position(|w| w == b"QK\x00(").unwrap();
        let mut p = tensor[..at + 1].to_vec();
        p.extend(b"J\xff\xff\xff\xff");
        p.extend(&tensor[at + 3..]);
        let err = read_checkpoint(&state_dict_pickle("w", &p), &[("0", &[0; 4])]).unwrap_err();
        assert!(
            err.to_string()
                .contains("bad _rebuild_tensor_v2 arguments: offset"),
            "{err}"
        );
    }

    /// A tensor may have torch's 64 dimensions, not 65.
    #[test]
    fn sixty_four_dimensions_are_read_not_sixty_five() {
        let one = f32_bytes(&[3.0]);
        let ok = tensor_ops("FloatStorage", "0", 1, 0, &[1; 64], &[1; 64]);
        let tensors = read_checkpoint(&state_dict_pickle("w", &ok), &[("0", &one)]).unwrap();
        assert_eq!(tensors[0].1.shape(), [1; 64]);
        let over = tensor_ops("FloatStorage", "0", 1, 0, &[1; 65], &[1; 65]);
        let err = read_checkpoint(&state_dict_pickle("w", &over), &[("0", &one)]).unwrap_err();
        assert!(
            err.to_string()
                .contains("bad _rebuild_tensor_v2 arguments: size"),
            "{err}"
        );
    }

    /// Only a dict under the key "state_dict" is a nested state dict: another dict beside the
    /// tensors leaves the top-level dict the state dict.
    #[test]
    fn a_dict_beside_the_tensors_is_not_the_state_dict() {
        let mut pkl = b"\x80\x02}(".to_vec();
        pkl.extend(short_str("w"));
        pkl.extend(tensor_ops("FloatStorage", "0", 1, 0, &[1], &[1]));
        pkl.extend(short_str("meta"));
        pkl.extend(b"}u.");
        let tensors = read_checkpoint(&pkl, &[("0", &f32_bytes(&[4.0]))]).unwrap();
        assert_eq!(tensors.len(), 1);
        assert_eq!(tensors[0].1.to_f32(), [4.0]);
    }

    /// A stride shorter than the size is refused, not read as row-major over its first
    /// dimensions.
    #[test]
    fn a_stride_shorter_than_the_size_is_refused() {
        let pkl = state_dict_pickle("w", &tensor_ops("FloatStorage", "0", 6, 0, &[2, 3], &[1]));
        let err = read_checkpoint(&pkl, &[("0", &[0; 24])]).unwrap_err();
        assert!(tensor_msg(&err).1.contains("different lengths"), "{err}");
    }

    /// torch gives an empty [3, 0] tensor the stride [1, 1]: a tensor with no elements is
    /// contiguous whatever its strides.
    #[test]
    fn an_empty_tensor_reads_whatever_its_strides() {
        let pkl = state_dict_pickle(
            "w",
            &tensor_ops("FloatStorage", "0", 0, 0, &[3, 0], &[1, 1]),
        );
        let tensors = read_checkpoint(&pkl, &[("0", &[])]).unwrap();
        assert_eq!(tensors[0].1.shape(), [3, 0]);
    }

    /// Where the zip header of entry `name` (signature `sig`, its name at `name_at`) starts.
    fn zip_header(bytes: &[u8], sig: &[u8; 4], name_at: usize, name: &[u8]) -> usize {
        (0..bytes.len() - name_at - name.len())
            .find(|&i| &bytes[i..i + 4] == sig && &bytes[i + name_at..][..name.len()] == name)
            .unwrap()
    }

    /// An entry whose recorded size reaches over the next entry's bytes is refused by name
    /// before any storage is read (two tensors would read the same bytes).
    #[test]
    fn entries_whose_bytes_overlap_are_refused() {
        let pkl = state_dict_pickle("w", &tensor_ops("FloatStorage", "0", 1, 0, &[1], &[1]));
        let dir = tempfile::tempdir().unwrap();
        let path = write_checkpoint(dir.path(), &pkl, &[("0", &[0; 4]), ("1", &[0; 4])]);
        let mut bytes = std::fs::read(&path).unwrap();
        // Entry 0's central sizes (compressed, uncompressed) grown over entry 1.
        let at = zip_header(&bytes, b"PK\x01\x02", 46, b"archive/data/0");
        for field in [20, 24] {
            bytes[at + field..at + field + 4].copy_from_slice(&100u32.to_le_bytes());
        }
        std::fs::write(&path, bytes).unwrap();
        let err = read_torch_bin(&path, is_ignored_buffer).unwrap_err();
        assert!(
            err.to_string()
                .contains("zip entries `archive/data/0` and `archive/data/1` share bytes"),
            "{err}"
        );
    }

    /// An entry flagged encrypted is refused as such, even where its bytes match its CRC-32.
    #[test]
    fn an_entry_flagged_encrypted_is_refused() {
        let pkl = state_dict_pickle("w", &tensor_ops("FloatStorage", "0", 1, 0, &[1], &[1]));
        let dir = tempfile::tempdir().unwrap();
        let path = write_checkpoint(dir.path(), &pkl, &[("0", &[0; 4])]);
        let mut bytes = std::fs::read(&path).unwrap();
        // Bit 0 of the general purpose flags, in the local and the central header.
        let local = zip_header(&bytes, b"PK\x03\x04", 30, b"archive/data/0");
        bytes[local + 6] |= 1;
        let central = zip_header(&bytes, b"PK\x01\x02", 46, b"archive/data/0");
        bytes[central + 8] |= 1;
        std::fs::write(&path, bytes).unwrap();
        let err = read_torch_bin(&path, is_ignored_buffer).unwrap_err();
        assert!(
            err.to_string()
                .contains("entry `archive/data/0` is encrypted"),
            "{err}"
        );
    }

    /// The ints of a pickle whose root is a tuple of ints.
    fn ints_of_tuple(pkl: &[u8]) -> Vec<i64> {
        let mut unpickler = Unpickler::new(pkl);
        let root = unpickler.run().unwrap();
        let Value::Tuple(items) = &unpickler.values[root] else {
            panic!("{pkl:?}: {}", unpickler.values[root].kind());
        };
        items
            .iter()
            .map(|&i| match unpickler.values[i] {
                Value::Int(v) => v,
                _ => panic!("{pkl:?}: {}", unpickler.values[i].kind()),
            })
            .collect()
    }

    /// BININT1 is unsigned, LONG4 has a 4-byte length, and LONG1 holds up to 8 bytes (an 8-byte
    /// one is the widest i64, not refused).
    #[test]
    fn integers_are_read_at_every_width() {
        assert_eq!(int_of(b"\x80\x02K\xff."), 255);
        assert_eq!(int_of(b"\x80\x02M\x00\x01."), 256);
        assert_eq!(int_of(b"\x80\x02\x8b\x02\x00\x00\x00\x00\x80."), -32768);
        let mut pkl = b"\x80\x02\x8a\x08".to_vec();
        pkl.extend(i64::MIN.to_le_bytes());
        pkl.push(b'.');
        assert_eq!(int_of(&pkl), i64::MIN);
    }

    /// Values the reader keeps no content of (a float, bytes) still consume their whole width:
    /// BINFLOAT's 8 bytes, BINBYTES8's 8-byte length and what it counts.
    #[test]
    fn skipped_scalars_consume_their_whole_width() {
        let mut pkl = b"\x80\x04G".to_vec();
        pkl.extend(1.5f64.to_be_bytes());
        pkl.extend(b"0\x8e");
        pkl.extend(3u64.to_le_bytes());
        pkl.extend(b"\x00\x00\x00");
        pkl.extend(b"0C\x02\x00\x000K\x07.");
        assert_eq!(int_of(&pkl), 7);
    }

    /// TUPLE3 keeps its items in order, DUP pushes the top again, POP_MARK drops what lies above
    /// its MARK, and an empty MARK builds an empty tuple or sets no item.
    #[test]
    fn stack_opcodes_have_cpythons_effects() {
        for (pkl, want) in [
            (&b"\x80\x02K\x01K\x02K\x03\x87."[..], &[1, 2, 3][..]),
            (b"\x80\x02K\x052\x86.", &[5, 5]),
            (b"\x80\x02K\x01(K\x02K\x031\x85.", &[1]),
            (b"\x80\x02(t.", &[]),
            (b"\x80\x02K\x04}(u0\x85.", &[4]),
        ] {
            assert_eq!(ints_of_tuple(pkl), want, "{pkl:?}");
        }
    }

    /// APPEND onto anything but a list (or an opaque object) is an error, not dropped.
    #[test]
    fn appending_to_a_dict_is_an_error() {
        let err = Unpickler::new(b"\x80\x02}K\x01a.").run().unwrap_err();
        assert!(err.contains("append to a dict"), "{err}");
    }

    /// An OrderedDict called with items (not what torch.save writes) is not built: it is an
    /// opaque object, refused as the state dict, not read as an empty dict.
    #[test]
    fn an_ordered_dict_built_from_items_is_refused_as_opaque() {
        let pkl = b"\x80\x02ccollections\nOrderedDict\n(]tR.";
        let err = read_checkpoint(pkl, &[]).unwrap_err().to_string();
        assert!(
            err.contains("the pickled object is an opaque object, not a dict of tensors"),
            "{err}"
        );
    }

    /// The archive's folder is the one that holds data.pkl, whatever entry comes first.
    #[test]
    fn the_archive_folder_is_the_one_holding_data_pkl() {
        let pkl = state_dict_pickle("w", &tensor_ops("FloatStorage", "0", 1, 0, &[1], &[1]));
        let data = f32_bytes(&[6.5]);
        let dir = tempfile::tempdir().unwrap();
        let path = write_zip(
            dir.path(),
            &[
                ("notes/readme".into(), &b"hello"[..]),
                ("ckpt/data.pkl".into(), &pkl[..]),
                ("ckpt/data/0".into(), &data[..]),
            ],
        );
        let tensors = read_torch_bin(&path, is_ignored_buffer).unwrap();
        assert_eq!(tensors[0].1.to_f32(), [6.5]);
    }

    /// One storage is one type and size: read as float16 and bfloat16 (one width, so its bytes
    /// fit both) or as two element counts, the second tensor is refused naming both readings.
    #[test]
    fn one_storage_read_two_ways_is_refused_naming_both() {
        let bytes = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
        for (second, says) in [
            (
                tensor_ops("BFloat16Storage", "0", 8, 0, &[8], &[1]),
                "as torch.BFloat16Storage of 8 elements, which an earlier tensor reads as \
                 torch.HalfStorage of 8",
            ),
            (
                tensor_ops("HalfStorage", "0", 4, 0, &[4], &[1]),
                "as torch.HalfStorage of 4 elements, which an earlier tensor reads as \
                 torch.HalfStorage of 8",
            ),
        ] {
            let pkl = two_tensor_pickle(&tensor_ops("HalfStorage", "0", 8, 0, &[8], &[1]), &second);
            let err = read_checkpoint(&pkl, &[("0", &bytes)]).unwrap_err();
            let (tensor, msg) = tensor_msg(&err);
            assert_eq!(tensor, "b");
            assert!(msg.contains(says), "{err}");
        }
    }

    /// A bias that is not a plain tensor is named, as a weight is.
    #[test]
    fn a_bias_the_reader_cannot_build_is_named() {
        let err =
            read_checkpoint(&state_dict_pickle("h.0.mlp.fc_in.bias", b"K\x05"), &[]).unwrap_err();
        let (tensor, msg) = tensor_msg(&err);
        assert_eq!(tensor, "h.0.mlp.fc_in.bias");
        assert!(msg.contains("not as a plain tensor"), "{err}");
    }

    /// A view past its storage's element count is refused as such, though the storage's entry
    /// holds what that count takes.
    #[test]
    fn a_view_past_its_storage_is_refused_by_its_element_count() {
        let pkl = state_dict_pickle("w", &tensor_ops("FloatStorage", "0", 2, 1, &[2], &[1]));
        let err = read_checkpoint(&pkl, &[("0", &f32_bytes(&[1.0, 2.0]))]).unwrap_err();
        let (tensor, msg) = tensor_msg(&err);
        assert_eq!(tensor, "w");
        assert!(
            msg.contains("elements 1..3 lie past the end of its storage of 2 elements"),
            "{err}"
        );
    }

    /// Sizes whose element count, offsets whose end, or offsets whose byte position pass 2^64
    /// are errors naming the tensor, not overflows.
    #[test]
    fn element_counts_and_offsets_past_u64_are_errors() {
        let big = 1u64 << 32;
        let quarter = (1u64 << 62) - 1;
        for (offset, size, stride) in [
            // 2^64 elements
            (0, vec![big, big], vec![big, 1]),
            // 2^64 - 4 elements from element 4
            (4, vec![quarter, 4], vec![4, 1]),
            // element 2^62 is at byte 2^64
            (1 << 62, vec![1], vec![1]),
        ] {
            let pkl = state_dict_pickle(
                "w",
                &wide_tensor_ops("FloatStorage", "0", 1, offset, &size, &stride),
            );
            let err = read_checkpoint(&pkl, &[("0", &f32_bytes(&[1.0]))]).unwrap_err();
            let (tensor, msg) = tensor_msg(&err);
            assert_eq!(tensor, "w");
            assert_eq!(msg, "size overflows", "{offset} {size:?}");
        }
    }
}
