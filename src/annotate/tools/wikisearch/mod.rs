//! WikiSearch: BM25 over a local document collection, indexed once with tantivy.
//!
//! [`build_index`] turns a JSONL file (`{"id", "title"?, "text"}` per line) into an index
//! directory (`toolsift index --docs FILE.jsonl --out DIR`); [`WikiSearch`] opens it and
//! answers a call with a short snippet of the best hit. The call's input is never parsed as
//! tantivy query syntax: it is run through the index's own tokenizer and the words become
//! an OR of term queries, so `title:"` or `AND OR (` is just text. The document the call
//! was sampled in is excluded by id (a document never retrieves itself, which would leak
//! the continuation the API call is scored against).

mod index;

pub use index::{build_index, IndexStats};

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tantivy::collector::TopDocs;
use tantivy::query::{BooleanQuery, Occur, Query, TermQuery};
use tantivy::schema::{Field, IndexRecordOption, Schema, Value};
use tantivy::snippet::SnippetGenerator;
use tantivy::{DocAddress, Index, IndexReader, ReloadPolicy, Searcher, TantivyDocument, Term};

use super::{DocContext, Tool, ToolConfigError, ToolError};

/// Default longest snippet, in characters (a few sentences, like the paper's examples).
pub const DEFAULT_SNIPPET_CHARS: usize = 300;
/// At most this many distinct query words are searched; longer inputs are cut, not refused.
const MAX_QUERY_TERMS: usize = 32;
/// Hits [`WikiSearch`]'s `call` looks through for one with text to quote (a document matched
/// on its title alone may have none).
const CALL_CANDIDATES: usize = 16;

const ID: &str = "id";
const TITLE: &str = "title";
const TEXT_FIELD: &str = "text";

/// Why an index could not be built or opened; always names the path (and line) involved.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// Reading or writing a file failed.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error (in the message, not a `source()`, so it prints once).
        error: std::io::Error,
    },
    /// A line of the documents file is not a valid document.
    #[error("{}:{line}: {message}", path.display())]
    Malformed {
        /// The documents file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong with it.
        message: String,
    },
    /// The documents file has no document at all.
    #[error("{}: no documents", .0.display())]
    NoDocuments(PathBuf),
    /// The output directory exists and is not empty (an index is never overwritten).
    #[error("{}: output directory is not empty; remove it or choose another", .0.display())]
    OutDirNotEmpty(PathBuf),
    /// Writing the index for the output directory `out` failed (in its temporary folder, which
    /// is removed): the io::Error when tantivy kept it, else tantivy's text with a hint.
    #[error("{}: writing the index failed: {}", out.display(), write_failure(error))]
    Write {
        /// The output directory asked for.
        out: PathBuf,
        /// The underlying error (in the message, not a `source()`).
        error: tantivy::TantivyError,
    },
    /// Another build holds (or has just let go) the output directory's lock; the message says
    /// which.
    #[error("{0}")]
    Busy(String),
    /// Tantivy failed on the index at `path`.
    #[error("{}: {error}", path.display())]
    Tantivy {
        /// The index directory.
        path: PathBuf,
        /// The underlying error (in the message, not a `source()`).
        error: tantivy::TantivyError,
    },
    /// Reading the index at `path` failed in a way tantivy does not check for (it panicked):
    /// its files are damaged.
    #[error(
        "{}: the index is damaged ({message}); rebuild it with `toolsift index`",
        path.display()
    )]
    Damaged {
        /// The index directory.
        path: PathBuf,
        /// What tantivy said.
        message: String,
    },
    /// The directory holds an index, but not one made by [`build_index`].
    #[error("{}: not a WikiSearch index: {message}", path.display())]
    WrongSchema {
        /// The index directory.
        path: PathBuf,
        /// What is missing.
        message: String,
    },
}

/// An I/O error on `path`, for `map_err`.
fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> IndexError {
    let path = path.to_path_buf();
    move |error| IndexError::Io { path, error }
}

/// The io::Error behind a tantivy error, where tantivy kept it.
fn io_cause(error: &tantivy::TantivyError) -> Option<&std::io::Error> {
    use tantivy::directory::error::{OpenDirectoryError, OpenReadError, OpenWriteError};
    use tantivy::TantivyError as E;
    match error {
        E::IoError(e) => Some(e),
        E::OpenWriteError(OpenWriteError::IoError { io_error, .. })
        | E::OpenReadError(OpenReadError::IoError { io_error, .. })
        | E::OpenDirectoryError(OpenDirectoryError::IoError { io_error, .. }) => Some(io_error),
        _ => None,
    }
}

/// What `IndexError::Write` says after "writing the index failed": the io::Error when tantivy
/// kept it ("No space left on device"), or its text (an `InternalError`, as an indexing thread
/// reports it); else tantivy's text, after a hint where it is the "worker thread encountered an
/// error" that tells of an io::Error lost.
fn write_failure(error: &tantivy::TantivyError) -> String {
    use tantivy::TantivyError as E;
    match (io_cause(error), error) {
        (Some(io), _) => io.to_string(),
        (None, E::InternalError(text)) => text.clone(),
        (None, E::ErrorInThread(_)) => {
            format!("an indexing thread failed (is the disk full?): {error}")
        }
        (None, _) => error.to_string(),
    }
}

fn fields(schema: &Schema, dir: &Path) -> Result<(Field, Field, Field), IndexError> {
    let get = |name: &str| {
        schema.get_field(name).map_err(|_| IndexError::WrongSchema {
            path: dir.to_path_buf(),
            message: format!("no field {name:?}"),
        })
    };
    Ok((get(ID)?, get(TITLE)?, get(TEXT_FIELD)?))
}

/// Settings of the WikiSearch tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WikiSearchConfig {
    /// The index directory made by [`build_index`].
    pub index: PathBuf,
    /// Longest snippet returned, in characters.
    #[serde(default = "default_snippet_chars")]
    pub max_snippet_chars: usize,
}

fn default_snippet_chars() -> usize {
    DEFAULT_SNIPPET_CHARS
}

/// One search result.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchHit {
    /// The document's id.
    pub id: String,
    /// Its title, if it has one.
    pub title: Option<String>,
    /// BM25 score.
    pub score: f32,
    /// A short passage of its text, preferring the part that matches the query.
    pub snippet: String,
}

/// The WikiSearch tool over an index made by [`build_index`].
pub struct WikiSearch {
    index: Index,
    reader: IndexReader,
    id: Field,
    title: Field,
    text: Field,
    max_snippet_chars: usize,
    /// `index_xxh3` of the index as it was opened (the reader never reloads).
    opened_xxh3: u64,
}

impl std::fmt::Debug for WikiSearch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WikiSearch")
            .field("documents", &self.num_docs())
            .field("max_snippet_chars", &self.max_snippet_chars)
            .finish()
    }
}

impl WikiSearch {
    /// Opens the index in `dir`.
    pub fn open(dir: &Path) -> Result<Self, IndexError> {
        let tantivy_err = |error| IndexError::Tantivy {
            path: dir.to_path_buf(),
            error,
        };
        // Not there at all (a typo in the path): said so, not "not an index".
        if let Err(error) = std::fs::metadata(dir) {
            return Err(IndexError::Io {
                path: dir.to_path_buf(),
                error,
            });
        }
        if !dir.join("meta.json").is_file() {
            return Err(IndexError::WrongSchema {
                path: dir.to_path_buf(),
                message: "no meta.json (build one with `toolsift index`)".into(),
            });
        }
        // Read just before the index is: what a resumed run compares is what this one reads.
        let opened_xxh3 = Self::index_xxh3(dir).map_err(io_err(&dir.join("meta.json")))?;
        // tantivy asserts, rather than checks, some of what it reads from a segment's files: a
        // damaged index can panic while it opens, and that is the index's error, not a crash.
        let open = || {
            let index = Index::open_in_dir(dir).map_err(tantivy_err)?;
            let (id, title, text) = fields(&index.schema(), dir)?;
            // The index does not change while a run reads it: no reload thread.
            let reader: IndexReader = index
                .reader_builder()
                .reload_policy(ReloadPolicy::Manual)
                .try_into()
                .map_err(tantivy_err)?;
            Ok::<_, IndexError>((index, reader, id, title, text))
        };
        let (index, reader, id, title, text) =
            crate::util::catch_panic_quietly(open).map_err(|message| IndexError::Damaged {
                path: dir.to_path_buf(),
                message,
            })??;
        Ok(Self {
            index,
            reader,
            id,
            title,
            text,
            max_snippet_chars: DEFAULT_SNIPPET_CHARS,
            opened_xxh3,
        })
    }

    /// XXH3-64 of the index's meta.json, which lists its segments by id: a rebuilt index (even
    /// from the same documents) has another, so a resumed run can tell that its index changed.
    pub fn index_xxh3(dir: &Path) -> std::io::Result<u64> {
        Ok(xxhash_rust::xxh3::xxh3_64(&std::fs::read(
            dir.join("meta.json"),
        )?))
    }

    /// `index_xxh3` of the index as this tool opened it: an index rebuilt in place since (while
    /// a model loads, say) is not the one it searches.
    pub fn opened_xxh3(&self) -> u64 {
        self.opened_xxh3
    }

    /// The tool `config` describes.
    pub fn from_config(config: &WikiSearchConfig) -> Result<Self, ToolConfigError> {
        Self::check_config(config)?;
        let tool = Self::open(&config.index)?;
        Ok(tool.with_max_snippet_chars(config.max_snippet_chars))
    }

    /// What `from_config` checks without opening the index (`ToolsConfig::check`).
    pub fn check_config(config: &WikiSearchConfig) -> Result<(), ToolConfigError> {
        if config.index.as_os_str().is_empty() {
            return Err(ToolConfigError::Invalid {
                tool: "WikiSearch".into(),
                message: "[tools.wikisearch] index is empty: give the folder `toolsift index` \
                          built"
                    .into(),
            });
        }
        if config.max_snippet_chars == 0 {
            return Err(ToolConfigError::Invalid {
                tool: "WikiSearch".into(),
                message: "max_snippet_chars must be at least 1".into(),
            });
        }
        Ok(())
    }

    /// Sets the longest snippet, in characters (at least 1).
    pub fn with_max_snippet_chars(mut self, chars: usize) -> Self {
        self.max_snippet_chars = chars.max(1);
        self
    }

    /// Number of documents in the index.
    pub fn num_docs(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    /// The best `limit` documents for `query` by BM25 over title and text, leaving out the
    /// document whose id is `exclude_id`. `query` is plain words; any query syntax in it
    /// is treated as text.
    pub fn search(
        &self,
        query: &str,
        exclude_id: Option<&str>,
        limit: usize,
    ) -> Result<Vec<SearchHit>, ToolError> {
        let ranked = self.rank(query, exclude_id, limit)?;
        ranked
            .top
            .iter()
            .map(|&(score, address)| self.hit(&ranked, score, address))
            .collect()
    }

    /// The addresses of the best `limit` documents, best first, as [`Self::search`] ranks
    /// them, and what it takes to read them and make their snippets.
    fn rank(
        &self,
        query: &str,
        exclude_id: Option<&str>,
        limit: usize,
    ) -> Result<Ranked, ToolError> {
        let failed = |what: &str, e: tantivy::TantivyError| {
            ToolError::Failed(format!("WikiSearch {what} failed: {e}"))
        };
        let words = self
            .query_words(query)
            .map_err(|e| failed("tokenizing", e))?;
        if words.is_empty() {
            return Err(ToolError::InvalidInput(format!(
                "query {query:?} has no searchable words"
            )));
        }
        let mut should: Vec<(Occur, Box<dyn Query>)> = Vec::new();
        for word in &words {
            for field in [self.title, self.text] {
                let term = Term::from_field_text(field, word);
                should.push((
                    Occur::Should,
                    Box::new(TermQuery::new(term, IndexRecordOption::WithFreqs)),
                ));
            }
        }
        let matching: Box<dyn Query> = Box::new(BooleanQuery::new(should));
        let mut clauses = vec![(Occur::Must, matching.box_clone())];
        if let Some(id) = exclude_id {
            let term = Term::from_field_text(self.id, id);
            clauses.push((
                Occur::MustNot,
                Box::new(TermQuery::new(term, IndexRecordOption::Basic)),
            ));
        }
        let full = BooleanQuery::new(clauses);

        let searcher = self.reader.searcher();
        let top = searcher
            .search(&full, &TopDocs::with_limit(limit.max(1)).order_by_score())
            .map_err(|e| failed("search", e))?;
        let snippets = SnippetGenerator::create(&searcher, matching.as_ref(), self.text)
            .map_err(|e| failed("snippet", e))?;
        Ok(Ranked {
            searcher,
            top: top.into_iter().take(limit).collect(),
            snippets: RefCell::new(snippets),
        })
    }

    /// The search hit at `address`, with its snippet.
    fn hit(
        &self,
        ranked: &Ranked,
        score: f32,
        address: DocAddress,
    ) -> Result<SearchHit, ToolError> {
        let doc: TantivyDocument = ranked
            .searcher
            .doc(address)
            .map_err(|e| ToolError::Failed(format!("WikiSearch reading a document failed: {e}")))?;
        let first = |field| {
            doc.get_first(field)
                .and_then(|v| v.as_str().map(str::to_string))
        };
        let text = first(self.text).unwrap_or_default();
        let (fragment, first_match) = {
            // tantivy's limit counts bytes: give it this text's bytes for the characters wanted
            // (2-3 per character in Cyrillic or CJK), then `whole_words` counts characters.
            let chars = text.chars().count().max(1);
            let per_char = text.len().div_ceil(chars).max(1);
            let mut snippets = ranked.snippets.borrow_mut();
            snippets.set_max_num_chars(self.max_snippet_chars.saturating_mul(per_char));
            let snippet = snippets.snippet(&text);
            let range = snippet.fragment_range();
            let first_match = snippet
                .highlighted()
                .iter()
                .map(|h| range.start + h.start)
                .min();
            (range, first_match)
        };
        let snippet = if text
            .get(fragment.clone())
            .is_none_or(|f| f.trim().is_empty())
        {
            // Only the title matched: the start of the text says what the page is.
            truncate_words(&text, self.max_snippet_chars)
        } else {
            whole_words(&text, fragment, first_match, self.max_snippet_chars)
        };
        Ok(SearchHit {
            id: first(self.id).unwrap_or_default(),
            title: first(self.title),
            score,
            snippet,
        })
    }

    /// The distinct words of `query` as the index tokenized its text, in order, at most
    /// [`MAX_QUERY_TERMS`].
    fn query_words(&self, query: &str) -> tantivy::Result<Vec<String>> {
        let mut analyzer = self.index.tokenizer_for_field(self.text)?;
        let mut stream = analyzer.token_stream(query);
        let mut seen = BTreeSet::new();
        let mut words = Vec::new();
        while stream.advance() {
            let word = stream.token().text.clone();
            if words.len() < MAX_QUERY_TERMS && seen.insert(word.clone()) {
                words.push(word);
            }
        }
        Ok(words)
    }
}

/// The fragment `range` of `text` as a snippet of at most `max_chars` characters, widened to
/// whole words where they fit: tantivy's fragments start and end at its tokens, which leave out
/// the punctuation around a word ("giraffid" of "giraffid.", "born" of "(born"). The widest of
/// both ends widened, the end only, and the fragment as it is, that fits whole. A fragment
/// longer than `max_chars` (its byte budget is an average's: a text of mostly ASCII with a few
/// wider characters gets twice the bytes it needs) is cut from its start, or from the start of
/// the word its first match falls in (`first_match`, a byte offset in `text`) when a cut from
/// its start would leave that word out: the snippet quotes what the search found.
fn whole_words(
    text: &str,
    range: Range<usize>,
    first_match: Option<usize>,
    max_chars: usize,
) -> String {
    let start = word_start(text, 0, range.start);
    let end = word_end(text, range.end, text.len());
    let fragment = &text[range.clone()];
    for candidate in [&text[start..end], &text[range.start..end]] {
        let cut = truncate_words(candidate, max_chars);
        if cut.split_whitespace().count() == candidate.split_whitespace().count() {
            return cut;
        }
    }
    let cut = truncate_words(fragment, max_chars);
    let Some(hit) = first_match.filter(|h| range.contains(h)) else {
        return cut;
    };
    // Words of the fragment up to and including the matched one, against the words cut kept.
    let through_hit = word_end(text, hit, range.end);
    if text[range.start..through_hit].split_whitespace().count() <= cut.split_whitespace().count() {
        return cut;
    }
    truncate_words(
        &text[word_start(text, range.start, hit)..range.end],
        max_chars,
    )
}

/// Where the word around byte `at` of `text` starts: after the last whitespace before `at`, not
/// before `floor`.
fn word_start(text: &str, floor: usize, at: usize) -> usize {
    text[floor..at]
        .char_indices()
        .rev()
        .find(|(_, c)| c.is_whitespace())
        .map_or(floor, |(i, c)| floor + i + c.len_utf8())
}

/// Where the word around byte `at` of `text` ends: at the first whitespace from `at`, not past
/// `ceiling`.
fn word_end(text: &str, at: usize, ceiling: usize) -> usize {
    text[at..ceiling]
        .find(char::is_whitespace)
        .map_or(ceiling, |i| at + i)
}

/// Collapses whitespace and cuts `text` to at most `max_chars` characters, at a word
/// boundary when there is one.
fn truncate_words(text: &str, max_chars: usize) -> String {
    let mut out = String::new();
    let mut chars = 0;
    for word in text.split_whitespace() {
        let sep = usize::from(!out.is_empty());
        let len = word.chars().count();
        if chars + sep + len > max_chars {
            if out.is_empty() {
                out.extend(word.chars().take(max_chars));
            }
            break;
        }
        if sep == 1 {
            out.push(' ');
        }
        out.push_str(word);
        chars += sep + len;
    }
    out
}

/// The ranked result of a search, before its documents are read.
struct Ranked {
    searcher: Searcher,
    top: Vec<(f32, DocAddress)>,
    /// Its byte limit is set per document (`WikiSearch::hit`).
    snippets: RefCell<SnippetGenerator>,
}

impl Tool for WikiSearch {
    fn name(&self) -> &str {
        "WikiSearch"
    }

    /// The snippet of the best hit that has text to quote: a document that matched on its
    /// title alone and has an empty text is passed over for the next one.
    fn call(&self, input: &str, doc: &DocContext<'_>) -> Result<String, ToolError> {
        let ranked = self.rank(input, Some(doc.id), CALL_CANDIDATES)?;
        for &(score, address) in &ranked.top {
            let hit = self.hit(&ranked, score, address)?;
            if !hit.snippet.is_empty() {
                return Ok(hit.snippet);
            }
        }
        Err(ToolError::Failed(if ranked.top.is_empty() {
            format!("no document matches {input:?}")
        } else {
            format!(
                "no document with text matches {input:?} (the best {} have an empty text)",
                ranked.top.len()
            )
        }))
    }
}

/// The documents and helpers the tests of both files share.
#[cfg(test)]
mod testing {
    use std::fs;
    use std::io::Write;
    use std::path::{Path, PathBuf};

    use crate::annotate::tools::DocContext;

    pub(super) const DOCS: &str = r#"{"id": "brown-act", "title": "Brown Act", "text": "The Ralph M. Brown Act is an act of the California State Legislature that guarantees the public's right to attend and participate in meetings of local legislative bodies."}
{"id": "pittsburgh", "title": "Pittsburgh", "text": "Pittsburgh is a city in the Commonwealth of Pennsylvania. It is known as the Steel City for its more than 300 steel-related businesses."}

{"id": 42, "title": null, "text": "Steel is an alloy of iron and carbon. Steel production in Pittsburgh peaked in the twentieth century."}
{"id": "paris", "text": "Paris is the capital and most populous city of France.", "lang": "en"}
"#;

    pub(super) fn write_docs(dir: &Path, content: impl AsRef<[u8]>) -> PathBuf {
        let path = dir.join("docs.jsonl");
        let mut f = fs::File::create(&path).unwrap();
        f.write_all(content.as_ref()).unwrap();
        path
    }

    pub(super) fn doc(id: &str) -> DocContext<'_> {
        DocContext {
            id,
            url: None,
            date: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::testing::*;
    use super::*;

    fn small_index() -> (tempfile::TempDir, WikiSearch) {
        let tmp = tempfile::tempdir().unwrap();
        let docs = write_docs(tmp.path(), DOCS);
        let out = tmp.path().join("index");
        let stats = build_index(&docs, &out, "text").unwrap();
        assert_eq!(
            stats,
            IndexStats {
                documents: 4,
                blank_lines: 1,
                duplicate_ids: 0
            }
        );
        let wiki = WikiSearch::open(&out).unwrap();
        (tmp, wiki)
    }

    #[test]
    fn expected_document_ranks_first() {
        let (_tmp, wiki) = small_index();
        assert_eq!(wiki.num_docs(), 4);
        let hits = wiki.search("Brown Act", None, 3).unwrap();
        assert_eq!(hits[0].id, "brown-act");
        assert_eq!(hits[0].title.as_deref(), Some("Brown Act"));
        let hits = wiki.search("capital of France", None, 3).unwrap();
        assert_eq!(hits[0].id, "paris");
        assert_eq!(hits[0].title, None);
        let hits = wiki
            .search("meeting of a legislative body", None, 3)
            .unwrap();
        assert_eq!(
            hits[0].id, "brown-act",
            "stemmed: meetings/meeting, bodies/body"
        );
        let hits = wiki.search("steel alloy iron", None, 3).unwrap();
        assert_eq!(hits[0].id, "42", "integer ids are indexed as text");
        let got = wiki.call("Brown Act", &doc("other")).unwrap();
        assert!(
            got.contains("Brown Act") && got.contains("California"),
            "{got}"
        );
        assert!(got.chars().count() <= DEFAULT_SNIPPET_CHARS);
    }

    #[test]
    fn a_document_never_retrieves_itself() {
        let (_tmp, wiki) = small_index();
        let got = wiki.search("Brown Act", Some("brown-act"), 5).unwrap();
        assert!(got.iter().all(|h| h.id != "brown-act"), "{got:?}");
        let snippet = wiki.call("Pittsburgh steel", &doc("pittsburgh")).unwrap();
        assert!(snippet.contains("alloy"), "{snippet}");
        let err = wiki.call("Ralph Brown", &doc("brown-act")).unwrap_err();
        assert!(matches!(err, ToolError::Failed(_)), "{err:?}");
    }

    #[test]
    fn hostile_queries_do_not_error() {
        let (_tmp, wiki) = small_index();
        for q in [
            "title:\"",
            "AND OR (",
            "id:brown-act",
            "text:* -Pittsburgh",
            "\"unbalanced",
            "Pitts~2 ^3 [a TO z]",
            "{}[]()^~*?:\\/",
            &"steel ".repeat(5000),
            "ü 日本 🙂",
        ] {
            match wiki.search(q, None, 1) {
                Ok(_) | Err(ToolError::InvalidInput(_)) => {}
                Err(e) => panic!("{q:?}: {e}"),
            }
        }
        let err = wiki.call("(: \"", &doc("x")).unwrap_err();
        assert!(matches!(err, ToolError::InvalidInput(_)));
        assert!(matches!(
            wiki.call("xyzzy", &doc("x")),
            Err(ToolError::Failed(_))
        ));
        // Query syntax is text: "id:42" does not select the document whose id is 42.
        assert!(wiki.search("id:42", None, 5).unwrap().is_empty());
    }

    #[test]
    fn snippets_are_short_and_single_line() {
        let tmp = tempfile::tempdir().unwrap();
        let long = "word ".repeat(400) + "needle " + &"filler\n".repeat(400);
        let line = serde_json::json!({"id": "long", "text": long}).to_string();
        let docs = write_docs(tmp.path(), &(line + "\n"));
        let out = tmp.path().join("idx");
        build_index(&docs, &out, "text").unwrap();
        let wiki = WikiSearch::open(&out).unwrap().with_max_snippet_chars(80);
        let got = wiki.call("needle", &doc("x")).unwrap();
        assert!(got.contains("needle") && !got.contains('\n'), "{got}");
        assert!(got.chars().count() <= 80, "{got}");
        assert_eq!(truncate_words("a  b\tc", 3), "a b");
        assert_eq!(truncate_words("abcdef", 3), "abc");
        assert_eq!(truncate_words("", 3), "");
    }

    /// The limit counts characters in any script (tantivy's own counts bytes), and a key held
    /// twice in a field the index does not read is no error.
    #[test]
    fn snippet_limits_count_characters_in_any_script() {
        let tmp = tempfile::tempdir().unwrap();
        let lines: String = [
            ("en", "Paris is a large city on the river. "),
            ("ru", "Москва большой город на реке. "),
            ("ja", "東京 大きな 都市 川 あります。 "),
        ]
        .iter()
        .map(|(id, sentence)| {
            let text = sentence.repeat(30);
            format!("{{\"id\": \"{id}\", \"text\": {text:?}, \"x\": 1, \"x\": 2}}\n")
        })
        .collect();
        let docs = write_docs(tmp.path(), lines);
        let out = tmp.path().join("idx");
        build_index(&docs, &out, "text").unwrap();
        let wiki = WikiSearch::open(&out).unwrap().with_max_snippet_chars(120);
        for query in ["Paris", "Москва", "東京"] {
            let got = wiki.call(query, &doc("none")).unwrap();
            let n = got.chars().count();
            assert!((90..=120).contains(&n), "{query}: {n} characters: {got}");
        }
    }

    /// A rebuilt index, even from the same documents, has another meta.json hash (what a
    /// resumed annotate run compares); reading it does not change it.
    #[test]
    fn a_rebuilt_index_has_another_hash() {
        let tmp = tempfile::tempdir().unwrap();
        let docs = write_docs(tmp.path(), DOCS);
        let out = tmp.path().join("idx");
        build_index(&docs, &out, "text").unwrap();
        let first = WikiSearch::index_xxh3(&out).unwrap();
        WikiSearch::open(&out)
            .unwrap()
            .call("steel", &doc("x"))
            .ok();
        assert_eq!(WikiSearch::index_xxh3(&out).unwrap(), first);
        let opened = WikiSearch::open(&out).unwrap();
        assert_eq!(opened.opened_xxh3(), first);
        let config = crate::annotate::tools::ToolsConfig {
            wikisearch: Some(WikiSearchConfig {
                index: out.clone(),
                max_snippet_chars: DEFAULT_SNIPPET_CHARS,
            }),
            ..Default::default()
        };
        let mut registry = crate::annotate::tools::ToolRegistry::from_config(&config).unwrap();
        fs::remove_dir_all(&out).unwrap();
        build_index(&docs, &out, "text").unwrap();
        assert_ne!(WikiSearch::index_xxh3(&out).unwrap(), first);
        // What was opened before the rebuild still says which index it searches (the hash a
        // run's journal records); a WikiSearch registered by hand says nothing.
        assert_eq!(opened.opened_xxh3(), first);
        assert_eq!(registry.wikisearch_index_xxh3(), Some(first));
        registry.register(WikiSearch::open(&out).unwrap());
        assert_eq!(registry.wikisearch_index_xxh3(), None);
        assert!(WikiSearch::index_xxh3(&tmp.path().join("none")).is_err());
    }

    /// A snippet keeps the punctuation around its first and last words (tantivy's fragment
    /// stops at tokens): the sentence's final period, an opening parenthesis; each end only
    /// where the words still fit the limit.
    #[test]
    fn snippets_end_at_whole_words() {
        let tmp = tempfile::tempdir().unwrap();
        let docs = write_docs(
            tmp.path(),
            "{\"id\":\"o\",\"text\":\"An okapi is a giraffid.\"}\n",
        );
        let out = tmp.path().join("idx");
        build_index(&docs, &out, "text").unwrap();
        let wiki = WikiSearch::open(&out).unwrap();
        assert_eq!(
            wiki.call("giraffid", &doc("x")).unwrap(),
            "An okapi is a giraffid."
        );

        let text = "Ann (born  1950) sang.";
        let born = 5..15; // "born  1950"
        assert_eq!(&text[born.clone()], "born  1950");
        assert_eq!(whole_words(text, born.clone(), None, 40), "(born 1950)");
        assert_eq!(whole_words(text, born.clone(), None, 10), "born 1950)");
        assert_eq!(whole_words(text, born.clone(), None, 9), "born 1950");
        assert_eq!(whole_words(text, born.clone(), None, 6), "born");
        // At the text's ends, and a range already on whole words.
        assert_eq!(whole_words(text, 0..3, None, 40), "Ann");
        assert_eq!(whole_words(text, 17..21, None, 40), "sang.");
        assert_eq!(whole_words("Москва, город", 0..12, None, 40), "Москва,");
        // Too long: cut from its start while that keeps the match, else from the match's word.
        assert_eq!(whole_words(text, born.clone(), Some(5), 6), "born");
        assert_eq!(whole_words(text, born.clone(), Some(11), 6), "1950");
        assert_eq!(whole_words(text, born, Some(13), 6), "1950");
    }

    #[test]
    fn custom_text_field() {
        let tmp = tempfile::tempdir().unwrap();
        let docs = write_docs(tmp.path(), "{\"id\":\"a\",\"contents\":\"hello world\"}\n");
        let out = tmp.path().join("idx");
        build_index(&docs, &out, "contents").unwrap();
        let wiki = WikiSearch::open(&out).unwrap();
        assert_eq!(wiki.call("hello", &doc("b")).unwrap(), "hello world");
    }

    #[test]
    fn a_hit_without_text_gives_way_to_the_next() {
        let tmp = tempfile::tempdir().unwrap();
        let docs = write_docs(
            tmp.path(),
            concat!(
                r#"{"id": "t", "title": "Zebra Zebra", "text": ""}"#,
                "\n",
                r#"{"id": "w", "title": "Zebra crossing", "text": "  \n "}"#,
                "\n",
                r#"{"id": "z", "text": "A zebra is an African equine."}"#,
                "\n"
            ),
        );
        let out = tmp.path().join("idx");
        build_index(&docs, &out, "text").unwrap();
        let wiki = WikiSearch::open(&out).unwrap();
        assert_eq!(wiki.search("zebra", None, 1).unwrap()[0].id, "t");
        let got = wiki.call("zebra", &doc("x")).unwrap();
        assert!(got.contains("African equine"), "{got}");
        let err = wiki.call("zebra", &doc("z")).unwrap_err().to_string();
        assert!(err.contains("no document with text matches"), "{err}");
        let err = wiki.call("okapi", &doc("x")).unwrap_err().to_string();
        assert!(err.contains("no document matches"), "{err}");
    }

    #[test]
    fn write_errors_name_the_out_dir_and_the_cause() {
        use std::sync::Arc;
        use tantivy::directory::error::OpenWriteError;
        use tantivy::TantivyError;
        let write = |error| {
            IndexError::Write {
                out: PathBuf::from("small/idx"),
                error,
            }
            .to_string()
        };
        let full = || std::io::Error::other("No space left on device");
        assert_eq!(
            write(TantivyError::from(full())),
            "small/idx: writing the index failed: No space left on device"
        );
        let open = OpenWriteError::wrap_io_error(full(), PathBuf::from("meta.json"));
        assert_eq!(
            write(TantivyError::OpenWriteError(open)),
            "small/idx: writing the index failed: No space left on device"
        );
        assert!(io_cause(&TantivyError::IoError(Arc::new(full()))).is_some());
        // What commit returns after an indexing thread met a full disk.
        let thread = TantivyError::InternalError("No space left on device (os error 28)".into());
        assert_eq!(
            write(thread),
            "small/idx: writing the index failed: No space left on device (os error 28)"
        );
        // What add_document says when an indexing thread died, its io::Error lost.
        let lost = TantivyError::ErrorInThread(
            "An index writer was killed.. A worker thread encountered an error (io::Error most \
             likely) or panicked."
                .into(),
        );
        let msg = write(lost);
        assert!(
            msg.starts_with("small/idx: writing the index failed: ")
                && msg.contains("disk full")
                && msg.contains("An index writer was killed"),
            "{msg}"
        );
        let other = write(TantivyError::InvalidArgument("odd".into()));
        assert!(!other.contains("disk") && other.contains("odd"), "{other}");
    }

    #[test]
    fn other_build_and_open_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("idx");
        let missing = tmp.path().join("missing.jsonl");
        let err = build_index(&missing, &out, "text").unwrap_err();
        assert!(matches!(err, IndexError::Io { .. }) && err.to_string().contains("missing.jsonl"));

        let empty = write_docs(tmp.path(), "\n  \n");
        assert!(matches!(
            build_index(&empty, &out, "text"),
            Err(IndexError::NoDocuments(_))
        ));

        let docs = write_docs(tmp.path(), "{\"id\":\"a\",\"text\":\"x\"}\n");
        fs::create_dir(&out).unwrap();
        build_index(&docs, &out, "text").expect("an empty out dir is fine");
        let err = build_index(&docs, &out, "text").unwrap_err();
        assert!(matches!(err, IndexError::OutDirNotEmpty(_)), "{err}");
        WikiSearch::open(&out).expect("the first index is intact");

        let err = WikiSearch::open(tmp.path()).unwrap_err();
        assert!(err.to_string().contains("meta.json"), "{err}");

        // Damaged fast fields make tantivy panic as the index opens: an error naming it.
        let (tmp, _) = small_index();
        let dir = tmp.path().join("index");
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "fast") {
                let mut bytes = fs::read(&path).unwrap();
                bytes.iter_mut().take(30).for_each(|b| *b ^= 0xff);
                fs::write(&path, bytes).unwrap();
            }
        }
        let err = WikiSearch::open(&dir).unwrap_err();
        assert!(
            matches!(err, IndexError::Damaged { .. })
                && err.to_string().contains("index is damaged")
                && err.to_string().contains(&dir.display().to_string()),
            "{err}"
        );
        let cfg = WikiSearchConfig {
            index: tmp.path().join("nope"),
            max_snippet_chars: 10,
        };
        assert!(WikiSearch::from_config(&cfg).is_err());
    }

    /// An index written with tantivy directly, one document holding `fields` (name, value; all
    /// stored text, the id one raw term) in the order given: what another version might leave.
    fn index_by_hand(dir: &Path, fields: &[(&str, &str)]) {
        use tantivy::schema::{STORED, STRING, TEXT};
        let mut builder = Schema::builder();
        for &(name, _) in fields {
            builder.add_text_field(
                name,
                if name == ID {
                    STRING | STORED
                } else {
                    TEXT | STORED
                },
            );
        }
        let schema = builder.build();
        let index = Index::create_in_dir(dir, schema.clone()).unwrap();
        let mut writer: tantivy::IndexWriter =
            index.writer_with_num_threads(1, 15_000_000).unwrap();
        let mut doc = TantivyDocument::default();
        for &(name, value) in fields {
            doc.add_text(schema.get_field(name).unwrap(), value);
        }
        writer.add_document(doc).unwrap();
        writer.commit().unwrap();
    }

    /// The fields are found by name: an index whose schema lists them in another order still
    /// quotes the text and gives the title as the title.
    #[test]
    fn an_index_is_read_by_its_field_names_not_their_order() {
        let tmp = tempfile::tempdir().unwrap();
        index_by_hand(
            tmp.path(),
            &[
                ("text", "A zebra is an African equine."),
                ("title", "Zebra"),
                ("id", "z"),
            ],
        );
        let wiki = WikiSearch::open(tmp.path()).unwrap();
        let hits = wiki.search("zebra", None, 1).unwrap();
        assert_eq!(hits[0].id, "z");
        assert_eq!(hits[0].title.as_deref(), Some("Zebra"));
        assert_eq!(hits[0].snippet, "A zebra is an African equine.");
    }

    #[test]
    fn an_index_without_a_title_field_is_refused_naming_the_field() {
        let tmp = tempfile::tempdir().unwrap();
        index_by_hand(tmp.path(), &[("id", "z"), ("text", "A zebra.")]);
        let err = WikiSearch::open(tmp.path()).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, IndexError::WrongSchema { .. }), "{msg}");
        assert_eq!(
            msg,
            format!(
                "{}: not a WikiSearch index: no field \"title\"",
                tmp.path().display()
            )
        );
    }

    /// A path that is not there is an I/O error (a typo), not "not an index"; a folder that is
    /// there without a meta.json is not an index, and says how to build one.
    #[test]
    fn open_tells_a_missing_folder_from_one_without_an_index() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("typo");
        let err = WikiSearch::open(&missing).unwrap_err();
        assert!(
            matches!(&err, IndexError::Io { path, error }
                if path == &missing && error.kind() == std::io::ErrorKind::NotFound),
            "{err}"
        );
        let empty = tmp.path().join("empty");
        fs::create_dir(&empty).unwrap();
        let err = WikiSearch::open(&empty).unwrap_err();
        assert!(matches!(err, IndexError::WrongSchema { .. }), "{err}");
        assert!(err.to_string().contains("toolsift index"), "{err}");
    }

    /// The io::Error tantivy keeps in a failed read or a failed folder open is what a write
    /// failure says, as it is for a failed file write.
    #[test]
    fn write_errors_give_the_io_error_of_a_failed_read_or_folder() {
        use tantivy::directory::error::{OpenDirectoryError, OpenReadError};
        use tantivy::TantivyError;
        let full = || std::io::Error::other("No space left on device");
        for error in [
            TantivyError::OpenReadError(OpenReadError::wrap_io_error(full(), "a.idx".into())),
            TantivyError::OpenDirectoryError(OpenDirectoryError::wrap_io_error(
                full(),
                "idx".into(),
            )),
        ] {
            let msg = IndexError::Write {
                out: PathBuf::from("small/idx"),
                error,
            }
            .to_string();
            assert_eq!(
                msg,
                "small/idx: writing the index failed: No space left on device"
            );
        }
    }

    /// `from_config` applies the configured limit, not the default.
    #[test]
    fn a_configured_snippet_limit_is_applied() {
        let (tmp, _) = small_index();
        let config = WikiSearchConfig {
            index: tmp.path().join("index"),
            max_snippet_chars: 25,
        };
        let wiki = WikiSearch::from_config(&config).unwrap();
        let got = wiki.call("Brown Act", &doc("x")).unwrap();
        assert!(got.contains("Brown") && got.chars().count() <= 25, "{got}");
        // The smallest limit there is, 1, is a valid setting.
        let one = WikiSearchConfig {
            max_snippet_chars: 1,
            ..config
        };
        assert!(WikiSearch::check_config(&one).is_ok());
        let empty = WikiSearchConfig {
            index: PathBuf::new(),
            max_snippet_chars: 25,
        };
        let err = WikiSearch::check_config(&empty).unwrap_err().to_string();
        assert!(err.contains("index is empty"), "{err}");
    }

    /// A limit of 0 set in code counts as 1: a snippet of one character, not none (which
    /// would read as a document without text).
    #[test]
    fn a_snippet_limit_of_zero_counts_as_one() {
        let (_tmp, wiki) = small_index();
        let got = wiki
            .with_max_snippet_chars(0)
            .call("Pittsburgh", &doc("x"))
            .unwrap();
        assert_eq!(got.chars().count(), 1, "{got:?}");
    }

    /// A hit on the title alone quotes the start of the text within the limit too.
    #[test]
    fn a_title_only_hit_is_cut_to_the_limit() {
        let tmp = tempfile::tempdir().unwrap();
        let text = (0..100)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ");
        let line = serde_json::json!({"id": "e", "title": "Eiffel Tower", "text": text});
        let docs = write_docs(tmp.path(), format!("{line}\n"));
        let out = tmp.path().join("idx");
        build_index(&docs, &out, "text").unwrap();
        let wiki = WikiSearch::open(&out).unwrap().with_max_snippet_chars(20);
        assert_eq!(
            wiki.call("Eiffel", &doc("x")).unwrap(),
            "w0 w1 w2 w3 w4 w5 w6"
        );
    }

    /// Each hit carries its own BM25 score, best first.
    #[test]
    fn hits_carry_their_scores_best_first() {
        let (_tmp, wiki) = small_index();
        let hits = wiki.search("steel Pittsburgh", None, 3).unwrap();
        assert_eq!(hits.len(), 2, "{hits:?}");
        assert!(
            hits[0].score > hits[1].score && hits[1].score > 0.0,
            "{hits:?}"
        );
    }

    /// A call looks through the best 16 hits for one with text: 15 title-only documents ranked
    /// above it do not hide a document with text, and the error says how many it saw.
    #[test]
    fn a_call_looks_through_sixteen_hits_for_text() {
        let tmp = tempfile::tempdir().unwrap();
        let mut lines = String::new();
        for i in 0..15 {
            lines += &format!("{{\"id\": \"t{i}\", \"title\": \"Zebra\", \"text\": \"\"}}\n");
        }
        // Fillers make a title's "zebra" rare enough to outrank one word in a long text.
        for i in 0..100 {
            lines +=
                &format!("{{\"id\": \"f{i}\", \"title\": \"Filler\", \"text\": \"filler\"}}\n");
        }
        let long = format!("{}zebra", "filler ".repeat(300));
        lines += &format!("{}\n", serde_json::json!({"id": "z", "text": long}));
        let docs = write_docs(tmp.path(), lines);
        let out = tmp.path().join("idx");
        build_index(&docs, &out, "text").unwrap();
        let wiki = WikiSearch::open(&out).unwrap().with_max_snippet_chars(30);
        let hits = wiki.search("zebra", None, 20).unwrap();
        assert_eq!(hits.len(), 16);
        assert_eq!(hits[15].id, "z", "the document with text ranks last");
        assert!(wiki.call("zebra", &doc("x")).unwrap().contains("zebra"));
        let err = wiki.call("zebra", &doc("z")).unwrap_err().to_string();
        assert!(err.contains("(the best 15 have an empty text)"), "{err}");
    }

    /// Cut at its first match, a fragment keeps the words before that match where they fit.
    #[test]
    fn a_cut_that_keeps_the_match_keeps_the_words_before_it() {
        let text = "a b zebra c d";
        assert_eq!(whole_words(text, 0..13, Some(4), 9), "a b zebra");
        assert_eq!(whole_words(text, 0..13, Some(4), 8), "zebra c");
    }

    /// A word longer than the limit is cut between characters, not bytes.
    #[test]
    fn a_long_word_is_cut_between_characters() {
        assert_eq!(truncate_words("Москва город", 3), "Мос");
        assert_eq!(truncate_words("日本語", 2), "日本");
    }
}
