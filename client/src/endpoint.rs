//! What makes a server address that parses as a URI impossible to dial.
//!
//! The URI parser takes more than a connection can use:
//! `http://127.0.0.1:notaport` parses (its port is then "unknown", and the
//! connector dials port 80, so the user reads "connection refused" about a
//! port they never named), as do `http://127.0.0.1:99999`, `http://foo:bar`
//! (reported as a failed name lookup) and `ftp://host:1`. Both the typed client and the agent
//! refuse such an address before anything connects, saying what is wrong
//! with it.

use tonic::codegen::http::Uri;
use tonic::transport::Endpoint;

/// Why a server address cannot be dialled, found before anything
/// connects. The typed client and the agent each say it with their own
/// error type.
#[derive(Debug)]
pub(crate) enum Undialable {
    /// The URI parser refused it.
    Invalid(tonic::transport::Error),
    /// It parses but cannot be dialled; what is wrong ([`unusable`]).
    Unusable(String),
    /// It has no scheme (`127.0.0.1:50051`, as grpcurl takes it).
    NoScheme,
}

/// `address` as an endpoint, once it is one a connection can use.
pub(crate) fn dialable(address: &str) -> Result<Endpoint, Undialable> {
    let endpoint = Endpoint::from_shared(address.to_owned()).map_err(Undialable::Invalid)?;
    if let Some(problem) = unusable(endpoint.uri()) {
        return Err(Undialable::Unusable(problem));
    }
    // "127.0.0.1:50051" parses as a URI but can never be dialled: say so,
    // rather than "could not connect".
    if endpoint.uri().scheme().is_none() {
        return Err(Undialable::NoScheme);
    }
    Ok(endpoint)
}

/// What is wrong with `uri` (which has a scheme) for a gRPC connection, in
/// words: a scheme other than `http` or `https`, no host, or a port that is
/// not a number from 1 to 65535. `None` when it can be dialled.
pub(crate) fn unusable(uri: &Uri) -> Option<String> {
    if let Some(scheme) = uri.scheme_str()
        && scheme != "http"
        && scheme != "https"
    {
        return Some(format!("its scheme {scheme:?} is not http or https"));
    }
    let Some(authority) = uri.authority() else {
        return Some("it names no host".into());
    };
    if authority.host().is_empty() {
        return Some("it names no host".into());
    }
    // The text after the last ':' is the port, unless that ':' is inside
    // an IPv6 address (`[::1]` has no port).
    let text = authority.as_str();
    let port = text.rfind(':').map(|colon| &text[colon + 1..])?;
    if port.contains(']') {
        return None;
    }
    match port.parse::<u16>() {
        Ok(0) => Some("its port 0 cannot be dialled; name the server's port".into()),
        Ok(_) => None,
        Err(_) if port.is_empty() => Some("it has a ':' but no port after it".into()),
        Err(_) => Some(format!("its port {port:?} is not a number from 1 to 65535")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(address: &str) -> Option<String> {
        unusable(&address.parse::<Uri>().expect("parses as a URI"))
    }

    #[test]
    fn addresses_a_server_can_listen_on_are_usable() {
        for address in [
            "http://127.0.0.1:50051",
            "https://reconciled.example.com:443",
            "http://localhost",
            "http://[::1]:50051",
            "http://[::1]",
            "http://user@host:1",
        ] {
            assert_eq!(problem(address), None, "{address}");
        }
    }

    #[test]
    fn a_port_that_cannot_be_dialled_is_named() {
        for (address, port) in [
            ("http://127.0.0.1:notaport", "\"notaport\""),
            ("http://127.0.0.1:99999", "\"99999\""),
            ("http://[::1]:5005l", "\"5005l\""),
        ] {
            let problem = problem(address).expect(address);
            assert!(
                problem.contains(port) && problem.contains("1 to 65535"),
                "{address}: {problem}"
            );
        }
        assert!(problem("http://127.0.0.1:0").is_some_and(|p| p.contains("port 0")));
        assert!(problem("http://127.0.0.1:").is_some_and(|p| p.contains("no port")));
        // Without a scheme too (which is refused for that as well): the
        // port is what the user mistyped.
        assert!(problem("foo:bar").is_some_and(|p| p.contains("\"bar\"")));
    }

    #[test]
    fn a_scheme_other_than_http_or_https_is_named() {
        let problem = problem("ftp://127.0.0.1:1").expect("ftp is refused");
        assert!(
            problem.contains("\"ftp\"") && problem.contains("not http or https"),
            "{problem}"
        );
    }
}
