//! A pickle interpreter that only builds data: the opcodes torch.save's `data.pkl` uses, the
//! persistent ids of storages and `_rebuild_tensor_v2`; it never imports or calls anything.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// torch's own limit on a tensor's number of dimensions. Capping it keeps each tensor's shape
/// small however often a pickle re-uses one huge size tuple.
const MAX_DIMS: usize = 64;

/// A pickle that builds this many values (or memo entries) is refused: a state dict's tensor
/// takes about 15 (GPT-J 6B's whole pickle some 4,000), and one value takes up to 88 bytes. A
/// power of two, so that the arena's doubling stops at this many (23 MB).
const MAX_VALUES: usize = 1 << 18;

/// Index of a value in the unpickler's arena.
type Id = usize;

/// A storage as a persistent id names it: `('storage', torch.<Class>, key, location, numel)`.
#[derive(Clone)]
pub(super) struct StorageRef {
    pub(super) class: Rc<str>,
    pub(super) key: Rc<str>,
    pub(super) numel: u64,
}

/// The arguments of `torch._utils._rebuild_tensor_v2` that locate a tensor's elements.
pub(super) struct TensorRef {
    pub(super) storage: StorageRef,
    pub(super) offset: u64,
    /// Shared by the tensors that re-use one memoised tuple (`Unpickler::int_tuples`).
    pub(super) size: Rc<[u64]>,
    pub(super) stride: Rc<[u64]>,
}

/// A pickled value. Containers hold arena ids rather than values, so that a memoised object is
/// shared as in Python, and strings are `Rc<str>`: re-using a memoised value never copies it, so
/// memory stays proportional to the pickle's length. Scalars the reader never looks at (floats,
/// bools, bytes) keep only their kind.
pub(super) enum Value {
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
    pub(super) fn kind(&self) -> &'static str {
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
pub(super) struct Unpickler<'a> {
    pub(super) data: &'a [u8],
    pub(super) pos: usize,
    pub(super) values: Vec<Value>,
    pub(super) stack: Vec<Id>,
    pub(super) marks: Vec<usize>,
    pub(super) memo: HashMap<u64, Id>,
    /// Sizes and strides read, by the tuple's id: a pickle that re-uses one 64-int tuple for
    /// every tensor costs its bytes once, not 1 KB per 5 pickle bytes of the re-use.
    int_tuples: RefCell<HashMap<Id, Rc<[u64]>>>,
}

impl<'a> Unpickler<'a> {
    /// An interpreter positioned at the first opcode of `data`.
    pub(super) fn new(data: &'a [u8]) -> Self {
        Unpickler {
            data,
            pos: 0,
            values: Vec::new(),
            stack: Vec::new(),
            marks: Vec::new(),
            memo: HashMap::new(),
            int_tuples: RefCell::default(),
        }
    }

    /// Runs the pickle to its STOP opcode and returns the id of the unpickled object.
    pub(super) fn run(&mut self) -> PickleResult<Id> {
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
            // Each opcode adds at most one value and one memo entry.
            if self.values.len() >= MAX_VALUES || self.memo.len() >= MAX_VALUES {
                return Err(format!(
                    "builds {MAX_VALUES} values or memo entries, more than a state dict \
                     needs (opcode 0x{op:02x} at byte {at})"
                ));
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
    pub(super) fn state_dict(&self, root: Id) -> PickleResult<&[(Id, Id)]> {
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
    fn int_tuple(&self, id: Id) -> Option<Rc<[u64]>> {
        if let Some(known) = self.int_tuples.borrow().get(&id) {
            return Some(Rc::clone(known));
        }
        let ints: Rc<[u64]> = match &self.values[id] {
            Value::Tuple(items) if items.len() <= MAX_DIMS => {
                items.iter().map(|&i| self.non_negative(i)).collect()
            }
            _ => None,
        }?;
        self.int_tuples.borrow_mut().insert(id, Rc::clone(&ints));
        Some(ints)
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
    if !items.len().is_multiple_of(2) {
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
