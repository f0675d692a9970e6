//! The HTTP ports a browser can reach (the dashboard and the metrics
//! endpoint) answer, when they listen on loopback only, only requests
//! addressed to a loopback name: `localhost` or a loopback address, with
//! any port.
//!
//! This defends against DNS rebinding: a web page an operator visits can
//! point its own host name at 127.0.0.1 and then read, as its own origin,
//! what a loopback port answers without a token (the dashboard's files,
//! its schema, `/metrics` with the fleet's counts). The browser sends
//! the page's host name in `Host`, which a loopback port never expects.
//! A port listening beyond loopback is reached by names this server
//! cannot know, and is not checked (use TLS and tokens there).

use tonic::codegen::http::Request;
use tonic::codegen::http::header::HOST;

/// Whether `request` may be answered by a port whose listening address is
/// loopback (`listens_on_loopback`): always when the port listens beyond
/// loopback; otherwise when it names no host (not a browser: browsers
/// always send one) or names a loopback one.
pub fn request_allowed<B>(request: &Request<B>, listens_on_loopback: bool) -> bool {
    if !listens_on_loopback {
        return true;
    }
    // HTTP/2 carries the host in the URI (`:authority`), HTTP/1.1 in `Host`.
    let host = match request.uri().authority() {
        Some(authority) => Some(authority.host()),
        None => match request.headers().get(HOST) {
            Some(value) => match value.to_str() {
                Ok(host) => Some(host_of(host)),
                Err(_) => return false,
            },
            None => None,
        },
    };
    host.is_none_or(is_loopback_name)
}

/// The host part of a `Host` header value (`name`, `name:port`,
/// `[v6]`, `[v6]:port`).
fn host_of(value: &str) -> &str {
    if let Some(rest) = value.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    value.split(':').next().unwrap_or(value)
}

/// Whether `host` (without port; an IPv6 address with or without its
/// brackets) names this machine's loopback interface.
fn is_loopback_name(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback())
}

/// What a refused request is told.
pub const REFUSAL: &str = "This port listens on loopback and answers only requests addressed \
                           to localhost or a loopback address (127.0.0.1, [::1]). To reach it \
                           under another name, listen on that interface (--ui-listen, \
                           --metrics-listen) and use TLS.\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn with_host(host: &str) -> Request<()> {
        Request::builder()
            .uri("/metrics")
            .header(HOST, host)
            .body(())
            .expect("a request")
    }

    #[test]
    fn loopback_names_pass_with_or_without_a_port() {
        for host in [
            "localhost",
            "LocalHost:8080",
            "127.0.0.1",
            "127.0.0.1:9090",
            "127.8.9.1:1",
            "[::1]",
            "[::1]:8080",
        ] {
            assert!(request_allowed(&with_host(host), true), "{host}");
        }
        let no_host = Request::builder().uri("/").body(()).expect("a request");
        assert!(request_allowed(&no_host, true));
        let http2 = Request::builder()
            .uri("http://[::1]:8080/schema.json")
            .body(())
            .expect("a request");
        assert!(request_allowed(&http2, true));
    }

    #[test]
    fn other_names_are_refused_on_loopback_only() {
        for host in [
            "attacker.example",
            "attacker.example:8080",
            "localhost.attacker.example",
            "127.0.0.1.nip.io",
            "10.0.0.1:8080",
            "[fe80::1]:8080",
            "0.0.0.0",
        ] {
            assert!(!request_allowed(&with_host(host), true), "{host}");
            assert!(request_allowed(&with_host(host), false), "{host}");
        }
        let http2 = Request::builder()
            .uri("http://attacker.example:8080/")
            .body(())
            .expect("a request");
        assert!(!request_allowed(&http2, true));
    }
}
