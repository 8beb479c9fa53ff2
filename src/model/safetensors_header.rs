//! A safetensors header screened before the safetensors crate reads it.
//!
//! The crate (0.8) buffers the whole header into serde's generic content tree (its metadata
//! struct has a `#[serde(flatten)]` map) before it checks anything, at 32 bytes or more per JSON
//! value: a 16 MiB header of one shape `[0,0,0,...]` made it allocate 576 MiB at once. The
//! screen streams the header, keeping only the entries' names, and passes only what a
//! safetensors header holds:
//!
//! - one JSON object, each key once;
//! - per tensor, an object of exactly `dtype` (a string), `shape` (at most `max_dims` sizes) and
//!   `data_offsets` (two offsets, neither past the end of the data), each once;
//! - optionally `__metadata__`: `null` or an object of strings, each key once.
//!
//! What passes costs the crate a bounded multiple of the header's size. Whether a dtype is known
//! and the offsets tile the data is still the crate's to check; offsets past the data are refused
//! here because the crate (0.8) sums them unchecked, and a chain of huge ones overflows that sum
//! (a panic where overflow checks are on, as in debug and test builds).

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// What is wrong with a header.
#[derive(Debug)]
pub(super) struct Flaw {
    /// The entry at fault (a tensor's name, or `__metadata__`); None for the header as a whole.
    pub entry: Option<String>,
    /// What is wrong (serde_json's message, with the position in the header).
    pub msg: String,
}

/// Checks `header` (the JSON after the 8-byte length) as the module's doc describes;
/// `data_bytes` is the length of the data after it.
pub(super) fn screen(header: &[u8], max_dims: usize, data_bytes: u64) -> Result<(), Flaw> {
    let mut at = None;
    let mut de = serde_json::Deserializer::from_slice(header);
    let result = HeaderSeed {
        max_dims,
        data_bytes,
        at: &mut at,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    result.map_err(|e| Flaw {
        entry: at,
        msg: e.to_string(),
    })
}

/// The one key of the header that is not a tensor.
pub(super) const METADATA: &str = "__metadata__";
const FIELDS: [&str; 3] = ["dtype", "shape", "data_offsets"];

/// The header's object; leaves in `at` the key whose entry was being read when reading failed.
struct HeaderSeed<'a> {
    max_dims: usize,
    data_bytes: u64,
    at: &'a mut Option<String>,
}

impl<'de> DeserializeSeed<'de> for HeaderSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for HeaderSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object of tensor entries")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut names = HashSet::new();
        while let Some(name) = map.next_key::<String>()? {
            let twice = names.contains(&name);
            *self.at = Some(name);
            if twice {
                return Err(de::Error::custom(
                    "appears twice in the header: which would be loaded?",
                ));
            }
            if self.at.as_deref() == Some(METADATA) {
                map.next_value_seed(Metadata)?;
            } else {
                map.next_value_seed(Entry {
                    max_dims: self.max_dims,
                    data_bytes: self.data_bytes,
                })?;
            }
            names.extend(self.at.take());
        }
        Ok(())
    }
}

/// One tensor's entry.
struct Entry {
    max_dims: usize,
    data_bytes: u64,
}

impl<'de> DeserializeSeed<'de> for Entry {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Entry {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a tensor entry {\"dtype\", \"shape\", \"data_offsets\"}")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = [false; FIELDS.len()];
        while let Some(key) = map.next_key::<String>()? {
            let Some(field) = FIELDS.iter().position(|f| *f == key) else {
                return Err(de::Error::custom(format!(
                    "unexpected field {key:?} (a tensor's entry holds dtype, shape and \
                     data_offsets)"
                )));
            };
            if std::mem::replace(&mut seen[field], true) {
                return Err(de::Error::custom(format!("field {key:?} appears twice")));
            }
            match field {
                0 => {
                    map.next_value::<String>()?;
                }
                1 => map.next_value_seed(Sizes {
                    what: "shape",
                    unit: "dimensions",
                    min: 0,
                    max: self.max_dims,
                    max_value: u64::MAX,
                })?,
                _ => map.next_value_seed(Sizes {
                    what: "data_offsets",
                    unit: "entries",
                    min: 2,
                    max: 2,
                    max_value: self.data_bytes,
                })?,
            }
        }
        match seen.iter().position(|s| !s) {
            Some(missing) => Err(de::Error::custom(format!(
                "no field {:?} (a tensor's entry holds dtype, shape and data_offsets)",
                FIELDS[missing]
            ))),
            None => Ok(()),
        }
    }
}

/// `__metadata__`: null, or an object of strings.
struct Metadata;

impl<'de> DeserializeSeed<'de> for Metadata {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Metadata {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("null or an object of strings")
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut keys = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if keys.contains(&key) {
                return Err(de::Error::custom(format!("key {key:?} appears twice")));
            }
            map.next_value::<String>()?;
            keys.insert(key);
        }
        Ok(())
    }
}

/// An array of `min..=max` unsigned integers of at most `max_value`, counted as they stream by.
struct Sizes {
    what: &'static str,
    /// What one entry is, for errors.
    unit: &'static str,
    min: usize,
    max: usize,
    max_value: u64,
}

impl<'de> DeserializeSeed<'de> for Sizes {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Sizes {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}: an array of unsigned integers", self.what)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut n = 0;
        while let Some(value) = seq.next_element::<u64>()? {
            if value > self.max_value {
                return Err(de::Error::custom(format!(
                    "{} holds {value}, past the end of the data ({} bytes): the file is \
                     truncated or corrupt",
                    self.what, self.max_value
                )));
            }
            n += 1;
            if n > self.max {
                return Err(de::Error::custom(format!(
                    "{} has more than {} {}",
                    self.what, self.max, self.unit
                )));
            }
        }
        if n < self.min {
            return Err(de::Error::custom(format!(
                "{} has {n} {}, not {}",
                self.what, self.unit, self.min
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flaw(header: &str) -> Option<(Option<String>, String)> {
        screen(header.as_bytes(), 4, 1000)
            .err()
            .map(|f| (f.entry, f.msg))
    }

    #[test]
    fn a_well_formed_header_passes() {
        let ok = r#"{"__metadata__": {"format": "pt"},
            "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
            "b": {"data_offsets": [24, 28], "shape": [], "dtype": "F32"}}    "#;
        assert!(flaw(ok).is_none(), "{:?}", flaw(ok));
        assert!(flaw(r#"{"__metadata__": null}"#).is_none());
        assert!(flaw("{}").is_none());
    }

    #[test]
    fn each_flaw_is_named_with_its_entry() {
        let entry = |e: &str| Some(e.to_string());
        for (header, at, says) in [
            (
                r#"{"a": {"dtype": "F32", "shape": [1,1,1,1,1], "data_offsets": [0,4]}}"#,
                entry("a"),
                "shape has more than 4 dimensions",
            ),
            (
                r#"{"a": {"dtype": "F32", "shape": [], "data_offsets": [0]}}"#,
                entry("a"),
                "data_offsets has 1 entries, not 2",
            ),
            (
                r#"{"a": {"dtype": "F32", "shape": [], "data_offsets": [0,4,8]}}"#,
                entry("a"),
                "data_offsets has more than 2 entries",
            ),
            (
                r#"{"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0,4]}}"#,
                entry("a"),
                "invalid value",
            ),
            (
                r#"{"a": {"dtype": 5, "shape": [], "data_offsets": [0,4]}}"#,
                entry("a"),
                "expected a string",
            ),
            (
                r#"{"a": {"dtype": "F32", "shape": [], "data_offsets": [0,4], "x": 1}}"#,
                entry("a"),
                "unexpected field \"x\"",
            ),
            (
                r#"{"a": {"dtype": "F32", "dtype": "F16", "shape": [], "data_offsets": [0,4]}}"#,
                entry("a"),
                "field \"dtype\" appears twice",
            ),
            (
                r#"{"a": {"dtype": "F32", "shape": []}}"#,
                entry("a"),
                "no field \"data_offsets\"",
            ),
            (
                r#"{"a": {"dtype": "F32", "shape": [], "data_offsets": [0,4]},
                 "a": {"dtype": "F32", "shape": [], "data_offsets": [4,8]}}"#,
                entry("a"),
                "appears twice in the header",
            ),
            (
                r#"{"__metadata__": {"k": "v", "k": "w"}}"#,
                entry(METADATA),
                "key \"k\" appears twice",
            ),
            (
                r#"{"__metadata__": {"k": [0, 0, 0]}}"#,
                entry(METADATA),
                "expected a string",
            ),
            (
                r#"{"a": {"dtype": "U8", "shape": [1001], "data_offsets": [0,1001]}}"#,
                entry("a"),
                "data_offsets holds 1001, past the end of the data (1000 bytes)",
            ),
            (r#"{"a": [0, 0, 0]}"#, entry("a"), "expected a tensor entry"),
            (r#"[0, 0, 0]"#, None, "expected a JSON object"),
            (r#"{"a": {"dtype": "F32""#, entry("a"), "EOF"),
            (r#"{} {}"#, None, "trailing characters"),
        ] {
            let (entry, msg) = flaw(header).unwrap_or_else(|| panic!("{header} passed"));
            assert_eq!(entry, at, "{header}: {msg}");
            assert!(msg.contains(says), "{header}: {msg}");
        }
    }

    /// Each of the three fields is required, not only the last.
    #[test]
    fn each_missing_field_is_named() {
        for (header, says) in [
            (
                r#"{"a": {"shape": [], "data_offsets": [0,4]}}"#,
                "no field \"dtype\"",
            ),
            (
                r#"{"a": {"dtype": "F32", "data_offsets": [0,4]}}"#,
                "no field \"shape\"",
            ),
        ] {
            let (entry, msg) = flaw(header).unwrap_or_else(|| panic!("{header} passed"));
            assert_eq!(entry.as_deref(), Some("a"), "{header}: {msg}");
            assert!(msg.contains(says), "{header}: {msg}");
        }
    }

    /// A flaw past a whole entry is the header's, not that entry's.
    #[test]
    fn a_flaw_after_a_whole_entry_names_no_entry() {
        for (header, says) in [
            (
                r#"{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0,4]}} x"#,
                "trailing characters",
            ),
            (
                r#"{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0,4]},"#,
                "EOF",
            ),
        ] {
            let (entry, msg) = flaw(header).unwrap_or_else(|| panic!("{header} passed"));
            assert_eq!(entry, None, "{header}: {msg}");
            assert!(msg.contains(says), "{header}: {msg}");
        }
    }
}
