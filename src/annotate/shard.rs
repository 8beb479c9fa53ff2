//! Deterministic sharding: input line L (1-based) belongs to shard (L - 1) % COUNT.
//!
//! The shard comes from, in order: `--shard INDEX/COUNT`; Kubernetes Indexed Jobs'
//! JOB_COMPLETION_INDEX with `--shards COUNT`; Slurm job arrays' SLURM_ARRAY_TASK_ID and
//! SLURM_ARRAY_TASK_COUNT (index (ID - SLURM_ARRAY_TASK_MIN) / SLURM_ARRAY_TASK_STEP, so
//! `--array=1-8` and `--array=0-14:2` work too); else 0/1.
//! A sharded run writes `<stem>.shard-IIIII-of-CCCCC.jsonl` (zero-padded to five digits, e.g.
//! `cstar.shard-00003-of-00008.jsonl`) next to `--out`, so every task of
//! an array can be given the same command; `toolsift merge` joins them.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::util::fs::{strip_ext, with_suffix};

/// One of `count` shards of a corpus: input line L is shard `(L - 1) % count`'s. 0/1 (the
/// default) is the whole corpus. Serialized as `{"index", "count"}` in the summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shard {
    /// This shard's 0-based index, below `count`.
    pub index: u64,
    /// Number of shards the corpus is split into (at least 1).
    pub count: u64,
}

impl Default for Shard {
    fn default() -> Self {
        Shard { index: 0, count: 1 }
    }
}

impl std::str::FromStr for Shard {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::input(format!("--shard {s:?}: expected INDEX/COUNT, e.g. 0/8"));
        let (i, c) = s.split_once('/').ok_or_else(bad)?;
        let number = |part: &str, what: &str| {
            part.trim().parse::<u64>().map_err(|e| {
                Error::input(format!(
                    "--shard {s:?}: expected INDEX/COUNT, e.g. 0/8 ({what} {part:?}: {e})"
                ))
            })
        };
        Shard::new(number(i, "INDEX")?, number(c, "COUNT")?)
    }
}

impl Shard {
    /// Shard `index` of `count`; fails (`Error::Input`) unless `index < count`.
    pub fn new(index: u64, count: u64) -> Result<Self> {
        if count == 0 {
            return Err(Error::input(format!(
                "shard {index}/0: the count must be at least 1"
            )));
        }
        if index >= count {
            return Err(Error::input(format!(
                "shard {index}/{count}: the index must be below the count (0-based)"
            )));
        }
        Ok(Shard { index, count })
    }

    /// Whether input line `line` (1-based) is this shard's.
    pub fn owns(&self, line: u64) -> bool {
        line >= 1 && (line - 1) % self.count == self.index
    }

    /// Lines of this shard among `total` input lines.
    pub fn lines_of(&self, total: u64) -> u64 {
        if total > self.index {
            (total - self.index).div_ceil(self.count)
        } else {
            0
        }
    }

    /// The output path of this shard for `--out out`.
    pub fn output_path(&self, out: &Path) -> PathBuf {
        if self.count == 1 {
            return out.to_owned();
        }
        let name = out.file_name().unwrap_or(OsStr::new("out.jsonl"));
        let (stem, ext) = match strip_ext(name, "jsonl") {
            Some(stem) => (stem, ".jsonl"),
            None => (name, ""),
        };
        let shard = format!("{}{ext}", self.name_part());
        out.with_file_name(with_suffix(stem, &shard))
    }

    /// What [`output_path`](Self::output_path) puts into a sharded output's name:
    /// ".shard-00002-of-00008".
    pub(crate) fn name_part(&self) -> String {
        format!(".shard-{:05}-of-{:05}", self.index, self.count)
    }

    /// The shard from flags, then the environment (`env` reads a variable).
    pub fn resolve(
        flag: Option<Shard>,
        shards: Option<u64>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Shard> {
        if let Some(s) = flag {
            return Ok(s);
        }
        let num = |name: &str| -> Result<Option<u64>> {
            match env(name) {
                None => Ok(None),
                Some(v) if v.trim().is_empty() => Ok(None),
                Some(v) => v.trim().parse().map(Some).map_err(|_| {
                    Error::input(format!("environment variable {name}={v:?} is not a number"))
                }),
            }
        };
        if let Some(index) = num("JOB_COMPLETION_INDEX")? {
            let count = shards.ok_or_else(|| {
                Error::input("JOB_COMPLETION_INDEX is set: give the job's completions as --shards")
            })?;
            return Shard::new(index, count);
        }
        if let Some(id) = num("SLURM_ARRAY_TASK_ID")? {
            let min = num("SLURM_ARRAY_TASK_MIN")?.unwrap_or(0);
            let (count, count_from) = match shards {
                Some(c) => (c, "--shards"),
                None => (
                    num("SLURM_ARRAY_TASK_COUNT")?.ok_or_else(|| {
                        Error::input("SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not")
                    })?,
                    "SLURM_ARRAY_TASK_COUNT",
                ),
            };
            let offset = id.checked_sub(min).ok_or_else(|| {
                Error::input(format!(
                    "SLURM_ARRAY_TASK_ID {id} is below SLURM_ARRAY_TASK_MIN {min}"
                ))
            })?;
            // `--array=0-15:2`: tasks 0, 2, ..., 14 are shards 0 to 7.
            let step = num("SLURM_ARRAY_TASK_STEP")?.unwrap_or(1).max(1);
            if offset % step != 0 {
                return Err(Error::input(format!(
                    "SLURM_ARRAY_TASK_ID {id} is not SLURM_ARRAY_TASK_MIN {min} plus a multiple \
                     of SLURM_ARRAY_TASK_STEP {step}; give --shard INDEX/COUNT"
                )));
            }
            return Shard::new(offset / step, count).map_err(|e| {
                // A count of Slurm's own falls short only for an array with gaps.
                let gaps = if shards.is_none() {
                    ": an array with gaps (--array=1,2,4) does not map to shards"
                } else {
                    ""
                };
                Error::input(format!(
                    "{e}, from SLURM_ARRAY_TASK_ID {id} (MIN {min}, STEP {step}) and {count_from} \
                     {count}{gaps}; give --shard INDEX/COUNT"
                ))
            });
        }
        match shards {
            Some(c) if c > 1 => Err(Error::input(
                "--shards without --shard, JOB_COMPLETION_INDEX or SLURM_ARRAY_TASK_ID",
            )),
            _ => Ok(Shard::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn shards_partition_lines() {
        let shards: Vec<Shard> = (0..3).map(|i| Shard::new(i, 3).unwrap()).collect();
        for line in 1..=10 {
            assert_eq!(shards.iter().filter(|s| s.owns(line)).count(), 1);
        }
        assert_eq!(shards.iter().map(|s| s.lines_of(10)).sum::<u64>(), 10);
        assert_eq!(Shard::new(2, 3).unwrap().lines_of(1), 0);
        // Line L is shard (L - 1) % COUNT's: line 1 is shard 0's, and there is no line 0.
        let first = Shard::new(0, 3).unwrap();
        assert!(first.owns(1) && first.owns(4) && !first.owns(3));
        assert!(shards.iter().all(|s| !s.owns(0)));
        let err = |s: &str| s.parse::<Shard>().unwrap_err().to_string();
        assert!(err("3/3").contains("3/3: the index must be below the count"));
        assert!(err("0/0").contains("0/0: the count must be at least 1"));
        let err = "1/18446744073709551616"
            .parse::<Shard>()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("COUNT \"18446744073709551616\": number too large"),
            "{err}"
        );
        assert_eq!(
            "1/4".parse::<Shard>().unwrap(),
            Shard { index: 1, count: 4 }
        );
        assert_eq!(
            " 1 / 4 ".parse::<Shard>().unwrap(),
            Shard { index: 1, count: 4 }
        );
        assert_eq!(
            Shard::new(3, 8)
                .unwrap()
                .output_path(Path::new("o/c.jsonl")),
            Path::new("o/c.shard-00003-of-00008.jsonl")
        );
        assert_eq!(
            Shard::new(0, 2).unwrap().output_path(Path::new("cstar")),
            Path::new("cstar.shard-00000-of-00002")
        );
    }

    /// A file name that is not UTF-8 keeps its bytes (it used to be mapped lossily, so two
    /// such names could share their shards' files).
    #[cfg(unix)]
    #[test]
    fn names_that_are_not_utf8_keep_their_bytes() {
        use std::os::unix::ffi::OsStrExt;
        let out = Path::new(std::ffi::OsStr::from_bytes(b"o/c\xff.jsonl"));
        let shard = Shard::new(1, 2).unwrap().output_path(out);
        assert_eq!(
            shard.as_os_str().as_bytes(),
            b"o/c\xff.shard-00001-of-00002.jsonl"
        );
        let paths = super::super::writer::OutputPaths::new(&shard);
        assert_eq!(
            paths.rejects.as_os_str().as_bytes(),
            b"o/c\xff.shard-00001-of-00002.rejects.jsonl"
        );
        assert_eq!(
            paths.journal.as_os_str().as_bytes(),
            b"o/c\xff.shard-00001-of-00002.jsonl.partial"
        );
    }

    #[test]
    fn environment() {
        let none = Shard::resolve(None, None, env(&[])).unwrap();
        assert_eq!(none, Shard::default());
        let k8s = Shard::resolve(None, Some(4), env(&[("JOB_COMPLETION_INDEX", "2")])).unwrap();
        assert_eq!(k8s, Shard { index: 2, count: 4 });
        assert!(Shard::resolve(None, None, env(&[("JOB_COMPLETION_INDEX", "2")])).is_err());
        // Set but empty is unset; --shards 1 alone is the whole corpus.
        let empty = Shard::resolve(None, Some(1), env(&[("JOB_COMPLETION_INDEX", " ")]));
        assert_eq!(empty.unwrap(), Shard::default());
        // Kubernetes' index comes before Slurm's.
        let both = Shard::resolve(
            None,
            Some(4),
            env(&[("JOB_COMPLETION_INDEX", "1"), ("SLURM_ARRAY_TASK_ID", "3")]),
        );
        assert_eq!(both.unwrap(), Shard { index: 1, count: 4 });
        // Slurm without MIN starts at 0; a STEP of 0 is a step of 1.
        let plain = Shard::resolve(
            None,
            None,
            env(&[
                ("SLURM_ARRAY_TASK_ID", "3"),
                ("SLURM_ARRAY_TASK_COUNT", "8"),
                ("SLURM_ARRAY_TASK_STEP", "0"),
            ]),
        );
        assert_eq!(plain.unwrap(), Shard { index: 3, count: 8 });
        // A stepped Slurm array (--array=1-15:2): tasks 1, 3, ..., 15 are shards 0 to 7.
        let stepped = |id: &'static str| {
            Shard::resolve(
                None,
                None,
                env(&[
                    ("SLURM_ARRAY_TASK_ID", id),
                    ("SLURM_ARRAY_TASK_COUNT", "8"),
                    ("SLURM_ARRAY_TASK_MIN", "1"),
                    ("SLURM_ARRAY_TASK_STEP", "2"),
                ]),
            )
        };
        assert_eq!(stepped("15").unwrap(), Shard { index: 7, count: 8 });
        assert_eq!(stepped("1").unwrap(), Shard { index: 0, count: 8 });
        assert!(stepped("4").is_err());
        let slurm = Shard::resolve(
            None,
            None,
            env(&[
                ("SLURM_ARRAY_TASK_ID", "5"),
                ("SLURM_ARRAY_TASK_COUNT", "8"),
                ("SLURM_ARRAY_TASK_MIN", "1"),
            ]),
        )
        .unwrap();
        assert_eq!(slurm, Shard { index: 4, count: 8 });
        // An array with gaps (--array=1,2,4): task 4 is past the count, and the error says so.
        let gaps = Shard::resolve(
            None,
            None,
            env(&[
                ("SLURM_ARRAY_TASK_ID", "4"),
                ("SLURM_ARRAY_TASK_COUNT", "3"),
                ("SLURM_ARRAY_TASK_MIN", "1"),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            gaps.contains("SLURM_ARRAY_TASK_ID 4") && gaps.contains("with gaps"),
            "{gaps}"
        );
        let flag_count = Shard::resolve(None, Some(4), env(&[("SLURM_ARRAY_TASK_ID", "5")]))
            .unwrap_err()
            .to_string();
        assert!(
            flag_count.contains("and --shards 4") && !flag_count.contains("gaps"),
            "{flag_count}"
        );
        let flag = Shard::resolve(
            Some(Shard { index: 0, count: 2 }),
            None,
            env(&[("SLURM_ARRAY_TASK_ID", "1")]),
        );
        assert_eq!(flag.unwrap().count, 2);
    }

    /// `--shards N` (N > 1) with nothing to pick a shard is refused: run as the whole corpus, N
    /// tasks would each annotate every line.
    #[test]
    fn shards_without_an_index_are_refused() {
        for n in [2, 8] {
            let e = Shard::resolve(None, Some(n), env(&[]))
                .unwrap_err()
                .to_string();
            assert!(e.contains("--shards without --shard"), "{n}: {e}");
        }
    }

    /// A Slurm task ID below the array's MIN is an error, not shard 0 (another task's).
    #[test]
    fn a_slurm_task_below_the_arrays_min_is_refused() {
        let vars = [
            ("SLURM_ARRAY_TASK_ID", "0"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
        ];
        let e = Shard::resolve(None, None, env(&vars))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("SLURM_ARRAY_TASK_ID 0 is below SLURM_ARRAY_TASK_MIN 1"),
            "{e}"
        );
    }
}
