//! Mutation fuzzing of checkpoint folders: corrupted safetensors files, pytorch_model.bin
//! archives (raw bytes, and the pickle re-zipped with correct CRCs), config.json, tokenizer.json
//! and a sharded layout's index. Whatever the bytes, `Model::load` (what the CLI calls) returns
//! an error naming a file of the folder, or a model whose weights pass `GptjWeights::check`:
//! never a panic, a hang or an allocation out of proportion to the files.
//!
//! `TOOLSIFT_FUZZ_CASES=5000 cargo test --release --test checkpoint_fuzz` runs a longer campaign;
//! FUZZ_VERBOSE=1 (with `--nocapture`) prints every load's outcome, to see what the mutations
//! reach.

mod common;

use std::io::{Read, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::{fuzz_cases, tiny};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::Value;
use toolsift::model::checkpoint::write_safetensors;
use toolsift::Model;

// The allocation watch (tests/common/watched.rs).
#[global_allocator]
static GLOBAL: common::watched::Watched = common::watched::Watched;

/// The largest single allocation one load may make: 64 times the largest fixture file.
const ALLOC_LIMIT: usize = 64 << 20;
/// The most one load may hold at once above what was held before it (other tests' threads
/// allocate too, a little): 32 times the largest safetensors header read, whose every JSON value
/// the safetensors crate holds.
const HELD_LIMIT: usize = 128 << 20;
/// The longest one load of the tiny model may take (a few milliseconds when well).
const TIME_LIMIT: Duration = Duration::from_secs(10);

/// Loads `dir` as the CLI does and checks the outcome (see the module's doc). Returns the
/// error's text when the load failed.
fn check_load(dir: &Path) -> Result<Option<String>, TestCaseError> {
    let start = Instant::now();
    let (outcome, usage) = common::watched::watch(|| {
        catch_unwind(AssertUnwindSafe(|| {
            match Model::load_deferring_tokenizer(dir) {
                Ok((model, tokenizer_error)) => {
                    if let Err(e) = model.weights().check(model.config()) {
                        return Err(format!("loaded, but the weights fail their check: {e}"));
                    }
                    if let Some(tok) = model.tokenizer_if_any() {
                        // A tokenizer that loads is used: a corrupt one must not panic then
                        // either.
                        if let Ok(enc) = tok.encode("Hello world, 12 + 3 = 15. <|endoftext|>") {
                            let _ = tok.decode(&enc.ids);
                        }
                    }
                    Ok(tokenizer_error.map(|e| e.to_string()))
                }
                Err(e) => Ok(Some(e.to_string())),
            }
        }))
    });
    let elapsed = start.elapsed();
    let (largest, peak) = (usage.largest, usage.peak_held);
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            return Err(TestCaseError::fail(format!("loading panicked: {msg}")));
        }
    };
    let err = outcome.map_err(TestCaseError::fail)?;
    prop_assert!(elapsed < TIME_LIMIT, "loading took {elapsed:?}");
    prop_assert!(
        largest <= ALLOC_LIMIT,
        "loading allocated {largest} bytes at once"
    );
    prop_assert!(peak <= HELD_LIMIT, "loading held {peak} bytes at once");
    if std::env::var_os("FUZZ_PEAK").is_some() {
        eprintln!("PEAK {peak} LARGEST {largest}");
    }
    if std::env::var_os("FUZZ_VERBOSE").is_some() {
        eprintln!("OUTCOME {err:?}");
    }
    if let Some(err) = &err {
        let dir_name = dir.display().to_string();
        prop_assert!(
            err.contains(&dir_name),
            "the error names no file of the folder: {err}"
        );
    }
    Ok(err)
}

/// A fresh folder with `files` (name, bytes) in it.
fn folder(files: &[(&str, &[u8])]) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("model");
    std::fs::create_dir(&dir).unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    (tmp, dir)
}

/// Fixture files read so far, by "variant/name" (read once, kept for the process).
type FixtureCache = Mutex<Vec<(String, &'static [u8])>>;

/// A fixture file's bytes.
fn fixture(variant: &str, name: &str) -> &'static [u8] {
    static CACHE: OnceLock<FixtureCache> = OnceLock::new();
    let key = format!("{variant}/{name}");
    let mut cache = CACHE.get_or_init(Default::default).lock().unwrap();
    if let Some((_, bytes)) = cache.iter().find(|(k, _)| *k == key) {
        return bytes;
    }
    let bytes: &'static [u8] = std::fs::read(tiny(variant).join(name)).unwrap().leak();
    cache.push((key, bytes));
    bytes
}

// ---------------------------------------------------------------------------------------------
// Byte-level mutations, shared by every file kind.

#[derive(Debug, Clone)]
enum ByteEdit {
    /// XOR one byte (the position is taken modulo the length, or modulo `hot` when in `Hot`).
    Flip(usize, u8),
    Set(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
    /// The edit applies within the first `hot` bytes (a header, a pickle's start).
    Hot(Box<ByteEdit>),
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    let leaf = prop_oneof![
        // Mostly within ASCII: a flip into a byte over 0x7f makes most text files invalid UTF-8,
        // which every reader refuses the same way.
        3 => (any::<usize>(), prop_oneof![3 => 1..=0x7fu8, 1 => 1..=255u8])
            .prop_map(|(at, x)| ByteEdit::Flip(at, x)),
        2 => (any::<usize>(), interesting_byte()).prop_map(|(at, b)| ByteEdit::Set(at, b)),
        1 => (any::<usize>(), prop::collection::vec(interesting_byte(), 1..16))
            .prop_map(|(at, b)| ByteEdit::Insert(at, b)),
        1 => (any::<usize>(), 1..64usize).prop_map(|(at, n)| ByteEdit::Delete(at, n)),
        1 => any::<usize>().prop_map(ByteEdit::Truncate),
    ];
    prop_oneof![
        1 => leaf.clone(),
        2 => leaf.prop_map(|e| ByteEdit::Hot(Box::new(e))),
    ]
}

/// Bytes that mean something to JSON, pickle or a length field.
fn interesting_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        any::<u8>(),
        prop::sample::select(
            b"{}[]\",:0123456789-.eE \\nu\x00\xff\x7f\x80(.0qhjKJMXU\x8c\x93\x94\x95".to_vec()
        ),
    ]
}

fn apply_bytes(data: &mut Vec<u8>, edit: &ByteEdit, hot: usize) {
    let within = |at: usize, len: usize| if len == 0 { 0 } else { at % len };
    match edit {
        ByteEdit::Hot(inner) => {
            let hot = hot.min(data.len());
            let mut head = data[..hot].to_vec();
            apply_bytes(&mut head, inner, hot);
            data.splice(..hot, head);
        }
        ByteEdit::Flip(at, x) if !data.is_empty() => {
            let i = within(*at, data.len());
            data[i] ^= x;
        }
        ByteEdit::Set(at, b) if !data.is_empty() => {
            let i = within(*at, data.len());
            data[i] = *b;
        }
        ByteEdit::Insert(at, bytes) => {
            let i = within(*at, data.len() + 1);
            data.splice(i..i, bytes.iter().copied());
        }
        ByteEdit::Delete(at, n) if !data.is_empty() => {
            let i = within(*at, data.len());
            let end = (i + n).min(data.len());
            data.drain(i..end);
        }
        ByteEdit::Truncate(len) => {
            let n = within(*len, data.len() + 1);
            data.truncate(n);
        }
        _ => {}
    }
}

// ---------------------------------------------------------------------------------------------
// JSON-level mutations: a value somewhere in the document replaced, removed or duplicated.

/// Numbers around the limits that a loader computes with.
fn interesting_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0..1024u64).prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        prop::sample::select(vec![
            0u64,
            1,
            2,
            8,
            64,
            255,
            256,
            512,
            65535,
            1 << 16,
            1 << 20,
            1 << 26,
            1 << 31,
            u32::MAX as u64,
            1 << 32,
            1 << 40,
            1 << 62,
            i64::MAX as u64,
            u64::MAX,
            u64::MAX / 2 + 1,
        ])
        .prop_map(Value::from),
        prop::sample::select(vec![-1.0f64, 0.5, 1e-300, 1e300, -1e300, 3.5, 1e19])
            .prop_map(Value::from),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        4 => interesting_number(),
        1 => Just(Value::Null),
        1 => any::<bool>().prop_map(Value::from),
        2 => "[a-z_.]{0,12}".prop_map(Value::from),
        1 => prop::sample::select(vec![
            "F32", "F16", "BF16", "I64", "U8", "BOOL", "F64", "F8_E4M3", "gelu_new", "gptj", "",
            "..", ".", "/", "\u{feff}", "model.safetensors", "config.json",
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::vec(("[a-z_]{1,8}", inner), 0..3)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

#[derive(Debug, Clone)]
enum JsonEdit {
    /// Replaces the value at the `n`th path (modulo the number of paths, pre-order).
    Replace(usize, Value),
    Remove(usize),
    /// Adds a member to the `n`th object.
    Add(usize, String, Value),
}

fn json_edit() -> impl Strategy<Value = JsonEdit> {
    prop_oneof![
        4 => (any::<usize>(), json_value()).prop_map(|(n, v)| JsonEdit::Replace(n, v)),
        1 => any::<usize>().prop_map(JsonEdit::Remove),
        1 => (any::<usize>(), "[a-z_]{1,10}", json_value())
            .prop_map(|(n, k, v)| JsonEdit::Add(n, k, v)),
    ]
}

/// Pointers (RFC 6901) to every value in `v`, pre-order, the root excepted.
fn pointers(v: &Value, at: String, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            for (k, child) in map {
                let p = format!("{at}/{}", k.replace('~', "~0").replace('/', "~1"));
                out.push(p.clone());
                pointers(child, p, out);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                let p = format!("{at}/{i}");
                out.push(p.clone());
                pointers(child, p, out);
            }
        }
        _ => {}
    }
}

fn apply_json(doc: &mut Value, edit: &JsonEdit) {
    let mut all = Vec::new();
    pointers(doc, String::new(), &mut all);
    if all.is_empty() {
        return;
    }
    match edit {
        JsonEdit::Replace(n, v) => {
            if let Some(slot) = doc.pointer_mut(&all[n % all.len()]) {
                *slot = v.clone();
            }
        }
        JsonEdit::Remove(n) => {
            let p = &all[n % all.len()];
            let (parent, key) = p.rsplit_once('/').unwrap();
            // The empty pointer is the root.
            match doc.pointer_mut(parent) {
                Some(Value::Object(m)) => {
                    // `retain` keeps the others' order with and without preserve_order.
                    let key = key.replace("~1", "/").replace("~0", "~");
                    m.retain(|k, _| *k != key);
                }
                Some(Value::Array(a)) => {
                    if let Ok(i) = key.parse::<usize>() {
                        if i < a.len() {
                            a.remove(i);
                        }
                    }
                }
                _ => {}
            }
        }
        JsonEdit::Add(n, k, v) => {
            let objects: Vec<&String> = all
                .iter()
                .filter(|p| doc.pointer(p).is_some_and(Value::is_object))
                .collect();
            let target = if objects.is_empty() {
                String::new()
            } else {
                objects[n % objects.len()].clone()
            };
            if let Some(Value::Object(m)) = doc.pointer_mut(&target) {
                m.insert(k.clone(), v.clone());
            }
        }
    }
}

/// A JSON file's text after `json` edits (on its value) and then `bytes` edits (on its text).
fn mutate_json_text(text: &[u8], json: &[JsonEdit], bytes: &[ByteEdit], hot: usize) -> Vec<u8> {
    let mut out = if json.is_empty() {
        text.to_vec()
    } else {
        let mut doc: Value = serde_json::from_slice(text).unwrap();
        for e in json {
            apply_json(&mut doc, e);
        }
        serde_json::to_vec_pretty(&doc).unwrap()
    };
    for e in bytes {
        apply_bytes(&mut out, e, hot);
    }
    out
}

fn config() -> proptest::test_runner::Config {
    ProptestConfig {
        // Failures are minimized and printed, not written beside the test.
        failure_persistence: None,
        ..ProptestConfig::with_cases(fuzz_cases(256))
    }
}

// ---------------------------------------------------------------------------------------------
// (a) model.safetensors

/// An edit of one tensor's entry in the safetensors header.
#[derive(Debug, Clone)]
enum HeaderEdit {
    Offsets(usize, Value, Value),
    Shape(usize, Vec<Value>),
    Dtype(usize, Value),
    /// Any other edit of the header's JSON.
    Json(JsonEdit),
    /// The 8-byte length in front of the header.
    Length(u64),
}

fn header_edit() -> impl Strategy<Value = HeaderEdit> {
    prop_oneof![
        3 => (any::<usize>(), interesting_number(), interesting_number())
            .prop_map(|(t, a, b)| HeaderEdit::Offsets(t, a, b)),
        3 => (any::<usize>(), prop::collection::vec(interesting_number(), 0..6))
            .prop_map(|(t, s)| HeaderEdit::Shape(t, s)),
        2 => (any::<usize>(), json_value()).prop_map(|(t, d)| HeaderEdit::Dtype(t, d)),
        2 => json_edit().prop_map(HeaderEdit::Json),
        1 => prop_oneof![
            any::<u64>(),
            0..4096u64,
            prop::sample::select(vec![0u64, 1, 7, 8, u64::MAX, 1 << 32, 16 << 20, 100 << 20]),
        ]
        .prop_map(HeaderEdit::Length),
    ]
}

/// The fixture's safetensors with `headers` applied to its header's JSON, then `bytes` to the
/// file (hot: the length and header).
fn mutate_safetensors(base: &[u8], headers: &[HeaderEdit], bytes: &[ByteEdit]) -> Vec<u8> {
    let len = u64::from_le_bytes(base[..8].try_into().unwrap()) as usize;
    let mut doc: Value = serde_json::from_slice(&base[8..8 + len]).unwrap();
    let names: Vec<String> = doc
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    let mut length = None;
    for edit in headers {
        // A field of one tensor's entry (an earlier edit may have made it something else).
        let mut set = |t: usize, field: &str, value: Value| {
            if let Some(Value::Object(entry)) = doc.get_mut(&names[t % names.len()]) {
                entry.insert(field.to_string(), value);
            }
        };
        match edit {
            HeaderEdit::Offsets(t, a, b) => {
                set(*t, "data_offsets", Value::from(vec![a.clone(), b.clone()]))
            }
            HeaderEdit::Shape(t, s) => set(*t, "shape", Value::from(s.clone())),
            HeaderEdit::Dtype(t, d) => set(*t, "dtype", d.clone()),
            HeaderEdit::Json(e) => apply_json(&mut doc, e),
            HeaderEdit::Length(n) => length = Some(*n),
        }
    }
    let mut header = serde_json::to_vec(&doc).unwrap();
    // Padded to 8 bytes with spaces, as the crate writes it.
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut out = length.unwrap_or(header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&header);
    out.extend_from_slice(&base[8 + len..]);
    let hot = 8 + header.len();
    for e in bytes {
        apply_bytes(&mut out, e, hot);
    }
    out
}

fn safetensors_folder(st: &[u8]) -> (tempfile::TempDir, PathBuf) {
    folder(&[
        ("config.json", fixture("f32", "config.json")),
        ("tokenizer.json", fixture("f32", "tokenizer.json")),
        ("model.safetensors", st),
    ])
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn corrupt_safetensors_never_panic(
        headers in prop::collection::vec(header_edit(), 0..3),
        bytes in prop::collection::vec(byte_edit(), 0..3),
    ) {
        let st = mutate_safetensors(fixture("f32", "model.safetensors"), &headers, &bytes);
        let (_tmp, dir) = safetensors_folder(&st);
        check_load(&dir)?;
    }
}

// ---------------------------------------------------------------------------------------------
// (b) pytorch_model.bin

/// The entries of a zip archive, in order.
fn unzip(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    (0..archive.len())
        .map(|i| {
            let mut f = archive.by_index(i).unwrap();
            let mut data = Vec::new();
            f.read_to_end(&mut data).unwrap();
            (f.name().unwrap().to_string(), data)
        })
        .collect()
}

/// A stored (uncompressed) zip of `entries`, CRCs correct, storages aligned to 64 bytes as
/// torch.save aligns them.
fn rezip(entries: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Stored)
        .with_alignment(64);
    for (name, data) in entries {
        zip.start_file(name.as_str(), options).unwrap();
        zip.write_all(data).unwrap();
    }
    zip.finish().unwrap().into_inner()
}

fn bin_folder(bin: &[u8]) -> (tempfile::TempDir, PathBuf) {
    folder(&[
        ("config.json", fixture("bin", "config.json")),
        ("tokenizer.json", fixture("bin", "tokenizer.json")),
        ("pytorch_model.bin", bin),
    ])
}

/// Pickle opcodes, for edits that swap one for another.
fn pickle_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        any::<u8>(),
        prop::sample::select(
            [
                &b"(.0124GJKMNQRTUXabcd}ehjl]qrst)uBC"[..],
                b"\x80\x81\x85\x86\x87\x88\x89\x8a\x8b\x8c\x8d\x8e\x93\x94\x95",
            ]
            .concat()
        ),
    ]
}

#[derive(Debug, Clone)]
enum PickleEdit {
    Bytes(ByteEdit),
    /// Sets the `n`th opcode-looking byte to another opcode.
    Opcode(usize, u8),
    /// A little-endian integer written over bytes `at..at + 4` (lengths, memo ids, sizes).
    Int(usize, u32),
}

fn pickle_edit() -> impl Strategy<Value = PickleEdit> {
    prop_oneof![
        3 => byte_edit().prop_map(PickleEdit::Bytes),
        2 => (any::<usize>(), pickle_byte()).prop_map(|(at, b)| PickleEdit::Opcode(at, b)),
        2 => (any::<usize>(), prop_oneof![any::<u32>(), 0..300u32, Just(u32::MAX)])
            .prop_map(|(at, v)| PickleEdit::Int(at, v)),
    ]
}

fn apply_pickle(pkl: &mut Vec<u8>, edit: &PickleEdit) {
    match edit {
        PickleEdit::Bytes(e) => apply_bytes(pkl, e, 256),
        PickleEdit::Opcode(at, b) if !pkl.is_empty() => {
            let i = at % pkl.len();
            pkl[i] = *b;
        }
        PickleEdit::Int(at, v) if pkl.len() >= 4 => {
            let i = at % (pkl.len() - 3);
            pkl[i..i + 4].copy_from_slice(&v.to_le_bytes());
        }
        _ => {}
    }
}

#[derive(Debug, Clone)]
enum EntryEdit {
    /// Renames the `n`th entry.
    Rename(usize, String),
    /// Drops the `n`th entry.
    Drop(usize),
    /// Truncates or extends the `n`th entry to `len` bytes (modulo twice its length + 1).
    Resize(usize, usize),
}

fn entry_edit() -> impl Strategy<Value = EntryEdit> {
    prop_oneof![
        (
            any::<usize>(),
            prop::sample::select(vec![
                "pytorch_model/data.pkl",
                "pytorch_model/data/0",
                "pytorch_model/data/1",
                "pytorch_model/byteorder",
                "other/data.pkl",
                "data.pkl",
                "pytorch_model/data/99",
            ])
        )
            .prop_map(|(n, s)| EntryEdit::Rename(n, s.to_string())),
        any::<usize>().prop_map(EntryEdit::Drop),
        (any::<usize>(), any::<usize>()).prop_map(|(n, l)| EntryEdit::Resize(n, l)),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// Raw bytes of the archive: mostly caught by the CRC-32s, or the zip structures.
    #[test]
    fn corrupt_pytorch_bin_bytes_never_panic(
        bytes in prop::collection::vec(byte_edit(), 0..3),
        tail in prop::collection::vec(byte_edit(), 0..3),
    ) {
        let mut bin = fixture("bin", "pytorch_model.bin").to_vec();
        // Hot: data.pkl and the local headers in front of the storages.
        for e in &bytes {
            apply_bytes(&mut bin, e, 4096);
        }
        // And the central directory and end records (the last 35 entries' worth of bytes): the
        // counts, sizes and offsets the zip crate sizes its reads by.
        let split = bin.len().saturating_sub(4096);
        let mut end = bin.split_off(split);
        for e in &tail {
            apply_bytes(&mut end, e, 4096);
        }
        bin.extend_from_slice(&end);
        let (_tmp, dir) = bin_folder(&bin);
        check_load(&dir)?;
    }

    /// The pickle (and the archive's entries) edited and re-zipped with correct CRCs, so that
    /// the pickle interpreter and the tensor checks see every edit.
    #[test]
    fn corrupt_pickle_never_panics(
        edits in prop::collection::vec(pickle_edit(), 1..4),
        entries in prop::collection::vec(entry_edit(), 0..2),
    ) {
        let mut files = unzip(fixture("bin", "pytorch_model.bin"));
        let pkl = files.iter_mut().find(|(n, _)| n.ends_with("/data.pkl")).unwrap();
        for e in &edits {
            apply_pickle(&mut pkl.1, e);
        }
        for e in &entries {
            let n = files.len();
            match e {
                // Not onto another entry's name: the zip writer refuses two entries of one
                // name (a case the reader's own tests cover).
                EntryEdit::Rename(i, name) => {
                    if files.iter().all(|(n, _)| n != name) {
                        files[i % n].0 = name.clone();
                    }
                }
                EntryEdit::Drop(i) => {
                    files.remove(i % n);
                }
                EntryEdit::Resize(i, len) => {
                    let data = &mut files[i % n].1;
                    let len = len % (2 * data.len() + 1);
                    data.resize(len, 0x3c);
                }
            }
        }
        let (_tmp, dir) = bin_folder(&rezip(&files));
        check_load(&dir)?;
    }
}

// ---------------------------------------------------------------------------------------------
// (c) config.json and tokenizer.json

proptest! {
    #![proptest_config(config())]

    #[test]
    fn corrupt_config_never_panics(
        json in prop::collection::vec(json_edit(), 0..3),
        bytes in prop::collection::vec(byte_edit(), 0..2),
    ) {
        let text = mutate_json_text(fixture("f32", "config.json"), &json, &bytes, 1 << 20);
        let (_tmp, dir) = folder(&[
            ("config.json", &text),
            ("tokenizer.json", fixture("f32", "tokenizer.json")),
            ("model.safetensors", fixture("f32", "model.safetensors")),
        ]);
        check_load(&dir)?;
    }

    #[test]
    fn corrupt_tokenizer_never_panics(
        json in prop::collection::vec(json_edit(), 0..3),
        bytes in prop::collection::vec(byte_edit(), 0..2),
    ) {
        // Hot: the settings before the vocabulary.
        let text = mutate_json_text(fixture("f32", "tokenizer.json"), &json, &bytes, 2048);
        let (_tmp, dir) = folder(&[
            ("config.json", fixture("f32", "config.json")),
            ("tokenizer.json", &text),
            ("model.safetensors", fixture("f32", "model.safetensors")),
        ]);
        check_load(&dir)?;
    }
}

// ---------------------------------------------------------------------------------------------
// (d) model.safetensors.index.json

const SHARDS: [&str; 2] = [
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
];

/// The fixture split into two shards, and its index's text.
fn sharded() -> &'static (Vec<u8>, Vec<u8>, Vec<u8>) {
    static SHARDED: OnceLock<(Vec<u8>, Vec<u8>, Vec<u8>)> = OnceLock::new();
    SHARDED.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let model = Model::load(tiny("f32")).unwrap();
        let tensors = model.weights().named_tensors(model.config());
        let (a, b) = tensors.split_at(tensors.len() / 2);
        let mut map = serde_json::Map::new();
        for (part, shard) in [(a, SHARDS[0]), (b, SHARDS[1])] {
            write_safetensors(&tmp.path().join(shard), part).unwrap();
            for (name, _) in part {
                map.insert(name.clone(), shard.into());
            }
        }
        let index = serde_json::json!({"metadata": {"total_size": 663552}, "weight_map": map});
        let read = |shard: &str| std::fs::read(tmp.path().join(shard)).unwrap();
        (
            read(SHARDS[0]),
            read(SHARDS[1]),
            serde_json::to_vec_pretty(&index).unwrap(),
        )
    })
}

/// A shard name in the index: the real ones, and names that must not be followed.
fn shard_name() -> impl Strategy<Value = Value> {
    prop::sample::select(vec![
        SHARDS[0],
        SHARDS[1],
        "",
        ".",
        "..",
        "../model/model-00001-of-00002.safetensors",
        "/dev/null",
        "/dev/zero",
        "sub",
        "config.json",
        "tokenizer.json",
        "missing.safetensors",
        "a\u{0}b",
        "C:\\x",
        "\u{feff}",
    ])
    .prop_map(Value::from)
}

#[derive(Debug, Clone)]
enum IndexEdit {
    Json(JsonEdit),
    /// Sets the `n`th entry of weight_map to a shard name.
    Shard(usize, Value),
    /// Writes the `n`th entry of weight_map a second time, naming another shard.
    Duplicate(usize, Value),
}

fn index_edit() -> impl Strategy<Value = IndexEdit> {
    prop_oneof![
        2 => json_edit().prop_map(IndexEdit::Json),
        2 => (any::<usize>(), shard_name()).prop_map(|(n, s)| IndexEdit::Shard(n, s)),
        1 => (any::<usize>(), shard_name()).prop_map(|(n, s)| IndexEdit::Duplicate(n, s)),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn corrupt_shard_index_never_panics(
        edits in prop::collection::vec(index_edit(), 1..4),
        bytes in prop::collection::vec(byte_edit(), 0..2),
    ) {
        let (a, b, index) = sharded();
        let mut doc: Value = serde_json::from_slice(index).unwrap();
        let mut duplicates = Vec::new();
        for e in &edits {
            match e {
                IndexEdit::Json(e) => apply_json(&mut doc, e),
                IndexEdit::Shard(n, s) | IndexEdit::Duplicate(n, s) => {
                    let Some(Value::Object(map)) = doc.get_mut("weight_map") else { continue };
                    if map.is_empty() {
                        continue;
                    }
                    let k = n % map.len();
                    let (name, slot) = map.iter_mut().nth(k).unwrap();
                    if matches!(e, IndexEdit::Duplicate(..)) {
                        duplicates.push((name.clone(), s.clone()));
                    } else {
                        *slot = s.clone();
                    }
                }
            }
        }
        let mut text = serde_json::to_string_pretty(&doc).unwrap();
        // serde_json writes a key once: a duplicate goes in as text, first in weight_map.
        let mut duplicated = false;
        for (name, shard) in &duplicates {
            // A later edit may have removed the entry: then this one is no duplicate.
            let listed = doc
                .get("weight_map")
                .and_then(Value::as_object)
                .is_some_and(|m| m.contains_key(name));
            if !listed {
                continue;
            }
            if let Some(at) = text.find("\"weight_map\": {\n") {
                let at = at + "\"weight_map\": {".len();
                let entry = format!("\n    {}: {shard},", Value::from(name.as_str()));
                text.insert_str(at, &entry);
                duplicated = true;
            }
        }
        let mut text = text.into_bytes();
        for e in &bytes {
            apply_bytes(&mut text, e, 1 << 20);
        }
        let (_tmp, dir) = folder(&[
            ("config.json", fixture("f32", "config.json")),
            ("tokenizer.json", fixture("f32", "tokenizer.json")),
            (SHARDS[0], a),
            (SHARDS[1], b),
            ("model.safetensors.index.json", &text),
        ]);
        std::fs::create_dir(dir.join("sub")).unwrap();
        let err = check_load(&dir)?;
        // Byte edits may have cut the duplicate out again.
        if duplicated && bytes.is_empty() {
            prop_assert!(err.is_some(), "an index naming a tensor twice loaded");
        }
    }
}

/// The untouched fixtures load: the fuzzing starts from folders that work.
#[test]
fn unmutated_fixtures_load() {
    for (variant, weights) in [("f32", "model.safetensors"), ("bin", "pytorch_model.bin")] {
        let (_tmp, dir) = folder(&[
            ("config.json", fixture(variant, "config.json")),
            ("tokenizer.json", fixture(variant, "tokenizer.json")),
            (weights, fixture(variant, weights)),
        ]);
        assert_eq!(check_load(&dir).unwrap(), None);
    }
    let bin = unzip(fixture("bin", "pytorch_model.bin"));
    let (_tmp, dir) = bin_folder(&rezip(&bin));
    assert_eq!(check_load(&dir).unwrap(), None, "re-zipped");
    let (a, b, index) = sharded();
    let (_tmp, dir) = folder(&[
        ("config.json", fixture("f32", "config.json")),
        ("tokenizer.json", fixture("f32", "tokenizer.json")),
        (SHARDS[0], a),
        (SHARDS[1], b),
        ("model.safetensors.index.json", index),
    ]);
    assert_eq!(check_load(&dir).unwrap(), None, "sharded");
    let (_tmp, dir) = safetensors_folder(&mutate_safetensors(
        fixture("f32", "model.safetensors"),
        &[],
        &[],
    ));
    assert_eq!(check_load(&dir).unwrap(), None, "header rewritten");
}

/// Headers built to the size limit (4 MiB) to make the loader allocate by what they declare:
/// one tensor with millions of dimensions, metadata holding a huge array, tens of thousands of
/// empty tensors. Each is refused within the allocation limits (the first made the safetensors
/// crate allocate 576 MiB at once when the limit was 16 MiB).
#[test]
fn headers_at_the_size_limit_stay_small() {
    const BUDGET: usize = (4 << 20) - 4096;
    let fill = |head: &str, item: &str, tail: &str| {
        let n = (BUDGET - head.len() - tail.len()) / item.len();
        let mut s = String::with_capacity(BUDGET);
        s.push_str(head);
        for i in 0..n {
            s.push_str(if i == 0 { &item[1..] } else { item });
        }
        s.push_str(tail);
        s
    };
    let many_tensors = {
        let mut s = String::from("{");
        let mut i = 0;
        while s.len() < BUDGET - 100 {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&format!(
                r#""t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}"#
            ));
            i += 1;
        }
        s.push('}');
        s
    };
    let headers = [
        (
            "a shape of millions of dimensions",
            fill(
                r#"{"w":{"dtype":"F32","data_offsets":[0,0],"shape":["#,
                ",0",
                "]}}",
            ),
            "tensor `w`: in the safetensors header: shape has more than 64 dimensions",
        ),
        (
            "metadata holding a huge array",
            fill(r#"{"__metadata__":{"a":["#, ",0", "]}}"),
            "its safetensors header's __metadata__ is malformed",
        ),
        // Well formed: the crate reads it all, and the tensors GPT-J needs are missing.
        (
            "tens of thousands of empty tensors",
            many_tensors,
            "missing from the checkpoint",
        ),
    ];
    for (what, header, says) in headers {
        let mut header = header.into_bytes();
        while !header.len().is_multiple_of(8) {
            header.push(b' ');
        }
        let mut st = (header.len() as u64).to_le_bytes().to_vec();
        st.extend_from_slice(&header);
        let (_tmp, dir) = safetensors_folder(&st);
        let err = check_load(&dir).unwrap_or_else(|e| panic!("{what}: {e}"));
        let err = err.unwrap_or_else(|| panic!("{what}: loaded"));
        assert!(err.contains(says), "{what}: {err}");
    }
}

/// config.json, the shard index and tokenizer.json past their size limits are refused unread,
/// and a shard name that is a huge array is refused as it is read.
#[test]
fn json_files_past_their_limits_are_refused_unread() {
    let zeros = |bytes: usize| {
        let mut s = String::from("[0");
        while s.len() < bytes {
            s.push_str(",0");
        }
        s.push(']');
        s
    };
    let config = fixture("f32", "config.json");
    let tokenizer = fixture("f32", "tokenizer.json");
    let (a, b, index) = sharded();
    // Built as text: the watch on allocations is process-wide, and a JSON value of a million
    // items built here would be charged to another test's load.
    let big_shard_name = format!(
        r#"{{"weight_map": {{"transformer.wte.weight": {}}}}}"#,
        zeros(3 << 20)
    );
    let padded = |json: &[u8], bytes: usize| {
        let mut v = json.to_vec();
        v.resize(bytes, b' ');
        v
    };
    // (what, the file replaced, its bytes, what the error says)
    let cases: [(&str, &str, Vec<u8>, &str); 5] = [
        (
            "config.json over 1 MiB",
            "config.json",
            padded(config, (1 << 20) + 1),
            "config.json: is larger than 1 MiB",
        ),
        (
            "config.json of a million numbers, under 1 MiB",
            "config.json",
            format!(r#"{{"a": {}}}"#, zeros((1 << 20) - 100)).into_bytes(),
            "config.json: not a GPT-J config",
        ),
        (
            "an index over 4 MiB",
            "model.safetensors.index.json",
            padded(index, (4 << 20) + 1),
            "model.safetensors.index.json: is larger than 4 MiB",
        ),
        (
            "a shard name that is an array of a million numbers",
            "model.safetensors.index.json",
            big_shard_name.into_bytes(),
            "is not a file name",
        ),
        (
            "tokenizer.json over 64 MiB",
            "tokenizer.json",
            Vec::new(),
            "tokenizer.json: is larger than 64 MiB",
        ),
    ];
    for (what, name, bytes, says) in cases {
        let (_tmp, dir) = folder(&[
            ("config.json", config),
            ("tokenizer.json", tokenizer),
            (SHARDS[0], a),
            (SHARDS[1], b),
            ("model.safetensors.index.json", index),
        ]);
        std::fs::write(dir.join(name), bytes).unwrap();
        if what.starts_with("tokenizer.json") {
            // Sparse: no 64 MiB written to the disk.
            let f = std::fs::File::options()
                .write(true)
                .open(dir.join("tokenizer.json"))
                .unwrap();
            f.set_len((64 << 20) + 1).unwrap();
        }
        let err = check_load(&dir).unwrap_or_else(|e| panic!("{what}: {e}"));
        let err = err.unwrap_or_else(|| panic!("{what}: loaded"));
        if std::env::var_os("FUZZ_VERBOSE").is_some() {
            eprintln!("{what}: {err}");
        }
        assert!(err.contains(says), "{what}: {err}");
    }
}

/// A data.pkl at its size limit (4 MiB) that is the fixture's state dict followed by millions
/// of opcodes that each add a value, a stack entry, a mark or a memo entry: it loads, or is
/// refused, within the allocation limits (four million empty tuples took 352 MiB at once before
/// values were capped).
#[test]
fn a_pickle_at_its_size_limit_stays_small() {
    const BUDGET: usize = (4 << 20) - 64;
    let entries = unzip(fixture("bin", "pytorch_model.bin"));
    let pkl_at = entries
        .iter()
        .position(|(name, _)| name.ends_with("/data.pkl"))
        .unwrap();
    let state_dict = &entries[pkl_at].1;
    // Memo 13 is the first tensor (`pickletools.dis` of the fixture).
    /// Opcodes after the state dict: `open`, `push` until the budget, `close`.
    struct Filler {
        what: &'static str,
        open: &'static [u8],
        push: &'static [u8],
        close: &'static [u8],
        /// Whether the cap on values refuses it.
        capped: bool,
    }
    let filler = |what, open, push, close, capped| Filler {
        what,
        open,
        push,
        close,
        capped,
    };
    let fillers = [
        filler("a re-used tensor", b"(", b"h\x0d", b"l0", false),
        filler("an empty tuple", b"(", b")", b"l0", true),
        filler("an empty list", b"(", b"]", b"l0", true),
        filler("None", b"(", b"N", b"l0", true),
        filler("the top of the stack again", b"(", b"2", b"l0", false),
        filler("a mark", b"", b"(", b"", false),
        filler("a memo entry", b")", b"\x94", b"0", true),
    ];
    for Filler {
        what,
        open,
        push,
        close,
        capped,
    } in fillers
    {
        let mut pkl = state_dict[..state_dict.len() - 1].to_vec(); // less the STOP
        pkl.extend_from_slice(open);
        while pkl.len() + push.len() + close.len() < BUDGET {
            pkl.extend_from_slice(push);
        }
        pkl.extend_from_slice(close);
        pkl.push(b'.');
        let mut bin = entries.clone();
        bin[pkl_at].1 = pkl;
        let (_tmp, dir) = bin_folder(&rezip(&bin));
        let err = check_load(&dir).unwrap_or_else(|e| panic!("{what}: {e}"));
        let refused = err
            .as_deref()
            .is_some_and(|e| e.contains("builds 262144 values"));
        assert_eq!(refused, capped, "{what}: {err:?}");
    }
}
