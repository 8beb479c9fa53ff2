//! Reading one JSONL input line strictly, as `score`, `generate`, `index` and the corpus do.
//!
//! - [`parse_line`]: a line's JSON value, also telling of a key that an object holds twice (at
//!   any depth). serde_json's own `Value` keeps the last one silently, and a struct deserialized
//!   from a `Value` never sees the first, so `{"text": "a", "text": ""}` would read as an empty
//!   text: the same class of mistake as a misspelled key, which the formats refuse.
//! - [`parse_line_reading`]: the same, building only the fields a reader reads (the others are
//!   checked, not built), and at most [`MAX_LINE_VALUES`] values and keys: a line of 64 MiB
//!   could otherwise hold gigabytes as a `Value`. [`struct_fields`] names a typed reader's
//!   fields.
//! - [`from_object`]: a line's typed fields, from its object, with an error that names the field
//!   it is about (`field "position": invalid type: string "33", expected usize`; serde alone says
//!   only `invalid type: ...`).

use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IgnoredAny, Visitor};
use serde_json::{Map, Number, Value};

/// Why a line has no JSON value.
#[derive(Debug)]
#[non_exhaustive]
pub enum LineError {
    /// Empty, or only whitespace.
    Blank,
    /// Starts with a UTF-8 byte order mark, which only a file's first line may (the readers skip
    /// it there): serde_json would call it "expected value at line 1 column 1".
    ByteOrderMark,
    /// Not JSON (serde_json's message, with its position).
    Syntax(serde_json::Error),
    /// More than [`MAX_LINE_VALUES`] values and keys held at once.
    TooManyValues,
    /// Arrays and objects nested past serde_json's limit (128), which may be valid JSON.
    TooDeep(serde_json::Error),
}

impl LineError {
    /// The error for a reader's message: a syntax error as serde_json says it, after `syntax`
    /// ("invalid JSON"), anything else as it displays.
    pub fn message(&self, syntax: &str) -> String {
        match self {
            LineError::Syntax(e) => format!("{syntax}: {e}"),
            e => e.to_string(),
        }
    }
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineError::Blank => f.write_str("blank line"),
            LineError::ByteOrderMark => f.write_str(
                "the line starts with a UTF-8 byte order mark (U+FEFF), which only the file's \
                 first line may (were files with one joined?); remove it",
            ),
            LineError::Syntax(e) => e.fmt(f),
            LineError::TooDeep(e) => write!(
                f,
                "arrays and objects nested more than 128 deep, the reader's limit (at column {})",
                e.column()
            ),
            LineError::TooManyValues => write!(
                f,
                "too many JSON values: more than {MAX_LINE_VALUES} values and keys in the fields \
                 read (a field not read counts only its keys)"
            ),
        }
    }
}

/// A key that one object of a line holds twice: the first such in the order of the text among
/// the fields the reader reads, or when they hold none, among the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Duplicate {
    /// The key held twice.
    pub key: String,
    /// Where the object holding it is, as a path from the line's object (`id.a[0]`); empty when
    /// it is the line's object itself.
    pub within: String,
    /// The key of the line's object the duplicate is, or is inside of.
    pub field: String,
}

impl fmt::Display for Duplicate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "duplicate key {:?}", self.key)?;
        if !self.within.is_empty() {
            write!(f, " in {}", self.within)?;
        }
        Ok(())
    }
}

/// The most JSON values and object keys one line may hold at once while it is read (each
/// scalar, array and object of the fields a reader reads counts, and each key): about 80 MB
/// at most, where serde_json's own `Value` of a 64 MiB line could take 2.4 GB (an array of
/// numbers: 32 bytes each, more in a map). No document, candidate or prompt comes near it: a
/// GPT-J context is 2,048 tokens.
pub const MAX_LINE_VALUES: usize = 1 << 19;

/// A line's JSON value, and the first key held twice by one of its objects, if any (the value
/// then keeps the first of the two, but a caller refuses the line: it can still read other
/// fields first, to echo an id). A line of whitespace only is [`LineError::Blank`], one that
/// starts with a byte order mark [`LineError::ByteOrderMark`] (a reader strips the one before
/// line 1 before asking).
pub fn parse_line(line: &str) -> Result<(Value, Option<Duplicate>), LineError> {
    parse_line_reading(line, |_| true)
}

/// [`parse_line`] for a reader of some fields only: a field of the line's object that `reads`
/// does not name keeps its key, with null for its value, and is only checked (valid JSON, no key
/// held twice inside it), never built. A strict reader still refuses the key by name; an
/// ignored field costs no memory but its keys. The line's value must be an object for this to
/// skip anything. The duplicate answered is the first in a field read, if any: one in a field
/// not read comes only when the fields read hold none.
pub fn parse_line_reading(
    line: &str,
    reads: impl Fn(&str) -> bool,
) -> Result<(Value, Option<Duplicate>), LineError> {
    parse(line, &reads, MAX_LINE_VALUES)
}

/// Whether `field` of the line's object is held twice or holds a key held twice, given the
/// duplicate [`parse_line_reading`] reported: that names one, the first in the fields read, so
/// another field's may hide `field`'s. Then the line (which parsed already) is read again for
/// `field` alone.
pub fn field_holds_duplicate(line: &str, field: &str, reported: Option<&Duplicate>) -> bool {
    match reported {
        None => false,
        Some(d) if d.field == field => true,
        Some(_) => matches!(
            parse_line_reading(line, |key| key == field),
            Ok((_, Some(d))) if d.field == field
        ),
    }
}

/// [`parse_line_reading`] holding at most `max_values` values and keys.
fn parse(
    line: &str,
    reads: &dyn Fn(&str) -> bool,
    max_values: usize,
) -> Result<(Value, Option<Duplicate>), LineError> {
    if line.starts_with('\u{feff}') {
        return Err(LineError::ByteOrderMark);
    }
    if line.trim().is_empty() {
        return Err(LineError::Blank);
    }
    let mut reading = Reading {
        duplicate: None,
        held: 0,
        max: max_values,
        over: false,
        reads,
    };
    let mut de = serde_json::Deserializer::from_str(line);
    let value = ValueSeed {
        reading: &mut reading,
        at: None,
        build: true,
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|()| v));
    match value {
        Ok(v) => Ok((v, reading.duplicate)),
        Err(_) if reading.over => Err(LineError::TooManyValues),
        // serde_json says so only in its message.
        Err(e) if e.to_string().starts_with("recursion limit exceeded") => {
            Err(LineError::TooDeep(e))
        }
        Err(e) => Err(LineError::Syntax(e)),
    }
}

/// The names of the fields a derived `Deserialize` of struct `T` reads (serde hands them to
/// `deserialize_struct`), renames applied: what a strict reader passes to
/// [`parse_line_reading`]. Empty for a type that is not such a struct.
pub fn struct_fields<T: DeserializeOwned>() -> &'static [&'static str] {
    /// A deserializer that only notes the fields it is asked for, then stops.
    struct Fields(&'static [&'static str]);

    impl<'de> de::Deserializer<'de> for &mut Fields {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            self.0 = fields;
            Err(de::Error::custom("fields noted"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    let mut fields = Fields(&[]);
    let _ = T::deserialize(&mut fields);
    fields.0
}

/// One step of the path from the line's object to the value being read.
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

/// The path to the value being read, innermost step first (on the stack: nothing is allocated
/// unless a duplicate is found).
struct Path<'a> {
    step: Step<'a>,
    parent: Option<&'a Path<'a>>,
}

impl Path<'_> {
    /// The key of the line's object at the root of this path.
    fn field(&self) -> &str {
        let mut p = self;
        while let Some(parent) = p.parent {
            p = parent;
        }
        match p.step {
            Step::Key(k) => k,
            Step::Index(_) => "",
        }
    }
}

fn render(path: Option<&Path<'_>>) -> String {
    let mut steps = Vec::new();
    let mut p = path;
    while let Some(at) = p {
        steps.push(&at.step);
        p = at.parent;
    }
    let mut out = String::new();
    for step in steps.into_iter().rev() {
        match step {
            Step::Key(k) if out.is_empty() => out.push_str(k),
            Step::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
            Step::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// What one line's read has found so far, across its values.
struct Reading<'r> {
    /// The first key held twice.
    duplicate: Option<Duplicate>,
    /// Values and keys held now (built values stay; an unread object's keys go when it ends).
    held: usize,
    /// The most `held` may be.
    max: usize,
    /// Whether `held` went past `max` (the read was stopped there).
    over: bool,
    /// Which fields of the line's object are built.
    reads: &'r dyn Fn(&str) -> bool,
}

impl Reading<'_> {
    /// Counts `n` more values or keys held, or stops the read past the limit.
    fn hold<E: de::Error>(&mut self, n: usize) -> Result<(), E> {
        self.held += n;
        if self.held > self.max {
            self.over = true;
            return Err(E::custom("too many values"));
        }
        Ok(())
    }

    /// Notes `key` held twice in the object at `at`, if it is the first such, or the first in a
    /// field read after others in fields not read: the duplicate a reader must hear of is one
    /// in what it reads (a caller that refuses duplicates only there, or echoes a field unless
    /// it holds the duplicate, would otherwise miss it behind one it ignores).
    fn duplicate(&mut self, key: &str, at: Option<&Path<'_>>) {
        let field = at.map_or(key, Path::field);
        let noted = match &self.duplicate {
            None => true,
            Some(first) => (self.reads)(field) && !(self.reads)(&first.field),
        };
        if noted {
            self.duplicate = Some(Duplicate {
                field: field.to_owned(),
                within: render(at),
                key: key.to_owned(),
            });
        }
    }
}

/// Builds a `Value` as serde_json's own `Deserialize` does, noting the first duplicate key and
/// counting what it holds; or, when not `build`, only checks the value (and answers null).
struct ValueSeed<'a, 'r, 'p> {
    reading: &'a mut Reading<'r>,
    at: Option<&'p Path<'p>>,
    build: bool,
}

impl ValueSeed<'_, '_, '_> {
    /// `value`, counted, if this value is built; null otherwise.
    fn scalar<E: de::Error>(self, value: impl FnOnce() -> Value) -> Result<Value, E> {
        if !self.build {
            return Ok(Value::Null);
        }
        self.reading.hold(1)?;
        Ok(value())
    }
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_, '_, '_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_, '_, '_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        self.scalar(|| Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        self.scalar(|| Value::Number(v.into()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        self.scalar(|| Value::Number(v.into()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        // As serde_json's `Value` (a parsed number is always finite).
        self.scalar(|| Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        self.scalar(|| Value::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        self.scalar(|| Value::String(v))
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        self.scalar(|| Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        self.scalar(|| Value::Null)
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        if self.build {
            self.reading.hold(1)?;
        }
        let mut out = Vec::new();
        for index in 0.. {
            let at = Path {
                step: Step::Index(index),
                parent: self.at,
            };
            let seed = ValueSeed {
                reading: &mut *self.reading,
                at: Some(&at),
                build: self.build,
            };
            match seq.next_element_seed(seed)? {
                Some(v) if self.build => out.push(v),
                Some(_) => {}
                None => break,
            }
        }
        Ok(if self.build {
            Value::Array(out)
        } else {
            Value::Null
        })
    }

    fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        if self.build {
            self.reading.hold(1)?;
        }
        // The keys seen: the object itself when it is built, a set of them otherwise.
        let (mut out, mut seen) = (Map::new(), std::collections::HashSet::new());
        while let Some(key) = map.next_key::<String>()? {
            let held_twice = if self.build {
                out.contains_key(&key)
            } else {
                seen.contains(&key)
            };
            if held_twice {
                map.next_value::<IgnoredAny>()?;
                self.reading.duplicate(&key, self.at);
                continue;
            }
            self.reading.hold(1)?;
            // Of the line's object, only the fields read are built.
            let build = self.build && (self.at.is_some() || (self.reading.reads)(&key));
            let at = Path {
                step: Step::Key(&key),
                parent: self.at,
            };
            let value = map.next_value_seed(ValueSeed {
                reading: &mut *self.reading,
                at: Some(&at),
                build,
            })?;
            if self.build {
                out.insert(key, value);
            } else {
                seen.insert(key);
            }
        }
        self.reading.held -= seen.len();
        Ok(if self.build {
            Value::Object(out)
        } else {
            Value::Null
        })
    }
}

/// `T` from a line's object, as `serde_json::from_value` reads it, but an error about one
/// field's value names the field (`field "position": invalid type: ...`; a value inside one by
/// its path, `field "weights[1]"`), through `serde_path_to_error`. Errors about the object as a
/// whole (a missing or unknown field) are serde's own.
pub fn from_object<T: DeserializeOwned>(obj: Map<String, Value>) -> Result<T, serde_json::Error> {
    serde_path_to_error::deserialize(Value::Object(obj)).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        // An unknown key is its own path, and serde's message names it already.
        if path == "." || inner.to_string().starts_with("unknown field") {
            inner
        } else {
            de::Error::custom(format_args!("field {path:?}: {inner}"))
        }
    })
}

/// `text` without one leading UTF-8 byte order mark, which Windows editors write and serde_json
/// reads as "expected value at line 1 column 1". Every JSON file of a checkpoint folder is read
/// through it (config.json, model.safetensors.index.json) or its twin over bytes,
/// [`strip_bom_bytes`] (tokenizer.json), so that they agree.
pub fn strip_bom(text: &str) -> &str {
    text.strip_prefix('\u{feff}').unwrap_or(text)
}

/// [`strip_bom`] of bytes not yet known to be UTF-8.
pub fn strip_bom_bytes(bytes: &[u8]) -> &[u8] {
    bytes.strip_prefix("\u{feff}".as_bytes()).unwrap_or(bytes)
}

/// `T` from a whole JSON text that must be one object (a config file, an output record, a
/// server's reply), read as strictly as a line: a key held twice (at any depth) and anything but
/// an object are errors. serde alone builds a struct from an array of its fields in order
/// (`[2, "id", ...]`), and keeps the last of two keys in a map, a `Value` or a flattened
/// field (a struct's own fields it refuses twice). A leading UTF-8 byte order mark is skipped.
/// The error says what is wrong, without the file's name (the caller adds it).
/// At most [`MAX_LINE_VALUES`] values and keys are held (a settings file, a summary or a reply
/// holds a few hundred).
pub fn object_from_str<T: DeserializeOwned>(text: &str) -> Result<T, String> {
    object_from_str_within(text, MAX_LINE_VALUES)
}

/// [`object_from_str`] holding at most `max_values` values and keys: `usize::MAX` for a record
/// this program wrote, as large as the run that wrote it held it (a document's calls can number
/// tens of thousands).
pub fn object_from_str_within<T: DeserializeOwned>(
    text: &str,
    max_values: usize,
) -> Result<T, String> {
    let text = strip_bom(text);
    let (value, duplicate) = parse(text, &|_| true, max_values).map_err(|e| match e {
        LineError::Blank => "empty".to_string(),
        // Only a second one is left to find here.
        LineError::ByteOrderMark => {
            "not valid JSON: it starts with two UTF-8 byte order marks (U+FEFF)".to_string()
        }
        LineError::Syntax(e) => format!("not valid JSON: {e}"),
        e @ LineError::TooDeep(_) => e.to_string(),
        // Every field is read here: the line's wording ("in the fields read") would mislead.
        LineError::TooManyValues => {
            format!("too many JSON values: more than {max_values} values and keys")
        }
    })?;
    if let Some(d) = duplicate {
        return Err(d.to_string());
    }
    let Value::Object(obj) = value else {
        return Err(format!("not a JSON object (it is {})", value_kind(&value)));
    };
    from_object(obj).map_err(|e| e.to_string())
}

/// The first number in `value`, at any depth, that is not an integer in the 64-bit range.
/// serde_json reads a wider integer as a float, so such a value would be written back as another
/// number (18446744073709551617 as 1.8446744073709552e19).
pub fn first_inexact_number(value: &Value) -> Option<&Number> {
    match value {
        Value::Number(n) => (!n.is_i64() && !n.is_u64()).then_some(n),
        Value::Array(items) => items.iter().find_map(first_inexact_number),
        Value::Object(map) => map.values().find_map(first_inexact_number),
        Value::Null | Value::Bool(_) | Value::String(_) => None,
    }
}

/// A JSON value's kind, with its article, for messages.
pub fn value_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    fn dup(line: &str) -> Option<Duplicate> {
        parse_line(line).unwrap().1
    }

    #[test]
    fn a_whole_text_must_be_one_object_with_each_key_once() {
        #[derive(Deserialize, Debug, PartialEq)]
        struct Two {
            a: u32,
            b: String,
        }
        let read = object_from_str::<Two>;
        let two = Two {
            a: 1,
            b: "x".into(),
        };
        assert_eq!(read("{\n \"a\": 1,\n \"b\": \"x\"\n}\n").unwrap(), two);
        assert_eq!(read("\u{feff}{\"a\": 1, \"b\": \"x\"}").unwrap(), two);
        // serde_json alone takes the array as the struct's fields in order.
        assert!(serde_json::from_str::<Two>(r#"[1, "x"]"#).is_ok());
        for (text, want) in [
            (r#"[1, "x"]"#, "not a JSON object (it is an array)"),
            ("7", "not a JSON object (it is a number)"),
            (r#"{"a": 1, "b": "x", "a": 2}"#, "duplicate key \"a\""),
            (r#"{"a": "1", "b": "x"}"#, "field \"a\""),
            ("", "empty"),
            ("{", "not valid JSON"),
        ] {
            let err = read(text).unwrap_err();
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn values_are_serde_jsons() {
        for line in [
            r#"{"id": "a", "n": [1, -2, 3.5, 1e300, 18446744073709551615, -9223372036854775808]}"#,
            r#"{"b": true, "z": null, "s": "\u00e9\n\"", "o": {"x": [[], {}]}, "a": 0}"#,
            "[1, 2]",
            " 7 ",
            r#""text""#,
            "null",
            "0.1",
            "2.2250738585072014e-308",
        ] {
            let (value, duplicate) = parse_line(line).unwrap();
            assert_eq!(duplicate, None, "{line}");
            let theirs: Value = serde_json::from_str(line).unwrap();
            assert_eq!(value, theirs, "{line}");
            // Same text back as serde_json's own, key order included.
            assert_eq!(value.to_string(), theirs.to_string(), "{line}");
        }
    }

    #[test]
    fn syntax_errors_and_blank_lines() {
        for line in ["", " ", "\t \r", "\u{a0}"] {
            assert!(
                matches!(parse_line(line), Err(LineError::Blank)),
                "{line:?}"
            );
        }
        assert_eq!(parse_line("  ").unwrap_err().to_string(), "blank line");
        for line in ["{", "{\"a\": 1} x", "[1,]", "{\"a\" 1}", "nul"] {
            let e = parse_line(line).unwrap_err();
            let theirs = serde_json::from_str::<Value>(line).unwrap_err();
            assert_eq!(e.to_string(), theirs.to_string(), "{line}");
        }
        // Valid JSON nested past serde_json's limit is named as that, not as malformed.
        let deep = format!("{{\"id\": {}1{}}}", "[".repeat(200), "]".repeat(200));
        let e = parse_line(&deep).unwrap_err();
        assert!(matches!(e, LineError::TooDeep(_)), "{e:?}");
        assert!(e
            .to_string()
            .starts_with("arrays and objects nested more than 128 deep"));
        let fine = format!("{{\"id\": {}1{}}}", "[".repeat(100), "]".repeat(100));
        parse_line(&fine).unwrap();
    }

    /// A byte order mark past line 1 (files joined with `cat`) is named, not "expected value at
    /// line 1 column 1"; a whole text skips one, and names a second.
    #[test]
    fn a_byte_order_mark_is_named() {
        for line in ["\u{feff}{\"a\": 1}", "\u{feff}", "\u{feff}  "] {
            let e = parse_line(line).unwrap_err();
            assert!(matches!(e, LineError::ByteOrderMark), "{line:?}");
            assert!(e.to_string().contains("byte order mark"), "{e}");
        }
        #[derive(Debug, serde::Deserialize)]
        struct A {
            a: u8,
        }
        assert_eq!(object_from_str::<A>("\u{feff}{\"a\": 1}").unwrap().a, 1);
        let e = object_from_str::<A>("\u{feff}\u{feff}{\"a\": 1}").unwrap_err();
        assert!(e.contains("two UTF-8 byte order marks"), "{e}");
    }

    #[test]
    fn the_first_duplicate_key_is_named_at_any_depth() {
        let line = r#"{"id":"a","text":"Out of 540 voters.","text":""}"#;
        let (value, d) = parse_line(line).unwrap();
        let d = d.unwrap();
        assert_eq!(d.to_string(), "duplicate key \"text\"");
        assert_eq!(
            (d.key.as_str(), d.within.as_str(), d.field.as_str()),
            ("text", "", "text")
        );
        // The first of the two is kept; other fields are there to read.
        assert_eq!(value["text"], "Out of 540 voters.");
        assert_eq!(value["id"], "a");
        let d = dup(r#"{"weights":[1],"weights":[0],"id":1,"id":2}"#).unwrap();
        assert_eq!(d.to_string(), "duplicate key \"weights\"");
        let d = dup(r#"{"id": {"a": [0, {"b": 1, "b": 2}]}, "x": 1, "x": 2}"#).unwrap();
        assert_eq!(d.to_string(), "duplicate key \"b\" in id.a[1]");
        assert_eq!(d.field, "id");
        let d = dup(r#"[{"k": 1}, {"k": 1, "k": 1}]"#).unwrap();
        assert_eq!(
            (d.to_string().as_str(), d.field.as_str()),
            ("duplicate key \"k\" in [1]", "")
        );
        // Escapes are read before comparing: "\u0074ext" is "text".
        assert_eq!(
            dup(r#"{"text": "a", "\u0074ext": "b"}"#).unwrap().key,
            "text"
        );
        // Equal keys in different objects are no duplicates.
        assert_eq!(
            dup(r#"{"a": {"a": {"a": 1}}, "b": [{"a": 1}, {"a": 2}]}"#),
            None
        );
    }

    #[test]
    fn fields_not_read_are_checked_not_built() {
        let text_only = |line: &str| parse_line_reading(line, |k| k == "text");
        let line = r#"{"a": [1, {"b": 2}], "text": "t", "c": "x"}"#;
        let (value, d) = text_only(line).unwrap();
        assert_eq!(d, None);
        // The keys stay for a strict reader to refuse by name: in order with the driver's
        // serde_json (preserve_order), sorted in the core alone.
        let order = if cfg!(feature = "annotate") {
            r#"{"a":null,"text":"t","c":null}"#
        } else {
            r#"{"a":null,"c":null,"text":"t"}"#
        };
        assert_eq!(value.to_string(), order);
        // Inside them, a key held twice is still found, with its path.
        let d = text_only(r#"{"x": [{"k": 1, "k": 2}], "text": "t"}"#)
            .unwrap()
            .1
            .unwrap();
        assert_eq!(
            (d.to_string().as_str(), d.field.as_str()),
            ("duplicate key \"k\" in x[0]", "x")
        );
        assert_eq!(
            text_only(r#"{"x": 1, "x": 2}"#).unwrap().1.unwrap().key,
            "x"
        );
        // And a syntax error is serde_json's, as anywhere.
        let bad = r#"{"x": [1, 2,], "text": "t"}"#;
        let theirs = serde_json::from_str::<Value>(bad).unwrap_err().to_string();
        assert_eq!(text_only(bad).unwrap_err().to_string(), theirs);
        // Only the line's own object has fields to skip.
        assert_eq!(
            text_only("[1, {\"a\": 2}]").unwrap().0,
            serde_json::json!([1, {"a": 2}])
        );
    }

    #[test]
    fn a_duplicate_in_a_field_read_outranks_an_earlier_one_elsewhere() {
        let reading = |line: &str, field: &'static str| {
            parse_line_reading(line, move |k| k == field)
                .unwrap()
                .1
                .map(|d| d.to_string())
        };
        let line = r#"{"x": {"a": 1, "a": 2}, "text": "a", "text": "b", "y": 1, "y": 2}"#;
        assert_eq!(
            reading(line, "text").as_deref(),
            Some("duplicate key \"text\"")
        );
        // Reading every field, or none that holds one, the first in the text is the one.
        assert_eq!(
            dup(line).map(|d| d.to_string()).as_deref(),
            Some("duplicate key \"a\" in x")
        );
        assert_eq!(
            reading(line, "id").as_deref(),
            Some("duplicate key \"a\" in x")
        );
        // Of two in fields read, the first still.
        let line = r#"{"x": [1, 1], "id": [{"k": 0, "k": 1}], "x": 2, "id": 3}"#;
        assert_eq!(
            reading(line, "id").as_deref(),
            Some("duplicate key \"k\" in id[0]")
        );
        assert_eq!(reading(line, "x").as_deref(), Some("duplicate key \"x\""));
    }

    #[test]
    fn a_field_holding_a_duplicate_is_found_behind_another() {
        let all = |line: &str| parse_line(line).unwrap().1;
        for (line, id, text) in [
            (r#"{"id": 1, "text": "a"}"#, false, false),
            (r#"{"text": "a", "text": "b", "id": 1}"#, false, true),
            (
                r#"{"text": "a", "text": "b", "id": 1, "id": 2}"#,
                true,
                true,
            ),
            (
                r#"{"text": {"k": 1, "k": 2}, "id": {"k": 1, "k": 2}}"#,
                true,
                true,
            ),
            (r#"{"x": 1, "x": 2, "id": [{"k": 1, "k": 2}]}"#, true, false),
        ] {
            let d = all(line);
            assert_eq!(field_holds_duplicate(line, "id", d.as_ref()), id, "{line}");
            assert_eq!(
                field_holds_duplicate(line, "text", d.as_ref()),
                text,
                "{line}"
            );
        }
    }

    #[test]
    fn a_line_holds_at_most_max_line_values() {
        let numbers =
            |field: &str, n: usize| format!(r#"{{"{field}": [{}0]}}"#, "0,".repeat(n - 1));
        let reading_a = |line: &str| parse_line_reading(line, |k| k == "a");
        // The object, its key "a", the array and its numbers.
        let fits = MAX_LINE_VALUES - 3;
        let (value, _) = reading_a(&numbers("a", fits)).unwrap();
        assert_eq!(value["a"].as_array().map(Vec::len), Some(fits));
        let e = reading_a(&numbers("a", fits + 1)).unwrap_err();
        assert!(matches!(e, LineError::TooManyValues), "{e}");
        assert!(
            e.to_string()
                .starts_with("too many JSON values: more than 524288"),
            "{e}"
        );
        // A whole text is capped the same, unless its reader lifts the cap (its own records).
        let many = numbers("a", fits + 1);
        let e = object_from_str::<Map<String, Value>>(&many).unwrap_err();
        assert_eq!(e, "too many JSON values: more than 524288 values and keys");
        assert!(object_from_str_within::<Map<String, Value>>(&many, usize::MAX).is_ok());
        // Numbers of a field not read cost nothing; keys are held while their object is read.
        assert!(reading_a(&numbers("b", 4 * MAX_LINE_VALUES)).is_ok());
        let keys = |n: usize| {
            let keys: Vec<String> = (0..n).map(|i| format!(r#""{i}":0"#)).collect();
            format!(r#"{{"b": {{{}}}}}"#, keys.join(","))
        };
        // The object and its key "b", then the inner object's keys.
        assert!(reading_a(&keys(MAX_LINE_VALUES - 2)).is_ok());
        let e = reading_a(&keys(MAX_LINE_VALUES - 1)).unwrap_err();
        assert!(matches!(e, LineError::TooManyValues), "{e}");
        let small = format!(
            r#"{{"b": [{}{{"k":0}}]}}"#,
            r#"{"k":0},"#.repeat(MAX_LINE_VALUES)
        );
        assert!(reading_a(&small).is_ok());
    }

    #[test]
    fn struct_fields_are_serdes() {
        assert_eq!(
            struct_fields::<Fields>(),
            ["position", "text", "weights", "id"]
        );
        #[derive(Deserialize)]
        #[allow(dead_code)]
        struct Renamed {
            #[serde(rename = "tau_f")]
            tau: f64,
        }
        assert_eq!(struct_fields::<Renamed>(), ["tau_f"]);
        assert!(struct_fields::<Value>().is_empty());
        assert!(struct_fields::<Vec<u32>>().is_empty());
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Fields {
        position: usize,
        text: String,
        #[serde(default)]
        weights: Option<Vec<f64>>,
        #[serde(default)]
        id: Value,
    }

    fn fields(line: &str) -> Result<Fields, String> {
        let Value::Object(obj) = serde_json::from_str(line).unwrap() else {
            panic!("{line}")
        };
        from_object(obj).map_err(|e| e.to_string())
    }

    #[test]
    fn field_errors_name_the_field() {
        let f = fields(r#"{"id": [1], "text": "t", "position": 3, "weights": null}"#).unwrap();
        assert_eq!(
            (f.position, f.text.as_str(), f.weights, f.id),
            (3, "t", None, Value::from(vec![1]))
        );
        let f = fields(r#"{"text": "t", "position": 3, "weights": [1, 0.5]}"#).unwrap();
        assert_eq!(f.weights, Some(vec![1.0, 0.5]));
        for (line, want) in [
            (
                r#"{"text": "t", "position": "33"}"#,
                r#"field "position": invalid type: string "33", expected usize"#,
            ),
            (
                r#"{"text": null, "position": 1}"#,
                r#"field "text": invalid type: null, expected a string"#,
            ),
            (
                r#"{"text": "t", "position": -1}"#,
                r#"field "position": invalid value: integer `-1`, expected usize"#,
            ),
            (
                r#"{"text": "t", "position": 1, "weights": [1, "a"]}"#,
                r#"field "weights[1]": invalid type: string "a", expected f64"#,
            ),
            (
                r#"{"text": "t", "position": 1, "weights": 1}"#,
                r#"field "weights": invalid type: integer `1`, expected a sequence"#,
            ),
            // Errors about the object itself are serde's.
            (r#"{"text": "t"}"#, "missing field `position`"),
            (
                r#"{"text": "t", "position": 1, "wieghts": [1]}"#,
                "unknown field `wieghts`, expected one of `position`, `text`, `weights`, `id`",
            ),
        ] {
            assert_eq!(fields(line).unwrap_err(), want, "{line}");
        }
    }

    /// Only a number outside the 64-bit integers (read as a float) is inexact: i64::MIN and
    /// u64::MAX are exact, and an inexact one is found at any depth.
    #[test]
    fn inexact_numbers_are_those_read_as_floats() {
        let exact: Value = serde_json::from_str(
            r#"{"a": [0, -9223372036854775808, 18446744073709551615], "b": {"c": 9223372036854775808}}"#,
        )
        .unwrap();
        assert_eq!(first_inexact_number(&exact), None);
        let wide: Value =
            serde_json::from_str(r#"{"a": [1, {"b": 18446744073709551616}], "c": 2.5}"#).unwrap();
        assert_eq!(
            first_inexact_number(&wide).and_then(Number::as_f64),
            Some(18446744073709551616.0)
        );
    }
}
