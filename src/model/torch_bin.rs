//! Reads PyTorch checkpoints (`pytorch_model.bin`) without Python.
//!
//! Since PyTorch 1.6, `torch.save` writes a zip archive: `<archive>/data.pkl` is a pickle of the
//! state dict in which every tensor refers to a storage by key, and `<archive>/data/<key>` holds
//! that storage's raw little-endian bytes, uncompressed. This module lists the zip entries, runs
//! a small pickle interpreter over `data.pkl` that only builds data (it never calls or imports
//! anything), and returns each tensor as a view into the memory-mapped file.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Cursor;
use std::ops::Range;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::{Error, Result};
use crate::model::tensor::{DType, Tensor};

/// Reads every tensor of a torch.save zip checkpoint, memory-mapped.
///
/// Returns (name, Tensor) in file order. The buffers that old GPT-J checkpoints carry but that are
/// not weights (`*.attn.bias`, a bool causal mask, and `*.attn.masked_bias`, a scalar) are left
/// out here, so their dtypes need no support. Entries of the state dict that are not tensors are
/// skipped too. Only float16, float32 and bfloat16 tensors with row-major strides are read.
pub fn read_torch_bin(path: &Path) -> Result<Vec<(String, Tensor)>> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    // SAFETY: the map is read-only; as with every memory-mapped checkpoint, the file must not be
    // truncated or rewritten by another process while the returned tensors are alive.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
    let map = Arc::new(map);

    let zip = ZipIndex::read(path, &map)?;
    let archive = zip.archive_name(path)?;
    let byteorder = format!("{archive}/byteorder");
    if zip.contains(&byteorder) {
        let order = &map[zip.data(path, map.len(), &byteorder)?];
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
    let pkl = &map[zip.data(path, map.len(), &pkl_name)?];
    let mut unpickler = Unpickler::new(pkl);
    let root = unpickler
        .run()
        .map_err(|msg| checkpoint_error(path, format!("{pkl_name}: {msg}")))?;
    let items = unpickler
        .state_dict(root)
        .map_err(|msg| checkpoint_error(path, format!("{pkl_name}: {msg}")))?;

    let mut tensors = Vec::new();
    let mut seen = HashSet::new();
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
        if is_gptj_buffer(name) {
            continue;
        }
        let Value::Tensor(tensor) = &unpickler.values[value] else {
            tracing::debug!(
                "{}: skipping `{name}`, which is {} rather than a tensor",
                path.display(),
                unpickler.values[value].kind()
            );
            continue;
        };
        let mapped = map_tensor(path, &map, &zip, &archive, name, tensor)?;
        tensors.push((name.to_string(), mapped));
    }
    if tensors.is_empty() {
        return Err(checkpoint_error(path, "no tensors found in the state dict"));
    }
    Ok(tensors)
}

/// The buffers GPT-J checkpoints saved alongside the weights; no engine reads them.
fn is_gptj_buffer(name: &str) -> bool {
    ["attn.bias", "attn.masked_bias"]
        .iter()
        .any(|buffer| name == *buffer || name.ends_with(&format!(".{buffer}")))
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
    let data = zip.data(path, map.len(), &entry_name)?;
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

/// Where one zip entry's bytes lie in the file, as its headers say.
struct ZipEntry {
    data_start: u64,
    size: u64,
    compression: zip::CompressionMethod,
    encrypted: bool,
}

/// The entries of the checkpoint's zip archive, by name, in archive order.
struct ZipIndex {
    names: Vec<String>,
    entries: HashMap<String, ZipEntry>,
}

impl ZipIndex {
    /// Lists the archive's entries and where their data starts (after each local header).
    fn read(path: &Path, map: &[u8]) -> Result<Self> {
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
    fn archive_name(&self, path: &Path) -> Result<String> {
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
    fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Where an entry's bytes are in the file, after checking that it exists, is stored as-is
    /// (so that it can be mapped) and lies within the file's `file_len` bytes.
    fn data(&self, path: &Path, file_len: usize, name: &str) -> Result<Range<usize>> {
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

/// torch's own limit on a tensor's number of dimensions. Capping it keeps each tensor's shape
/// small however often a pickle re-uses one huge size tuple.
const MAX_DIMS: usize = 64;

/// Index of a value in the unpickler's arena.
type Id = usize;

/// A storage as a persistent id names it: `('storage', torch.<Class>, key, location, numel)`.
#[derive(Clone)]
struct StorageRef {
    class: Rc<str>,
    key: Rc<str>,
    numel: u64,
}

/// The arguments of `torch._utils._rebuild_tensor_v2` that locate a tensor's elements.
struct TensorRef {
    storage: StorageRef,
    offset: u64,
    size: Vec<u64>,
    stride: Vec<u64>,
}

/// A pickled value. Containers hold arena ids rather than values, so that a memoised object is
/// shared as in Python, and strings are `Rc<str>`: re-using a memoised value never copies it, so
/// memory stays proportional to the pickle's length. Scalars the reader never looks at (floats,
/// bools, bytes) keep only their kind.
enum Value {
    None,
    Bool,
    Int(i64),
    Float,
    Str(Rc<str>),
    Bytes,
    Tuple(Vec<Id>),
    List(Vec<Id>),
    Dict(Vec<(Id, Id)>),
    Global {
        module: Rc<str>,
        name: Rc<str>,
    },
    Storage(StorageRef),
    Tensor(TensorRef),
    /// Whatever calling an unrecognised global would have built; it is never looked into.
    Object,
}

impl Value {
    /// What the value is, with its article, for error messages.
    fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool => "a bool",
            Value::Int(_) => "an int",
            Value::Float => "a float",
            Value::Str(_) => "a string",
            Value::Bytes => "a bytes object",
            Value::Tuple(_) => "a tuple",
            Value::List(_) => "a list",
            Value::Dict(_) => "a dict",
            Value::Global { .. } => "a global",
            Value::Storage(_) => "a storage",
            Value::Tensor(_) => "a tensor",
            Value::Object => "an opaque object",
        }
    }
}

/// The pickle opcodes this reader understands (names as in CPython's `pickle.py`).
mod op {
    pub const MARK: u8 = b'(';
    pub const STOP: u8 = b'.';
    pub const POP: u8 = b'0';
    pub const POP_MARK: u8 = b'1';
    pub const DUP: u8 = b'2';
    pub const BINFLOAT: u8 = b'G';
    pub const BININT: u8 = b'J';
    pub const BININT1: u8 = b'K';
    pub const BININT2: u8 = b'M';
    pub const NONE: u8 = b'N';
    pub const BINPERSID: u8 = b'Q';
    pub const REDUCE: u8 = b'R';
    pub const BINSTRING: u8 = b'T';
    pub const SHORT_BINSTRING: u8 = b'U';
    pub const BINUNICODE: u8 = b'X';
    pub const APPEND: u8 = b'a';
    pub const BUILD: u8 = b'b';
    pub const GLOBAL: u8 = b'c';
    pub const DICT: u8 = b'd';
    pub const EMPTY_DICT: u8 = b'}';
    pub const APPENDS: u8 = b'e';
    pub const BINGET: u8 = b'h';
    pub const LONG_BINGET: u8 = b'j';
    pub const LIST: u8 = b'l';
    pub const EMPTY_LIST: u8 = b']';
    pub const BINPUT: u8 = b'q';
    pub const LONG_BINPUT: u8 = b'r';
    pub const SETITEM: u8 = b's';
    pub const TUPLE: u8 = b't';
    pub const EMPTY_TUPLE: u8 = b')';
    pub const SETITEMS: u8 = b'u';
    pub const BINBYTES: u8 = b'B';
    pub const SHORT_BINBYTES: u8 = b'C';
    pub const PROTO: u8 = 0x80;
    pub const NEWOBJ: u8 = 0x81;
    pub const TUPLE1: u8 = 0x85;
    pub const TUPLE2: u8 = 0x86;
    pub const TUPLE3: u8 = 0x87;
    pub const NEWTRUE: u8 = 0x88;
    pub const NEWFALSE: u8 = 0x89;
    pub const LONG1: u8 = 0x8a;
    pub const LONG4: u8 = 0x8b;
    pub const SHORT_BINUNICODE: u8 = 0x8c;
    pub const BINUNICODE8: u8 = 0x8d;
    pub const BINBYTES8: u8 = 0x8e;
    pub const STACK_GLOBAL: u8 = 0x93;
    pub const MEMOIZE: u8 = 0x94;
    pub const FRAME: u8 = 0x95;
}

/// Pickle errors are plain messages; the caller adds the file and entry names.
type PickleResult<T> = std::result::Result<T, String>;

/// Interprets the pickle opcodes torch.save emits for a state dict, building values only.
struct Unpickler<'a> {
    data: &'a [u8],
    pos: usize,
    values: Vec<Value>,
    stack: Vec<Id>,
    marks: Vec<usize>,
    memo: HashMap<u64, Id>,
}

impl<'a> Unpickler<'a> {
    /// An interpreter positioned at the first opcode of `data`.
    fn new(data: &'a [u8]) -> Self {
        Unpickler {
            data,
            pos: 0,
            values: Vec::new(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
        }
    }

    /// Runs the pickle to its STOP opcode and returns the id of the unpickled object.
    fn run(&mut self) -> PickleResult<Id> {
        loop {
            let at = self.pos;
            let op = self
                .take(1)
                .map_err(|_| "ended without a STOP opcode".to_string())?[0];
            match self.step(op) {
                Ok(Some(root)) => return Ok(root),
                Ok(None) => {}
                Err(msg) => return Err(format!("{msg} (opcode 0x{op:02x} at byte {at})")),
            }
        }
    }

    /// Executes one opcode; returns the result at STOP.
    fn step(&mut self, op: u8) -> PickleResult<Option<Id>> {
        match op {
            op::PROTO => {
                let version = self.take(1)?[0];
                if version > 5 {
                    return Err(format!("unsupported pickle protocol {version}"));
                }
            }
            // A length hint for streaming readers; the data is all here anyway.
            op::FRAME => {
                self.take(8)?;
            }
            op::STOP => return self.pop().map(Some),
            op::MARK => self.marks.push(self.stack.len()),
            op::POP => {
                self.pop()?;
            }
            op::POP_MARK => {
                self.pop_mark()?;
            }
            op::DUP => {
                let top = self.top()?;
                self.stack.push(top);
            }

            op::NONE => self.push(Value::None),
            op::NEWTRUE | op::NEWFALSE => self.push(Value::Bool),
            op::BININT => {
                let v = i32::from_le_bytes(self.array()?);
                self.push(Value::Int(v.into()));
            }
            op::BININT1 => {
                let v = self.take(1)?[0];
                self.push(Value::Int(v.into()));
            }
            op::BININT2 => {
                let v = u16::from_le_bytes(self.array()?);
                self.push(Value::Int(v.into()));
            }
            op::LONG1 | op::LONG4 => {
                let len = if op == op::LONG1 {
                    u64::from(self.take(1)?[0])
                } else {
                    u64::from(u32::from_le_bytes(self.array()?))
                };
                let bytes = self.take_u64(len)?;
                self.push(Value::Int(long_to_i64(bytes)?));
            }
            op::BINFLOAT => {
                self.take(8)?;
                self.push(Value::Float);
            }

            op::BINUNICODE
            | op::SHORT_BINUNICODE
            | op::BINUNICODE8
            | op::BINSTRING
            | op::SHORT_BINSTRING => {
                let len = match op {
                    op::SHORT_BINUNICODE | op::SHORT_BINSTRING => u64::from(self.take(1)?[0]),
                    op::BINUNICODE8 => u64::from_le_bytes(self.array()?),
                    op::BINSTRING => u64::try_from(i32::from_le_bytes(self.array()?))
                        .map_err(|_| "negative string length".to_string())?,
                    _ => u64::from(u32::from_le_bytes(self.array()?)),
                };
                let bytes = self.take_u64(len)?;
                let s = std::str::from_utf8(bytes).map_err(|_| "string is not UTF-8")?;
                self.push(Value::Str(s.into()));
            }
            op::BINBYTES | op::SHORT_BINBYTES | op::BINBYTES8 => {
                let len = match op {
                    op::SHORT_BINBYTES => u64::from(self.take(1)?[0]),
                    op::BINBYTES8 => u64::from_le_bytes(self.array()?),
                    _ => u64::from(u32::from_le_bytes(self.array()?)),
                };
                self.take_u64(len)?;
                self.push(Value::Bytes);
            }

            op::EMPTY_DICT => self.push(Value::Dict(Vec::new())),
            op::EMPTY_LIST => self.push(Value::List(Vec::new())),
            op::EMPTY_TUPLE => self.push(Value::Tuple(Vec::new())),
            op::TUPLE => {
                let items = self.pop_mark()?;
                self.push(Value::Tuple(items));
            }
            op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                let n = usize::from(op - op::TUPLE1) + 1;
                if self.stack.len() < n {
                    return Err("stack underflow".to_string());
                }
                let items = self.stack.split_off(self.stack.len() - n);
                self.push(Value::Tuple(items));
            }
            op::LIST => {
                let items = self.pop_mark()?;
                self.push(Value::List(items));
            }
            op::DICT => {
                let items = self.pop_mark()?;
                let pairs = into_pairs(&items)?;
                self.push(Value::Dict(pairs));
            }
            op::APPEND => {
                let item = self.pop()?;
                self.extend_list(&[item])?;
            }
            op::APPENDS => {
                let items = self.pop_mark()?;
                self.extend_list(&items)?;
            }
            op::SETITEM => {
                let value = self.pop()?;
                let key = self.pop()?;
                self.extend_dict(&[(key, value)])?;
            }
            op::SETITEMS => {
                let items = self.pop_mark()?;
                let pairs = into_pairs(&items)?;
                self.extend_dict(&pairs)?;
            }

            op::BINPUT | op::LONG_BINPUT | op::MEMOIZE => {
                let key = match op {
                    op::BINPUT => u64::from(self.take(1)?[0]),
                    op::LONG_BINPUT => u64::from(u32::from_le_bytes(self.array()?)),
                    _ => self.memo.len() as u64,
                };
                let top = self.top()?;
                self.memo.insert(key, top);
            }
            op::BINGET | op::LONG_BINGET => {
                let key = if op == op::BINGET {
                    u64::from(self.take(1)?[0])
                } else {
                    u64::from(u32::from_le_bytes(self.array()?))
                };
                let id = *self
                    .memo
                    .get(&key)
                    .ok_or_else(|| format!("memo entry {key} is not set"))?;
                self.stack.push(id);
            }

            op::GLOBAL => {
                let module = self.line()?;
                let name = self.line()?;
                self.push(Value::Global { module, name });
            }
            op::STACK_GLOBAL => {
                let name = self.pop_str()?;
                let module = self.pop_str()?;
                self.push(Value::Global { module, name });
            }
            // Both call a global with a tuple of arguments.
            op::REDUCE | op::NEWOBJ => {
                let args = self.pop()?;
                let func = self.pop()?;
                let result = self.call(func, args)?;
                self.stack.push(result);
            }
            // Sets an object's state (an OrderedDict's `_metadata`), which is not needed.
            op::BUILD => {
                self.pop()?;
                self.top()?;
            }
            op::BINPERSID => {
                let pid = self.pop()?;
                let storage = self.persistent_load(pid)?;
                self.push(Value::Storage(storage));
            }
            _ => return Err(format!("unsupported pickle opcode 0x{op:02x}")),
        }
        Ok(None)
    }

    /// Picks the dict of tensors: the top-level dict, or the one under its "state_dict" key.
    fn state_dict(&self, root: Id) -> PickleResult<&[(Id, Id)]> {
        let Value::Dict(items) = &self.values[root] else {
            return Err(format!(
                "the pickled object is {}, not a dict of tensors",
                self.values[root].kind()
            ));
        };
        let nested = items
            .iter()
            .find_map(|&(k, v)| match (&self.values[k], &self.values[v]) {
                (Value::Str(key), Value::Dict(inner)) if &**key == "state_dict" => Some(inner),
                _ => None,
            });
        Ok(nested.unwrap_or(items))
    }

    /// What a call would have returned, for the few callables a state dict uses.
    fn call(&mut self, func: Id, args: Id) -> PickleResult<Id> {
        let (module, name) = match &self.values[func] {
            Value::Global { module, name } => (module, name),
            Value::Object => return Ok(self.alloc(Value::Object)),
            other => return Err(format!("call of {}", other.kind())),
        };
        let Value::Tuple(arg_ids) = &self.values[args] else {
            return Err(format!("call arguments are {}", self.values[args].kind()));
        };
        let value = match (&**module, &**name) {
            ("torch._utils", "_rebuild_tensor_v2") => Value::Tensor(self.rebuild_tensor(arg_ids)?),
            ("torch._utils", "_rebuild_parameter") => match arg_ids.first() {
                Some(&data) if matches!(self.values[data], Value::Tensor(_)) => return Ok(data),
                _ => Value::Object,
            },
            ("collections", "OrderedDict") if arg_ids.is_empty() => Value::Dict(Vec::new()),
            _ => Value::Object,
        };
        Ok(self.alloc(value))
    }

    /// Reads `(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])`.
    fn rebuild_tensor(&self, args: &[Id]) -> PickleResult<TensorRef> {
        let bad = |what: &str| format!("bad _rebuild_tensor_v2 arguments: {what}");
        if args.len() < 4 {
            return Err(bad("fewer than 4"));
        }
        let Value::Storage(storage) = &self.values[args[0]] else {
            return Err(bad("first is not a storage"));
        };
        let offset = self.non_negative(args[1]).ok_or_else(|| bad("offset"))?;
        let size = self.int_tuple(args[2]).ok_or_else(|| bad("size"))?;
        let stride = self.int_tuple(args[3]).ok_or_else(|| bad("stride"))?;
        Ok(TensorRef {
            storage: storage.clone(),
            offset,
            size,
            stride,
        })
    }

    /// Reads a persistent id `('storage', torch.<Class>, key, location, numel)`.
    fn persistent_load(&self, pid: Id) -> PickleResult<StorageRef> {
        let bad = || "bad persistent id; expected ('storage', class, key, location, numel)";
        let Value::Tuple(parts) = &self.values[pid] else {
            return Err(bad().to_string());
        };
        let [tag, class, key, _location, numel] = parts.as_slice() else {
            return Err(bad().to_string());
        };
        match (
            &self.values[*tag],
            &self.values[*class],
            &self.values[*key],
            self.non_negative(*numel),
        ) {
            (Value::Str(tag), Value::Global { name, .. }, Value::Str(key), Some(numel))
                if &**tag == "storage" =>
            {
                Ok(StorageRef {
                    class: Rc::clone(name),
                    key: Rc::clone(key),
                    numel,
                })
            }
            _ => Err(bad().to_string()),
        }
    }

    /// An int that can be a count, offset or stride.
    fn non_negative(&self, id: Id) -> Option<u64> {
        match self.values[id] {
            Value::Int(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// A tensor size or stride: a tuple of at most `MAX_DIMS` non-negative ints.
    fn int_tuple(&self, id: Id) -> Option<Vec<u64>> {
        match &self.values[id] {
            Value::Tuple(items) if items.len() <= MAX_DIMS => {
                items.iter().map(|&i| self.non_negative(i)).collect()
            }
            _ => None,
        }
    }

    /// APPEND/APPENDS: lists grow; appends to an opaque object are dropped.
    fn extend_list(&mut self, items: &[Id]) -> PickleResult<()> {
        let target = self.top()?;
        match &mut self.values[target] {
            Value::List(list) => list.extend_from_slice(items),
            Value::Object => {}
            other => return Err(format!("append to {}", other.kind())),
        }
        Ok(())
    }

    /// SETITEM/SETITEMS: dicts grow, keeping insertion order; opaque objects ignore them.
    fn extend_dict(&mut self, pairs: &[(Id, Id)]) -> PickleResult<()> {
        let target = self.top()?;
        match &mut self.values[target] {
            Value::Dict(items) => items.extend_from_slice(pairs),
            Value::Object => {}
            other => return Err(format!("setitem on {}", other.kind())),
        }
        Ok(())
    }

    /// Adds a value to the arena without putting it on the stack.
    fn alloc(&mut self, value: Value) -> Id {
        self.values.push(value);
        self.values.len() - 1
    }

    /// Adds a value to the arena and pushes it.
    fn push(&mut self, value: Value) {
        let id = self.alloc(value);
        self.stack.push(id);
    }

    /// Pops the top of the stack; a malformed pickle may have nothing there.
    fn pop(&mut self) -> PickleResult<Id> {
        self.stack
            .pop()
            .ok_or_else(|| "stack underflow".to_string())
    }

    /// The top of the stack, left in place (the target of APPEND, SETITEM, BUILD, PUT).
    fn top(&self) -> PickleResult<Id> {
        self.stack
            .last()
            .copied()
            .ok_or_else(|| "stack underflow".to_string())
    }

    /// Pops everything above the last MARK.
    fn pop_mark(&mut self) -> PickleResult<Vec<Id>> {
        let mark = self.marks.pop().ok_or("no MARK on the stack")?;
        if mark > self.stack.len() {
            return Err("stack underflow below MARK".to_string());
        }
        Ok(self.stack.split_off(mark))
    }

    /// Pops a string, as STACK_GLOBAL's module and name.
    fn pop_str(&mut self) -> PickleResult<Rc<str>> {
        let id = self.pop()?;
        match &self.values[id] {
            Value::Str(s) => Ok(Rc::clone(s)),
            other => Err(format!("expected a string, found {}", other.kind())),
        }
    }

    /// The next `n` bytes; the length is checked against the data before anything is allocated.
    fn take(&mut self, n: usize) -> PickleResult<&'a [u8]> {
        if n > self.data.len() - self.pos {
            return Err(format!(
                "truncated: {n} bytes wanted, {} left",
                self.data.len() - self.pos
            ));
        }
        let bytes = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    /// `take` for the 8-byte lengths of the *8 opcodes.
    fn take_u64(&mut self, n: u64) -> PickleResult<&'a [u8]> {
        let n = usize::try_from(n).map_err(|_| format!("length {n} is too large"))?;
        self.take(n)
    }

    /// The next `N` bytes as an array, for fixed-width integers.
    fn array<const N: usize>(&mut self) -> PickleResult<[u8; N]> {
        let bytes = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    /// A newline-terminated argument of the text GLOBAL opcode.
    fn line(&mut self) -> PickleResult<Rc<str>> {
        let rest = &self.data[self.pos..];
        let len = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or("unterminated GLOBAL name")?;
        let line = std::str::from_utf8(&rest[..len]).map_err(|_| "GLOBAL name is not UTF-8")?;
        self.pos += len + 1;
        Ok(line.into())
    }
}

/// Pairs up the flat key, value, key, value, ... list of DICT and SETITEMS.
fn into_pairs(items: &[Id]) -> PickleResult<Vec<(Id, Id)>> {
    if items.len() % 2 != 0 {
        return Err("odd number of items for a dict".to_string());
    }
    Ok(items.chunks_exact(2).map(|kv| (kv[0], kv[1])).collect())
}

/// Decodes LONG1/LONG4's little-endian two's complement; torch only writes small ones.
fn long_to_i64(bytes: &[u8]) -> PickleResult<i64> {
    if bytes.len() > 8 {
        return Err(format!(
            "{}-byte integer does not fit in 64 bits",
            bytes.len()
        ));
    }
    let negative = bytes.last().is_some_and(|&b| b & 0x80 != 0);
    let mut buf = if negative { [0xff; 8] } else { [0; 8] };
    buf[..bytes.len()].copy_from_slice(bytes);
    Ok(i64::from_le_bytes(buf))
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::path::PathBuf;

    use super::*;

    /// The crate's test fixtures.
    fn fixture_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
    }

    /// Writes a zip laid out like torch.save's: `archive/data.pkl` first, then the storages.
    fn write_checkpoint(dir: &Path, pkl: &[u8], storages: &[(&str, &[u8])]) -> PathBuf {
        let path = dir.join("model.bin");
        let file = File::create(&path).unwrap();
        let mut zip = zip::ZipWriter::new(file);
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored);
        zip.start_file("archive/data.pkl", options).unwrap();
        zip.write_all(pkl).unwrap();
        for (key, bytes) in storages {
            zip.start_file(format!("archive/data/{key}"), options)
                .unwrap();
            zip.write_all(bytes).unwrap();
        }
        zip.finish().unwrap();
        path
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
        let mut p = b"ctorch._utils\n_rebuild_tensor_v2\n((".to_vec();
        p.extend(short_str("storage"));
        p.extend(format!("ctorch\n{class}\n").as_bytes());
        p.extend(short_str(key));
        p.extend(short_str("cpu"));
        p.extend([b'K', numel, b't', b'Q', b'K', offset, b'(']);
        for &d in size {
            p.extend([b'K', d]);
        }
        p.extend(b"t(");
        for &s in stride {
            p.extend([b'K', s]);
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
        let tensors =
            read_torch_bin(&fixture_dir().join("tiny-gptj-bin/pytorch_model.bin")).unwrap();
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
            let err = read_torch_bin(&path).unwrap_err();
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
        let err = read_torch_bin(&path).unwrap_err();
        assert!(matches!(err, Error::Checkpoint { .. }), "{err}");
    }

    #[test]
    fn missing_file_is_an_io_error() {
        let err = read_torch_bin(Path::new("/nonexistent/pytorch_model.bin")).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
    }

    #[test]
    fn legacy_format_gets_a_hint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.bin");
        std::fs::write(&path, b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.").unwrap();
        let err = read_torch_bin(&path).unwrap_err().to_string();
        assert!(err.contains("legacy"), "{err}");
    }

    #[test]
    fn view_at_an_offset_of_a_shared_storage() {
        let values: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let pkl = state_dict_pickle(
            "w",
            &tensor_ops("FloatStorage", "0", 8, 2, &[2, 3], &[3, 1]),
        );
        let dir = tempfile::tempdir().unwrap();
        let path = write_checkpoint(dir.path(), &pkl, &[("0", &f32_bytes(&values))]);
        let tensors = read_torch_bin(&path).unwrap();
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
        let dir = tempfile::tempdir().unwrap();
        let path = write_checkpoint(dir.path(), &pkl, &[("0", &[0x80, 0x3f, 0x00, 0x40])]);
        let tensors = read_torch_bin(&path).unwrap();
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
        let dir = tempfile::tempdir().unwrap();
        let path = write_checkpoint(dir.path(), &pkl, &[("0", &[0; 24])]);
        let err = read_torch_bin(&path).unwrap_err();
        let Error::Tensor { tensor, msg, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(tensor, "w");
        assert!(msg.contains("contiguous"), "{err}");
    }

    #[test]
    fn short_storage_is_truncated() {
        let pkl = state_dict_pickle("w", &tensor_ops("HalfStorage", "0", 4, 0, &[4], &[1]));
        let dir = tempfile::tempdir().unwrap();
        let path = write_checkpoint(dir.path(), &pkl, &[("0", &[0; 6])]);
        let err = read_torch_bin(&path).unwrap_err();
        let Error::Tensor { tensor, msg, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(tensor, "w");
        assert!(msg.contains("truncated"), "{err}");
    }

    #[test]
    fn unsupported_dtype_is_a_tensor_error() {
        let pkl = state_dict_pickle("w", &tensor_ops("DoubleStorage", "0", 1, 0, &[1], &[1]));
        let dir = tempfile::tempdir().unwrap();
        let path = write_checkpoint(dir.path(), &pkl, &[("0", &[0; 8])]);
        let err = read_torch_bin(&path).unwrap_err();
        assert!(
            matches!(&err, Error::Tensor { tensor, .. } if tensor == "w"),
            "{err}"
        );
        assert!(err.to_string().contains("DoubleStorage"), "{err}");
    }

    #[test]
    fn missing_data_entry_is_an_error() {
        let pkl = state_dict_pickle("w", &tensor_ops("FloatStorage", "7", 1, 0, &[1], &[1]));
        let dir = tempfile::tempdir().unwrap();
        let path = write_checkpoint(dir.path(), &pkl, &[("0", &[0; 4])]);
        let err = read_torch_bin(&path).unwrap_err();
        assert!(matches!(err, Error::Checkpoint { .. }), "{err}");
        assert!(err.to_string().contains("archive/data/7"), "{err}");
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
        let err = read_torch_bin(&path).unwrap_err();
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
        let err = read_torch_bin(&path).unwrap_err();
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
        let dir = tempfile::tempdir().unwrap();
        let path = write_checkpoint(dir.path(), &pkl, &[("0", &[0; 4])]);
        let err = read_torch_bin(&path).unwrap_err();
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

    #[test]
    fn gptj_buffer_names() {
        assert!(is_gptj_buffer("transformer.h.0.attn.bias"));
        assert!(is_gptj_buffer("transformer.h.27.attn.masked_bias"));
        assert!(!is_gptj_buffer("transformer.h.0.attn.c_attn.bias"));
        assert!(!is_gptj_buffer("h.0.c_attn.bias"));
        assert!(!is_gptj_buffer("transformer.h.0.mlp.fc_in.bias"));
    }
}
