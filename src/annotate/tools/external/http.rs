//! One call of an HTTP tool: a POST of `{"input", "tool"}` with a deadline on the whole
//! exchange, and what each reply means (retried or not).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{final_err, retry_err, shorten, timeout_err, Attempt, MAX_OUTPUT_BYTES};

/// Why `url` (which starts with "http://") cannot be POSTed to, if it cannot: it must parse as
/// a URI (no spaces or other invalid characters) and name a host, and a port must be a number
/// up to 65535. Checked when the tool is configured, so that a typo is not a failure of every
/// call at run time.
pub(super) fn check_url(url: &str) -> Result<(), String> {
    let uri: ureq::http::Uri = url.parse().map_err(|e| format!("{e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err("the scheme must be http".into());
    }
    let authority = uri.authority().ok_or("no host")?;
    if authority.host().is_empty() {
        return Err("no host".into());
    }
    // "host:" and "host:99999" parse, but name no port a connection can use.
    let host_port = authority.as_str().rsplit('@').next().unwrap_or_default();
    let port_text = host_port
        .rsplit_once(':')
        .filter(|(_, after)| !after.contains(']'))
        .map(|(_, port)| port);
    if let Some(port) = port_text {
        match port.parse::<u16>() {
            Ok(p) if p > 0 => {}
            _ => return Err(format!("port {port:?} is not a number from 1 to 65535")),
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct HttpRequest<'a> {
    input: &'a str,
    tool: &'a str,
}

#[derive(Deserialize)]
struct HttpReply {
    result: Option<serde_json::Value>,
    error: Option<serde_json::Value>,
}

pub(super) fn post_json(
    url: &str,
    tool: &str,
    input: &str,
    timeout: Duration,
) -> Result<String, Attempt> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        // A redirect is the reply (below): followed, a 302 turns the POST into a GET without
        // the input, and its target's answer would be taken for the tool's.
        .max_redirects(0)
        .build()
        .into();
    let transport = |e: ureq::Error| -> Attempt {
        match e {
            ureq::Error::Timeout(_) => timeout_err(timeout),
            ureq::Error::Io(io) if io.kind() == std::io::ErrorKind::TimedOut => {
                timeout_err(timeout)
            }
            ureq::Error::Io(_)
            | ureq::Error::ConnectionFailed
            | ureq::Error::HostNotFound
            | ureq::Error::Protocol(_) => retry_err(format!("POST {url}: {e}")),
            other => final_err(format!("POST {url}: {other}")),
        }
    };
    let mut response = agent
        .post(url)
        .send_json(&HttpRequest { input, tool })
        .map_err(transport)?;
    let status = response.status().as_u16();
    let success = (200..300).contains(&status);
    let retry_status = status >= 500 || status == 408 || status == 429;
    let by_status = |message: String| {
        if retry_status {
            retry_err(message)
        } else {
            final_err(message)
        }
    };
    // Before the body: a redirect names its target whatever its body (unreadable, too large).
    if (300..400).contains(&status) {
        let to = response
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok())
            .unwrap_or("nowhere given");
        return Err(final_err(format!(
            "POST {url}: HTTP {status} redirects to {to}; redirects are not followed: give the \
             service's own URL"
        )));
    }
    // Bytes, whatever the Content-Type says (ureq decodes only text/* leniently): invalid
    // UTF-8 is replaced, as in a command's output.
    let body = match response
        .body_mut()
        .with_config()
        .limit(MAX_OUTPUT_BYTES as u64)
        .read_to_vec()
    {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        // A failed reply whose body cannot be read still fails for its status.
        Err(e) if !success => {
            return Err(by_status(format!(
                "POST {url}: HTTP {status} (its body could not be read: {})",
                body_error(e)
            )))
        }
        Err(ureq::Error::BodyExceedsLimit(_)) => {
            return Err(final_err(format!(
                "POST {url}: reply is larger than {MAX_OUTPUT_BYTES} bytes"
            )))
        }
        Err(other) => return Err(transport(other)),
    };
    if !success {
        return Err(by_status(format!(
            "POST {url}: HTTP {status}: {}",
            shorten(body.trim(), 300)
        )));
    }
    let reply: HttpReply = crate::util::json::object_from_str(&body).map_err(|e| {
        final_err(format!(
            "POST {url}: reply is not JSON {{\"result\": ...}}: {e}"
        ))
    })?;
    match (reply.result, reply.error) {
        (Some(serde_json::Value::String(text)), _) if !text.trim().is_empty() => {
            Ok(text.trim().to_string())
        }
        (_, Some(error)) if !error.is_null() => Err(final_err(format!(
            "POST {url}: service error: {}",
            shorten(&json_text(&error), 300)
        ))),
        (Some(serde_json::Value::String(_)), _) => {
            Err(final_err(format!("POST {url}: empty result")))
        }
        _ => Err(final_err(format!(
            "POST {url}: reply has no string \"result\""
        ))),
    }
}

fn body_error(e: ureq::Error) -> String {
    match e {
        ureq::Error::BodyExceedsLimit(_) => format!("larger than {MAX_OUTPUT_BYTES} bytes"),
        other => other.to_string(),
    }
}

fn json_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::run;
    use super::super::{ExternalTool, ToolError};
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::thread;
    use std::time::Instant;

    /// Serves each connection with `respond(request_body)` -> (status, JSON body), or never
    /// answers it (None: the connection is held past the client's timeout); counts them.
    fn server(
        respond: impl Fn(&str) -> Option<(u16, String)> + Send + 'static,
    ) -> (String, Arc<AtomicUsize>) {
        serve(move |body| {
            respond(body).map(|(status, json)| reply(status, "application/json", json.as_bytes()))
        })
    }

    /// Answers each connection with the raw bytes `respond(request_body)` (status line,
    /// headers and body), then closes it; counts the connections.
    fn raw_server(
        respond: impl Fn(&str) -> Vec<u8> + Send + 'static,
    ) -> (String, Arc<AtomicUsize>) {
        serve(move |body| Some(respond(body)))
    }

    /// The loop of `server` and `raw_server`: up to 10 connections, each answered with
    /// `respond(request_body)`'s bytes, or held open for 2 s when it gives none.
    fn serve(
        respond: impl Fn(&str) -> Option<Vec<u8>> + Send + 'static,
    ) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/tool", listener.local_addr().unwrap());
        let count = Arc::new(AtomicUsize::new(0));
        let seen = count.clone();
        thread::spawn(move || {
            for stream in listener.incoming().take(10) {
                let Ok(mut stream) = stream else { return };
                seen.fetch_add(1, Ordering::SeqCst);
                let Some(body) = read_request(&stream) else {
                    continue;
                };
                match respond(&body) {
                    Some(bytes) => {
                        let _ = stream.write_all(&bytes);
                    }
                    None => thread::sleep(Duration::from_secs(2)),
                }
            }
        });
        (url, count)
    }

    fn reply(status: u16, content_type: &str, body: &[u8]) -> Vec<u8> {
        let mut out = format!(
            "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(body);
        out
    }

    #[test]
    fn http_invalid_utf8_is_replaced_whatever_the_content_type() {
        for content_type in ["application/json", "text/plain", "application/octet-stream"] {
            let (url, count) =
                raw_server(move |_| reply(200, content_type, b"{\"result\": \"a\xff b\"}"));
            assert_eq!(
                run(&http_tool(&url, 2), "x"),
                Ok("a\u{FFFD} b".into()),
                "{content_type}"
            );
            assert_eq!(count.load(Ordering::SeqCst), 1, "fetched once");
        }
        // A failed reply with such a body keeps its status.
        let (url, count) =
            raw_server(|_| reply(503, "application/json", b"{\"error\": \"busy \xff\"}"));
        let msg = run(&http_tool(&url, 1), "x").unwrap_err().to_string();
        assert!(
            msg.contains("HTTP 503") && msg.contains("busy \u{FFFD}"),
            "{msg}"
        );
        assert_eq!(count.load(Ordering::SeqCst), 2, "a 503 is retried");
    }

    #[test]
    fn http_status_survives_an_unreadable_body() {
        // The body is cut short: Content-Length promises more than is sent.
        let cut = |status: u16| {
            move |_: &str| {
                format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n\
                     Content-Length: 100\r\nConnection: close\r\n\r\n{{\"err"
                )
                .into_bytes()
            }
        };
        let (url, count) = raw_server(cut(500));
        let msg = run(&http_tool(&url, 1), "x").unwrap_err().to_string();
        assert!(msg.contains("HTTP 500"), "{msg}");
        assert_eq!(count.load(Ordering::SeqCst), 2, "a 500 is retried");
        let (url, count) = raw_server(cut(404));
        let msg = run(&http_tool(&url, 2), "x").unwrap_err().to_string();
        assert!(msg.contains("HTTP 404"), "{msg}");
        assert_eq!(count.load(Ordering::SeqCst), 1, "a 404 is not retried");
        // An oversized failed reply keeps its status too.
        let (url, _) = raw_server(|_| reply(500, "text/plain", &vec![b'a'; MAX_OUTPUT_BYTES + 1]));
        let msg = run(&http_tool(&url, 0), "x").unwrap_err().to_string();
        assert!(
            msg.contains("HTTP 500") && msg.contains("larger than"),
            "{msg}"
        );
        let (url, _) = raw_server(|_| reply(200, "text/plain", &vec![b'a'; MAX_OUTPUT_BYTES + 1]));
        let msg = run(&http_tool(&url, 0), "x").unwrap_err().to_string();
        assert!(msg.contains("larger than"), "{msg}");
    }

    fn read_request(stream: &TcpStream) -> Option<String> {
        let mut reader = BufReader::new(stream);
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).ok()?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().ok()?;
                }
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).ok()?;
        String::from_utf8(body).ok()
    }

    fn http_tool(url: &str, retries: u32) -> ExternalTool {
        ExternalTool::http("MT", url)
            .with_timeout(Duration::from_millis(300))
            .with_retries(retries)
    }

    #[test]
    fn http_success() {
        let (url, count) = server(|body| {
            let req: serde_json::Value = serde_json::from_str(body).ok()?;
            let input = req["input"].as_str()?.to_uppercase();
            let tool = req["tool"].as_str()?;
            Some((
                200,
                serde_json::json!({ "result": format!("{tool}:{input}") }).to_string(),
            ))
        });
        let tool = http_tool(&url, 0);
        assert_eq!(run(&tool, "bonjour"), Ok("MT:BONJOUR".into()));
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn http_500_is_retried_then_fails() {
        let (url, count) = server(|_| Some((500, "{\"error\":\"overloaded\"}".into())));
        let err = run(&http_tool(&url, 2), "x").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("500") && msg.contains("overloaded"), "{msg}");
        assert_eq!(count.load(Ordering::SeqCst), 3);
    }

    /// A redirect is not followed (a 302 would turn the POST into a GET without the input, and
    /// the target's answer would be taken for the tool's): it is an error naming the target,
    /// whatever its body (301: one cut short, which cannot be read).
    #[test]
    fn http_redirects_are_errors_naming_the_target() {
        for (status, length, body) in [(302, 0, ""), (307, 0, ""), (301, 100, "cut short")] {
            let (url, count) = raw_server(move |_| {
                format!(
                    "HTTP/1.1 {status} X\r\nLocation: /elsewhere\r\nContent-Length: {length}\r\n\
                     Connection: close\r\n\r\n{body}"
                )
                .into_bytes()
            });
            let err = run(&http_tool(&url, 2), "x").unwrap_err().to_string();
            assert!(
                err.contains(&format!("HTTP {status} redirects to /elsewhere")),
                "{err}"
            );
            assert_eq!(count.load(Ordering::SeqCst), 1, "not followed, not retried");
        }
    }

    #[test]
    fn http_4xx_and_bad_replies_are_not_retried() {
        let (url, count) = server(|_| Some((400, "bad".into())));
        assert!(matches!(
            run(&http_tool(&url, 2), "x"),
            Err(ToolError::Failed(_))
        ));
        assert_eq!(count.load(Ordering::SeqCst), 1);

        for (reply, needle) in [
            ("not json", "not JSON"),
            ("{\"result\": 3}", "no string"),
            ("{\"result\": \"  \"}", "empty"),
            ("{\"error\": \"no model\"}", "no model"),
        ] {
            let (url, _) = server(move |_| Some((200, reply.to_string())));
            let err = run(&http_tool(&url, 2), "x").unwrap_err();
            assert!(err.to_string().contains(needle), "{reply}: {err}");
        }
    }

    #[test]
    fn http_that_never_answers_times_out() {
        let (url, _) = server(|_| None);
        let start = Instant::now();
        let got = run(&http_tool(&url, 0), "x");
        assert_eq!(
            got,
            Err(ToolError::Timeout {
                after: Duration::from_millis(300),
                tries: 1
            })
        );
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn http_connection_refused_fails() {
        // Bind then drop to get a port with (very likely) nothing listening.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let got = run(&http_tool(&format!("http://127.0.0.1:{port}/x"), 1), "x");
        assert!(
            matches!(
                got,
                Err(ToolError::Failed(_)) | Err(ToolError::Timeout { .. })
            ),
            "{got:?}"
        );
    }

    /// A reply of exactly `MAX_OUTPUT_BYTES` is accepted; one byte more is refused at once,
    /// not retried (another try would get the same reply).
    #[test]
    fn http_body_limit_is_inclusive_and_an_oversized_reply_is_not_retried() {
        let body = |size: usize| {
            let mut json = b"{\"result\": \"".to_vec();
            json.resize(size - 2, b'a');
            json.extend_from_slice(b"\"}");
            json
        };
        let (url, _) = raw_server(move |_| reply(200, "application/json", &body(MAX_OUTPUT_BYTES)));
        assert_eq!(
            run(&http_tool(&url, 0), "x").unwrap().len(),
            MAX_OUTPUT_BYTES - 14
        );
        let (url, count) =
            raw_server(move |_| reply(200, "application/json", &body(MAX_OUTPUT_BYTES + 1)));
        let msg = run(&http_tool(&url, 2), "x").unwrap_err().to_string();
        assert!(msg.contains("larger than"), "{msg}");
        assert_eq!(count.load(Ordering::SeqCst), 1, "not retried");
    }

    /// A reply that is not HTTP, and a connection closed without a reply, are transport
    /// failures: retried.
    #[test]
    fn http_garbage_or_no_reply_is_retried() {
        for answer in [&b"garbage\r\n\r\n"[..], b""] {
            let (url, count) = raw_server(move |_| answer.to_vec());
            let got = run(&http_tool(&url, 1), "x");
            assert!(matches!(got, Err(ToolError::Failed(_))), "{got:?}");
            assert_eq!(count.load(Ordering::SeqCst), 2, "{answer:?}: {got:?}");
        }
    }

    /// Any 2xx status is a success, not only 200.
    #[test]
    fn http_any_2xx_status_is_a_success() {
        for status in [201, 202, 299] {
            let (url, _) = server(move |_| Some((status, "{\"result\": \"Paris\"}".into())));
            assert_eq!(
                run(&http_tool(&url, 0), "x"),
                Ok("Paris".into()),
                "{status}"
            );
        }
    }

    /// Every 3xx is a redirect (300 and 308 too, not only the common ones), and one without
    /// a Location says none was given.
    #[test]
    fn http_every_3xx_is_a_redirect_and_a_missing_target_is_named() {
        for (status, location, named) in [
            (300, "Location: /elsewhere\r\n", "/elsewhere"),
            (308, "Location: /elsewhere\r\n", "/elsewhere"),
            (302, "", "nowhere given"),
        ] {
            let (url, count) = raw_server(move |_| {
                format!(
                    "HTTP/1.1 {status} X\r\n{location}Content-Length: 0\r\n\
                     Connection: close\r\n\r\n"
                )
                .into_bytes()
            });
            let err = run(&http_tool(&url, 2), "x").unwrap_err().to_string();
            assert!(
                err.contains(&format!("HTTP {status} redirects to {named};")),
                "{err}"
            );
            assert_eq!(count.load(Ordering::SeqCst), 1, "not retried");
        }
    }

    /// A 200 whose body is cut short (the connection dropped) is a transport failure:
    /// retried, as the next try may get all of it.
    #[test]
    fn http_a_success_cut_short_is_retried() {
        let (url, count) = raw_server(|_| {
            b"HTTP/1.1 200 X\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\
              Connection: close\r\n\r\n{\"result\": \"Par"
                .to_vec()
        });
        let got = run(&http_tool(&url, 1), "x");
        assert!(matches!(got, Err(ToolError::Failed(_))), "{got:?}");
        assert_eq!(count.load(Ordering::SeqCst), 2, "{got:?}");
    }

    /// A failed status's body and a service's error are quoted trimmed, cut at 300 characters.
    #[test]
    fn http_a_failed_reply_and_a_service_error_quote_300_characters() {
        let long: String = (0..400u32)
            .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
            .collect();
        let body = format!("\n  {long}  \n");
        let (url, _) = raw_server(move |_| reply(400, "text/plain", body.as_bytes()));
        let msg = run(&http_tool(&url, 0), "x").unwrap_err().to_string();
        assert_eq!(msg, format!("POST {url}: HTTP 400: {}…", &long[..300]));
        let (url, _) = raw_server(move |_| reply(400, "text/plain", b"\n  no model \n"));
        let msg = run(&http_tool(&url, 0), "x").unwrap_err().to_string();
        assert_eq!(msg, format!("POST {url}: HTTP 400: no model"));
        let json = serde_json::json!({ "error": long.clone() }).to_string();
        let (url, _) = server(move |_| Some((200, json.clone())));
        let msg = run(&http_tool(&url, 0), "x").unwrap_err().to_string();
        assert_eq!(msg, format!("POST {url}: service error: {}…", &long[..300]));
    }
}
