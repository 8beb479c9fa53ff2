//! Calendar: "Today is Monday, January 30, 2023." for the date the document was written.
//!
//! The date is, in order: the document's "date" field, else a date in its URL's path,
//! else the configured date; with none of them the call fails. `Calendar()` takes no
//! argument: a call with one ("Calendar(tomorrow)") is invalid input, since splicing
//! "[Calendar(tomorrow) -> Today is ...]" would teach that the argument is answered. Dates are
//! proleptic Gregorian, computed by hand (no date crate is available to this build).

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{DocContext, Tool, ToolConfigError, ToolError};

/// A valid calendar date (year 1 to 9999).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Date {
    year: u16,
    month: u8,
    day: u8,
}

/// Day of the week.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Weekday {
    /// Sunday.
    Sunday,
    /// Monday.
    Monday,
    /// Tuesday.
    Tuesday,
    /// Wednesday.
    Wednesday,
    /// Thursday.
    Thursday,
    /// Friday.
    Friday,
    /// Saturday.
    Saturday,
}

impl Weekday {
    const ALL: [Weekday; 7] = [
        Weekday::Sunday,
        Weekday::Monday,
        Weekday::Tuesday,
        Weekday::Wednesday,
        Weekday::Thursday,
        Weekday::Friday,
        Weekday::Saturday,
    ];

    /// English name, e.g. "Monday".
    pub fn name(self) -> &'static str {
        match self {
            Weekday::Sunday => "Sunday",
            Weekday::Monday => "Monday",
            Weekday::Tuesday => "Tuesday",
            Weekday::Wednesday => "Wednesday",
            Weekday::Thursday => "Thursday",
            Weekday::Friday => "Friday",
            Weekday::Saturday => "Saturday",
        }
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// URL dates outside these years are taken for ids, not dates (e.g. `/1234/56/78/`).
const URL_YEARS: std::ops::RangeInclusive<u32> = 1900..=2100;

fn is_leap(year: u32) -> bool {
    (year.is_multiple_of(4) && !year.is_multiple_of(100)) || year.is_multiple_of(400)
}

fn days_in_month(year: u32, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => 0,
    }
}

impl Date {
    /// The date, if it exists (checks month lengths and leap years).
    pub fn new(year: u32, month: u32, day: u32) -> Option<Date> {
        if !(1..=9999).contains(&year) || !(1..=12).contains(&month) {
            return None;
        }
        if day == 0 || day > days_in_month(year, month) {
            return None;
        }
        Some(Date {
            year: year as u16,
            month: month as u8,
            day: day as u8,
        })
    }

    /// Year.
    pub fn year(self) -> u32 {
        u32::from(self.year)
    }

    /// Month, 1 to 12.
    pub fn month(self) -> u32 {
        u32::from(self.month)
    }

    /// Day of the month, from 1.
    pub fn day(self) -> u32 {
        u32::from(self.day)
    }

    /// Day of the week, by Sakamoto's method.
    pub fn weekday(self) -> Weekday {
        const T: [u32; 12] = [0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4];
        let m = self.month();
        let y = if m < 3 { self.year() - 1 } else { self.year() };
        let w = (y + y / 4 - y / 100 + y / 400 + T[(m - 1) as usize] + self.day()) % 7;
        Weekday::ALL[w as usize]
    }

    /// English month name, e.g. "January".
    pub fn month_name(self) -> &'static str {
        MONTHS[usize::from(self.month - 1)]
    }

    /// The Calendar tool's sentence: "Today is Monday, January 30, 2023."
    pub fn render(self) -> String {
        format!(
            "Today is {}, {} {}, {}.",
            self.weekday().name(),
            self.month_name(),
            self.day,
            self.year
        )
    }

    /// Parses a date field: `2023-01-30`, `2023/01/30` or `20230130`, optionally followed by
    /// a time after `T` or a space (`2023-01-30T12:00:00Z`, `2023-01-30 12:00`). The date
    /// is taken as written; a time zone offset does not move it. Surrounding whitespace is
    /// ignored; None if the text is not such a date or the date does not exist.
    pub fn parse_iso(text: &str) -> Option<Date> {
        let text = text.trim();
        let b = text.as_bytes();
        let (date, rest) = if b.len() >= 10 && (b[4] == b'-' || b[4] == b'/') && b[7] == b[4] {
            ([num(&b[0..4])?, num(&b[5..7])?, num(&b[8..10])?], &b[10..])
        } else if b.len() >= 8 && b[..8].iter().all(u8::is_ascii_digit) {
            ([num(&b[0..4])?, num(&b[4..6])?, num(&b[6..8])?], &b[8..])
        } else {
            return None;
        };
        if !(rest.is_empty() || rest[0] == b'T' || rest[0] == b't' || rest[0] == b' ') {
            return None;
        }
        Date::new(date[0], date[1], date[2])
    }

    /// Finds a date in the path of `url`: consecutive segments `/2023/01/30/` (month and
    /// day may have one digit), or inside one segment `2023-01-30` or `20230130` not
    /// touching other digits. The first date from the left wins; years outside 1900–2100
    /// are ignored there, as they are more likely ids than dates.
    pub fn from_url(url: &str) -> Option<Date> {
        let path = url_path(url);
        let segments: Vec<&str> = path.split('/').collect();
        for (i, segment) in segments.iter().enumerate() {
            if let Some(date) = segments
                .get(i..i + 3)
                .and_then(|s| date_from_segments(s[0], s[1], s[2]))
            {
                return Some(date);
            }
            if let Some(date) = date_in_segment(segment) {
                return Some(date);
            }
        }
        None
    }
}

impl fmt::Display for Date {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }
}

/// Decimal value of an all-digit byte string (at most 4 digits here), else None.
fn num(digits: &[u8]) -> Option<u32> {
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        digits
            .iter()
            .fold(0u32, |acc, d| acc * 10 + u32::from(d - b'0')),
    )
}

/// The path of a URL: after "scheme://host", before "?" or "#". A string without "://" is
/// taken as a path already.
fn url_path(url: &str) -> &str {
    let end = url.find(['?', '#']).unwrap_or(url.len());
    let url = &url[..end];
    match url.find("://") {
        Some(i) => {
            let after = &url[i + 3..];
            after.find('/').map_or("", |j| &after[j..])
        }
        None => url,
    }
}

fn url_date(year: u32, month: u32, day: u32) -> Option<Date> {
    if URL_YEARS.contains(&year) {
        Date::new(year, month, day)
    } else {
        None
    }
}

fn date_from_segments(y: &str, m: &str, d: &str) -> Option<Date> {
    // The day segment is digits, with at most a file extension ("30.html"): in
    // "/2019/12/10-best-movies" the 10 is a slug's, not a day.
    let (d, rest) = d.split_at(d.find(|c: char| !c.is_ascii_digit()).unwrap_or(d.len()));
    let extension = |e: &str| !e.is_empty() && e.chars().all(|c| c.is_ascii_alphanumeric());
    if !(rest.is_empty() || rest.strip_prefix('.').is_some_and(extension)) {
        return None;
    }
    if y.len() != 4 || !(1..=2).contains(&m.len()) || !(1..=2).contains(&d.len()) {
        return None;
    }
    url_date(num(y.as_bytes())?, num(m.as_bytes())?, num(d.as_bytes())?)
}

/// `YYYY-MM-DD` or an 8-digit run `YYYYMMDD` inside one path segment.
fn date_in_segment(segment: &str) -> Option<Date> {
    let b = segment.as_bytes();
    let digit_at = |i: usize| b.get(i).is_some_and(u8::is_ascii_digit);
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        // `i` starts a run of digits.
        let run_end = (i..=b.len()).find(|&j| !digit_at(j)).unwrap_or(b.len());
        let run = &b[i..run_end];
        if run.len() == 8 {
            if let Some(date) = url_date(num(&run[0..4])?, num(&run[4..6])?, num(&run[6..8])?) {
                return Some(date);
            }
        }
        if run.len() == 4
            && b.get(run_end + 3) == Some(&b'-')
            && b.get(run_end) == Some(&b'-')
            && b.get(run_end + 1..run_end + 3)
                .is_some_and(|m| m.iter().all(u8::is_ascii_digit))
            && b.get(run_end + 4..run_end + 6)
                .is_some_and(|d| d.iter().all(u8::is_ascii_digit))
            && !digit_at(run_end + 6)
        {
            let date = url_date(
                num(run)?,
                num(&b[run_end + 1..run_end + 3])?,
                num(&b[run_end + 4..run_end + 6])?,
            );
            if date.is_some() {
                return date;
            }
        }
        i = run_end;
    }
    None
}

/// Settings of the Calendar tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CalendarConfig {
    /// Register the Calendar (default true).
    pub enabled: bool,
    /// Date used when a document has neither a date field nor a date in its URL, in a form
    /// [`Date::parse_iso`] accepts, e.g. "2023-01-30". None: such a call fails.
    pub date: Option<String>,
}

impl Default for CalendarConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            date: None,
        }
    }
}

/// The Calendar tool.
#[derive(Debug, Clone, Default)]
pub struct Calendar {
    fallback: Option<Date>,
}

impl Calendar {
    /// A calendar that falls back to `fallback` for documents without a date.
    pub fn new(fallback: Option<Date>) -> Self {
        Self { fallback }
    }

    /// The calendar `config` describes; an unparseable configured date is an error.
    pub fn from_config(config: &CalendarConfig) -> Result<Self, ToolConfigError> {
        let fallback = match config.date.as_deref() {
            None => None,
            Some(text) => Some(
                Date::parse_iso(text).ok_or_else(|| ToolConfigError::Invalid {
                    tool: "Calendar".into(),
                    message: format!(
                        "date {text:?} is not a valid date like 2023-01-30, 2023/01/30 or 20230130"
                    ),
                })?,
            ),
        };
        Ok(Self::new(fallback))
    }

    /// The date the document was written, by the rules in the module docs.
    pub fn date_for(&self, doc: &DocContext<'_>) -> Option<Date> {
        doc.date
            .and_then(Date::parse_iso)
            .or_else(|| doc.url.and_then(Date::from_url))
            .or(self.fallback)
    }
}

impl Tool for Calendar {
    fn name(&self) -> &str {
        "Calendar"
    }

    fn call(&self, input: &str, doc: &DocContext<'_>) -> Result<String, ToolError> {
        if !input.trim().is_empty() {
            return Err(ToolError::InvalidInput(format!(
                "Calendar takes no argument (it answers with the document's date), got {input:?}"
            )));
        }
        self.date_for(doc).map(Date::render).ok_or_else(|| {
            // Say why a date that is there was not used: "2023-02-30" is no date.
            let field = match doc.date {
                Some(d) => format!("its date field {d:?} is not a date (e.g. 2023-01-30)"),
                None => "it has no date field".into(),
            };
            let url = match doc.url {
                Some(_) => "its URL holds no date",
                None => "it has no URL",
            };
            ToolError::Failed(format!(
                "document {:?}: {field}, {url}, and no date is configured",
                doc.id
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn d(y: u32, m: u32, day: u32) -> Date {
        Date::new(y, m, day).unwrap()
    }

    #[test]
    fn weekdays() {
        assert_eq!(d(2000, 2, 29).weekday(), Weekday::Tuesday);
        assert_eq!(d(1970, 1, 1).weekday(), Weekday::Thursday);
        assert_eq!(d(2023, 1, 30).weekday(), Weekday::Monday);
        assert_eq!(d(1900, 3, 1).weekday(), Weekday::Thursday);
        assert_eq!(d(2024, 12, 31).weekday(), Weekday::Tuesday);
        assert_eq!(d(1, 1, 1).weekday(), Weekday::Monday);
    }

    #[test]
    fn validation() {
        assert!(Date::new(2023, 2, 29).is_none());
        assert!(Date::new(2024, 2, 29).is_some());
        assert!(Date::new(2000, 2, 29).is_some(), "divisible by 400");
        assert!(Date::new(1900, 2, 29).is_none(), "divisible by 100");
        assert!(Date::new(2023, 4, 31).is_none());
        assert!(Date::new(2023, 13, 1).is_none());
        assert!(Date::new(2023, 0, 1).is_none());
        assert!(Date::new(2023, 1, 0).is_none());
        assert!(Date::new(0, 1, 1).is_none());
        assert!(Date::new(10000, 1, 1).is_none());
    }

    #[test]
    fn render() {
        assert_eq!(
            d(2023, 1, 30).render(),
            "Today is Monday, January 30, 2023."
        );
        assert_eq!(d(2021, 7, 4).render(), "Today is Sunday, July 4, 2021.");
        assert_eq!(d(2023, 1, 30).to_string(), "2023-01-30");
    }

    #[test]
    fn parse_date_field() {
        let want = Some(d(2023, 1, 30));
        for ok in [
            "2023-01-30",
            " 2023-01-30\n",
            "2023-01-30T12:00:00Z",
            "2023-01-30T23:59:59-05:00",
            "2023-01-30 12:00",
            "2023/01/30",
            "20230130",
            "20230130T120000Z",
        ] {
            assert_eq!(Date::parse_iso(ok), want, "{ok:?}");
        }
        for bad in [
            "",
            "2023-02-29",
            "2023-1-30",
            "2023-01/30",
            "2023-01-30x",
            "2023-01-301",
            "30/01/2023",
            "January 30, 2023",
            "2023-13-01",
            "２０２３-01-30",
            "202301",
        ] {
            assert_eq!(Date::parse_iso(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn parse_url() {
        let want = Some(d(2023, 1, 30));
        for url in [
            "https://example.com/2023/01/30/some-story",
            "https://example.com/news/2023/1/30/",
            "https://example.com/2023/01/30",
            "https://example.com/2023/01/30.html",
            "http://example.com/a/story-2023-01-30.html",
            "http://example.com/a/2023-01-30",
            "https://example.com/archive/20230130/x",
            "https://example.com/p_20230130_x?date=1999-01-01",
            "/2023/01/30/relative",
            "https://example.com/12345/2023/01/30/",
        ] {
            assert_eq!(Date::from_url(url), want, "{url:?}");
        }
        // The years taken, both ends, and the first ones past them.
        assert_eq!(Date::from_url("/1900/01/01/"), Some(d(1900, 1, 1)));
        assert_eq!(Date::from_url("/2100/12/31/"), Some(d(2100, 12, 31)));
        assert_eq!(Date::from_url("/1899/12/31/"), None);
        assert_eq!(Date::from_url("/2101/01/01/"), None);
        for url in [
            "https://example.com/",
            "https://2023.01.30.example.com/",
            "https://example.com/2023/02/29/",
            "https://example.com/story/123456789",
            "https://example.com/1234/05/06/",
            "https://example.com/x?date=2023-01-30",
            "https://example.com/#/2023/01/30",
            "https://example.com/2023/01/",
            "https://example.com/2023-01-300",
            // A slug that starts with a number is not a day.
            "https://example.com/2023/01/10-best-movies",
            "https://example.com/2023/01/4th-of-july-parade",
            "https://example.com/2023/01/30.",
            "",
            "::::",
            "https://例え.jp/日本/2023年",
        ] {
            assert_eq!(Date::from_url(url), None, "{url:?}");
        }
        // Left-most date wins.
        assert_eq!(
            Date::from_url("https://e.com/2020/05/06/then-2023-01-30"),
            Some(d(2020, 5, 6))
        );
    }

    #[test]
    fn tool_precedence_field_then_url_then_config() {
        let cal = Calendar::from_config(&CalendarConfig {
            enabled: true,
            date: Some("2000-02-29".into()),
        })
        .unwrap();
        let url = Some("https://e.com/2021/07/04/x");
        let call = |date, url| {
            cal.call(
                "",
                &DocContext {
                    id: "d1",
                    url,
                    date,
                },
            )
        };
        assert_eq!(
            call(Some("2023-01-30"), url).unwrap(),
            "Today is Monday, January 30, 2023."
        );
        assert_eq!(
            call(Some("not a date"), url).unwrap(),
            "Today is Sunday, July 4, 2021."
        );
        assert_eq!(call(None, url).unwrap(), "Today is Sunday, July 4, 2021.");
        assert_eq!(
            call(None, Some("https://e.com/about")).unwrap(),
            "Today is Tuesday, February 29, 2000."
        );
        let err = Calendar::new(None)
            .call("", &DocContext::default())
            .unwrap_err();
        assert!(matches!(err, ToolError::Failed(_)));
        assert!(err.to_string().contains("no date field"), "{err}");
        // A date field that is no date is named as such.
        let doc = DocContext {
            date: Some("2023-02-30"),
            ..DocContext::default()
        };
        let err = Calendar::new(None).call("", &doc).unwrap_err();
        assert!(
            err.to_string()
                .contains(r#"date field "2023-02-30" is not a date"#),
            "{err}"
        );
        // An argument is not answered; spaces are no argument.
        let dated = Calendar::new(Some(d(2023, 1, 30)));
        let err = dated.call("tomorrow", &DocContext::default()).unwrap_err();
        assert!(matches!(err, ToolError::InvalidInput(_)), "{err}");
        assert_eq!(
            dated.call(" ", &DocContext::default()).unwrap(),
            "Today is Monday, January 30, 2023."
        );
    }

    #[test]
    fn bad_configured_date_is_an_error() {
        let cfg = CalendarConfig {
            enabled: true,
            date: Some("2023-02-29".into()),
        };
        assert!(Calendar::from_config(&cfg).is_err());
    }

    /// Days since 1970-01-01 (Hinnant's days_from_civil), an independent weekday check.
    fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        era * 146097 + doe - 719468
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn weekday_agrees_with_day_count(y in 1u32..=9999, m in 1u32..=12, day in 1u32..=31) {
            if let Some(date) = Date::new(y, m, day) {
                // 1970-01-01 was a Thursday (index 4 from Sunday).
                let days = days_from_civil(i64::from(y), i64::from(m), i64::from(day));
                let want = Weekday::ALL[(days + 4).rem_euclid(7) as usize];
                prop_assert_eq!(date.weekday(), want);
                prop_assert_eq!(Date::parse_iso(&date.to_string()), Some(date));
            } else {
                prop_assert!(day > 28);
            }
        }

        #[test]
        fn parsing_never_panics(s in "\\PC{0,80}") {
            let _ = Date::parse_iso(&s);
            let _ = Date::from_url(&s);
        }

        #[test]
        fn url_like_strings_never_panic(s in "[0-9/:?#a-z.\\-]{0,80}") {
            let _ = Date::from_url(&s);
        }
    }
}
