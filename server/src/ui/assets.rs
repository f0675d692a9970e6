//! The dashboard's files, embedded at build time (building and running
//! need no Node toolchain), and the security headers every page response
//! carries.

/// The Content-Security-Policy of every dashboard response: scripts,
/// styles, images and connections only from the dashboard's own origin; no
/// inline script, no `eval`, no plugins, no framing.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// One embedded file.
#[derive(Debug, Clone, Copy)]
pub struct Asset {
    /// The URL path it is served at, e.g. `/assets/app.js`.
    pub path: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $file:literal, $content_type:literal) => {
        Asset {
            path: $path,
            content_type: $content_type,
            body: include_bytes!(concat!("../../ui/", $file)),
        }
    };
}

/// An ES module under `server/ui/`, served under `/assets/`.
macro_rules! script {
    ($file:literal) => {
        Asset {
            path: concat!("/assets/", $file),
            content_type: "text/javascript; charset=utf-8",
            body: include_bytes!(concat!("../../ui/", $file)),
        }
    };
}

/// Every embedded file. `/` is the single page; views are addressed by the
/// URL fragment (`#/tenant/NAME`), so no other HTML path exists.
pub const ASSETS: &[Asset] = &[
    asset!("/", "index.html", "text/html; charset=utf-8"),
    asset!("/assets/style.css", "style.css", "text/css; charset=utf-8"),
    script!("app.js"),
    script!("proto.js"),
    script!("grpcweb.js"),
    script!("api.js"),
    script!("dom.js"),
    script!("fleet.js"),
    script!("tenant.js"),
    script!("items.js"),
    script!("panel.js"),
    script!("graph.js"),
    script!("vendor/dagre.esm.js"),
    asset!(
        "/assets/vendor/dagre.LICENSE",
        "vendor/dagre.LICENSE",
        "text/plain; charset=utf-8"
    ),
];

/// The embedded file served at `path`, if any.
pub fn find(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|asset| asset.path == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_only_embedded_scripts_and_no_inline_code() {
        let page = std::str::from_utf8(find("/").expect("index").body).expect("utf-8");
        for tag in page.split("<script").skip(1) {
            let src = tag
                .split("src=\"")
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_else(|| panic!("inline script in index.html: {tag}"));
            assert!(find(src).is_some(), "index.html loads {src}, not embedded");
        }
        let lower = page.to_ascii_lowercase();
        let handler = lower
            .split(|c: char| c.is_whitespace())
            .any(|word| word.starts_with("on") && word.contains('='));
        assert!(!handler, "inline event handler in index.html");
        assert!(!page.contains("style=\""), "inline style in index.html");
    }

    #[test]
    fn every_module_import_is_embedded() {
        for asset in ASSETS
            .iter()
            .filter(|a| a.content_type.starts_with("text/javascript"))
        {
            let text = std::str::from_utf8(asset.body).expect("utf-8");
            for line in text.lines().filter(|l| l.starts_with("import ")) {
                let target = line
                    .split(['"', '\''])
                    .nth(1)
                    .unwrap_or_else(|| panic!("unparsed import in {}: {line}", asset.path));
                let resolved = format!("/assets/{}", target.trim_start_matches("./"));
                assert!(find(&resolved).is_some(), "{} imports {target}", asset.path);
            }
        }
    }

    #[test]
    fn the_policy_forbids_inline_script_and_foreign_origins() {
        assert!(CONTENT_SECURITY_POLICY.contains("default-src 'self'"));
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe-inline"));
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe-eval"));
    }

    #[test]
    fn no_script_parses_html_or_evaluates_strings() {
        // Item and tenant names are user data: the page builds DOM nodes
        // from text only (dom.js), never from markup.
        for asset in ASSETS
            .iter()
            .filter(|a| a.content_type.starts_with("text/javascript"))
            .filter(|a| !a.path.contains("/vendor/"))
        {
            let text = std::str::from_utf8(asset.body).expect("utf-8");
            for forbidden in [
                "innerHTML",
                "outerHTML",
                "insertAdjacentHTML",
                "document.write",
                "eval(",
                "new Function",
                "DOMParser",
                "createContextualFragment",
            ] {
                assert!(!text.contains(forbidden), "{} uses {forbidden}", asset.path);
            }
        }
    }
}
