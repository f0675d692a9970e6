//! Where reconctl finds the server, the token and the tenant: flags, then
//! environment variables, then a TOML configuration file, then defaults.
//! Each setting is resolved on its own, and remembers where its value came
//! from so that errors can name it.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::failure::Failure;
use crate::connection_env::{
    ADDR_ENV, CA_CERT_ENV, CLIENT_CERT_ENV, CLIENT_KEY_ENV, DEFAULT_ADDR, TENANT_ENV, TOKEN_ENV,
    TOKEN_FILE_ENV, normalize_addr,
};

/// The configuration file to read instead of the default one.
pub(crate) const CONFIG_ENV: &str = "RECONCTL_CONFIG";

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// A command-line flag, e.g. `--token`.
    Flag(&'static str),
    /// An environment variable, e.g. `RECONCILED_TOKEN`.
    Env(&'static str),
    /// A key of the configuration file.
    File {
        /// The file.
        path: PathBuf,
        /// The key, e.g. `token`.
        key: &'static str,
    },
    /// The file named by a `--token-file` flag, variable or key.
    TokenFile {
        /// The file holding the token.
        path: PathBuf,
        /// Where the file's name came from.
        named_by: Box<Source>,
    },
    /// The built-in default.
    Default,
    /// The intent file given with `-f`.
    IntentFile(String),
}

impl fmt::Display for Source {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Flag(flag) => write!(formatter, "{flag}"),
            Source::Env(name) => write!(formatter, "{name}"),
            Source::File { path, key } => {
                write!(formatter, "`{key}` in config file {}", path.display())
            }
            Source::TokenFile { path, named_by } => {
                write!(formatter, "token file {} (from {named_by})", path.display())
            }
            Source::Default => formatter.write_str("the default"),
            Source::IntentFile(file) => write!(formatter, "the intent file {file}"),
        }
    }
}

/// A value with its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Setting {
    /// The value.
    pub(crate) value: String,
    /// Where it came from.
    pub(crate) source: Source,
}

/// The settings as flags give them (every one optional).
#[derive(Debug, Clone, Default)]
pub(crate) struct FlagValues {
    pub(crate) addr: Option<String>,
    pub(crate) token: Option<String>,
    pub(crate) token_file: Option<PathBuf>,
    pub(crate) tenant: Option<String>,
    pub(crate) config: Option<PathBuf>,
    pub(crate) ca_cert: Option<PathBuf>,
    pub(crate) client_cert: Option<PathBuf>,
    pub(crate) client_key: Option<PathBuf>,
}

/// The configuration file (`reconctl.toml`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileValues {
    addr: Option<String>,
    token: Option<String>,
    token_file: Option<PathBuf>,
    tenant: Option<String>,
    ca_cert: Option<PathBuf>,
    client_cert: Option<PathBuf>,
    client_key: Option<PathBuf>,
}

/// The resolved connection settings.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The server's address, as a URI (`http://` added when missing).
    pub(crate) addr: Setting,
    /// The bearer token, if any source gave one.
    pub(crate) token: Option<Setting>,
    /// The tenant, if any source gave one.
    pub(crate) tenant: Option<Setting>,
    /// TLS files: the CA certificate, and for mutual TLS this client's
    /// certificate and key (each a path).
    pub(crate) ca_cert: Option<Setting>,
    /// This client's certificate (PEM path), for mutual TLS.
    pub(crate) client_cert: Option<Setting>,
    /// This client's private key (PEM path), for mutual TLS.
    pub(crate) client_key: Option<Setting>,
    /// The configuration file that was read, if any.
    pub(crate) config_file: Option<PathBuf>,
}

/// Reads environment variables; an empty value counts as unset.
pub(crate) trait Environment {
    /// The value of `name`, if set and not empty.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
pub(crate) struct ProcessEnvironment;

impl Environment for ProcessEnvironment {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|value| !value.is_empty())
    }
}

impl Settings {
    /// Resolves every setting: flag > environment > configuration file >
    /// default. The file is `--config`, else `RECONCTL_CONFIG`, else
    /// `$XDG_CONFIG_HOME/reconciled/reconctl.toml` (or
    /// `~/.config/reconciled/reconctl.toml`) if it exists.
    pub(crate) fn resolve(flags: &FlagValues, env: &impl Environment) -> Result<Self, Failure> {
        let (config_file, file) = read_config_file(flags, env)?;
        let file_source = |key| match &config_file {
            Some(path) => Source::File {
                path: path.clone(),
                key,
            },
            None => Source::Default,
        };

        let addr = pick(
            flags.addr.clone(),
            "--addr",
            env.var(ADDR_ENV),
            ADDR_ENV,
            file.addr.clone(),
            file_source("addr"),
        )
        .unwrap_or(Setting {
            value: DEFAULT_ADDR.to_owned(),
            source: Source::Default,
        });
        let addr = Setting {
            value: normalize_addr(&addr.value),
            source: addr.source,
        };

        let token = resolve_token(flags, env, &file, &file_source)?;
        let tenant = pick(
            flags.tenant.clone(),
            "--tenant",
            env.var(TENANT_ENV),
            TENANT_ENV,
            file.tenant.clone(),
            file_source("tenant"),
        );
        let path = |value: &Option<PathBuf>| value.as_ref().map(|p| p.display().to_string());
        let ca_cert = pick(
            path(&flags.ca_cert),
            "--ca-cert",
            env.var(CA_CERT_ENV),
            CA_CERT_ENV,
            path(&file.ca_cert),
            file_source("ca_cert"),
        );
        let client_cert = pick(
            path(&flags.client_cert),
            "--client-cert",
            env.var(CLIENT_CERT_ENV),
            CLIENT_CERT_ENV,
            path(&file.client_cert),
            file_source("client_cert"),
        );
        let client_key = pick(
            path(&flags.client_key),
            "--client-key",
            env.var(CLIENT_KEY_ENV),
            CLIENT_KEY_ENV,
            path(&file.client_key),
            file_source("client_key"),
        );
        if client_cert.is_some() != client_key.is_some() {
            return Err(Failure::usage(
                "mutual TLS needs both a client certificate and its key: give --client-cert and \
                 --client-key (or RECONCILED_CLIENT_CERT and RECONCILED_CLIENT_KEY) together",
            ));
        }
        Ok(Settings {
            addr,
            token,
            tenant,
            ca_cert,
            client_cert,
            client_key,
            config_file,
        })
    }

    /// The token, or an error that lists every way to give one.
    pub(crate) fn require_token(&self) -> Result<&Setting, Failure> {
        self.token.as_ref().ok_or_else(|| {
            Failure::usage(format!(
                "no token given: pass --token or --token-file, set {TOKEN_ENV} or \
                 {TOKEN_FILE_ENV}, or put `token` in {}. Tenant commands need the admin token \
                 (the server writes it to <data-dir>/admin.token); the others take a tenant's \
                 token from `reconctl tenant create`",
                self.config_file_hint()
            ))
        })
    }

    /// The tenant, or an error that lists every way to name one.
    pub(crate) fn require_tenant(&self) -> Result<&Setting, Failure> {
        self.tenant.as_ref().ok_or_else(|| {
            Failure::usage(format!(
                "no tenant given: pass --tenant, set {TENANT_ENV}, or put `tenant` in {}",
                self.config_file_hint()
            ))
        })
    }

    fn config_file_hint(&self) -> String {
        match &self.config_file {
            Some(path) => format!("the config file {}", path.display()),
            None => default_config_path().map_or_else(
                || "a config file given with --config".to_owned(),
                |path| format!("the config file {}", path.display()),
            ),
        }
    }
}

/// The first of flag, environment and file that gives a value.
fn pick(
    flag: Option<String>,
    flag_name: &'static str,
    env: Option<String>,
    env_name: &'static str,
    file: Option<String>,
    file_source: Source,
) -> Option<Setting> {
    if let Some(value) = flag {
        return Some(Setting {
            value,
            source: Source::Flag(flag_name),
        });
    }
    if let Some(value) = env {
        return Some(Setting {
            value,
            source: Source::Env(env_name),
        });
    }
    file.map(|value| Setting {
        value,
        source: file_source,
    })
}

/// The token: at each level, `token` or `token_file` (never both).
fn resolve_token(
    flags: &FlagValues,
    env: &impl Environment,
    file: &FileValues,
    file_source: &impl Fn(&'static str) -> Source,
) -> Result<Option<Setting>, Failure> {
    let levels = [
        (
            flags.token.clone(),
            Source::Flag("--token"),
            flags.token_file.clone(),
            Source::Flag("--token-file"),
        ),
        (
            env.var(TOKEN_ENV),
            Source::Env(TOKEN_ENV),
            env.var(TOKEN_FILE_ENV).map(PathBuf::from),
            Source::Env(TOKEN_FILE_ENV),
        ),
        (
            file.token.clone(),
            file_source("token"),
            file.token_file.clone(),
            file_source("token_file"),
        ),
    ];
    for (token, token_source, token_file, file_name_source) in levels {
        match (token, token_file) {
            (Some(_), Some(_)) => {
                return Err(Failure::usage(format!(
                    "both {token_source} and {file_name_source} give a token; keep one"
                )));
            }
            (Some(value), None) => {
                return Ok(Some(Setting {
                    value,
                    source: token_source,
                }));
            }
            (None, Some(path)) => {
                let text = std::fs::read_to_string(&path).map_err(|error| {
                    Failure::usage(format!(
                        "cannot read the token file {} (from {file_name_source}): {error}",
                        path.display()
                    ))
                })?;
                return Ok(Some(Setting {
                    value: text.trim().to_owned(),
                    source: Source::TokenFile {
                        path,
                        named_by: Box::new(file_name_source),
                    },
                }));
            }
            (None, None) => {}
        }
    }
    Ok(None)
}

/// The default configuration file: `$XDG_CONFIG_HOME/reconciled/reconctl.toml`,
/// else `$HOME/.config/reconciled/reconctl.toml`.
pub(crate) fn default_config_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|value| !value.is_empty())
                .map(|home| PathBuf::from(home).join(".config"))
        })?;
    Some(base.join("reconciled").join("reconctl.toml"))
}

/// Reads the named configuration file (which must exist), or the default
/// one if it exists.
fn read_config_file(
    flags: &FlagValues,
    env: &impl Environment,
) -> Result<(Option<PathBuf>, FileValues), Failure> {
    let named = match (&flags.config, env.var(CONFIG_ENV)) {
        (Some(path), _) => Some((path.clone(), Source::Flag("--config"))),
        (None, Some(path)) => Some((PathBuf::from(path), Source::Env(CONFIG_ENV))),
        (None, None) => None,
    };
    let (path, named_by) = match named {
        Some(named) => named,
        None => match default_config_path() {
            Some(path) if path.is_file() => (path, Source::Default),
            _ => return Ok((None, FileValues::default())),
        },
    };
    let text = std::fs::read_to_string(&path).map_err(|error| {
        Failure::usage(format!(
            "cannot read the config file {} (from {named_by}): {error}",
            path.display()
        ))
    })?;
    let values = parse_config(&path, &text)?;
    Ok((Some(path), values))
}

fn parse_config(path: &Path, text: &str) -> Result<FileValues, Failure> {
    toml::from_str(text).map_err(|error| {
        Failure::usage(format!(
            "invalid config file {}: {}; the keys are addr, token, token_file, tenant, ca_cert, client_cert and client_key",
            path.display(),
            error.message()
        ))
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    struct FakeEnvironment(HashMap<&'static str, String>);

    impl Environment for FakeEnvironment {
        fn var(&self, name: &str) -> Option<String> {
            self.0.get(name).cloned().filter(|value| !value.is_empty())
        }
    }

    fn env(pairs: &[(&'static str, &str)]) -> FakeEnvironment {
        FakeEnvironment(
            pairs
                .iter()
                .map(|(name, value)| (*name, (*value).to_owned()))
                .collect(),
        )
    }

    fn config(dir: &tempfile::TempDir, text: &str) -> PathBuf {
        let path = dir.path().join("reconctl.toml");
        std::fs::write(&path, text).expect("write config");
        path
    }

    #[test]
    fn flags_win_over_environment_and_environment_over_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = config(
            &dir,
            "addr = \"file:1\"\ntoken = \"file-token\"\ntenant = \"file-tenant\"\n",
        );
        let flags = FlagValues {
            addr: Some("flag:1".into()),
            config: Some(path.clone()),
            ..FlagValues::default()
        };
        let settings = Settings::resolve(
            &flags,
            &env(&[(ADDR_ENV, "env:1"), (TOKEN_ENV, "env-token")]),
        )
        .expect("valid");
        assert_eq!(settings.addr.value, "http://flag:1");
        assert_eq!(settings.addr.source, Source::Flag("--addr"));
        let token = settings.token.expect("a token");
        assert_eq!(token.value, "env-token");
        assert_eq!(token.source.to_string(), TOKEN_ENV);
        let tenant = settings.tenant.expect("a tenant");
        assert_eq!(tenant.value, "file-tenant");
        assert_eq!(
            tenant.source.to_string(),
            format!("`tenant` in config file {}", path.display())
        );
    }

    #[test]
    fn empty_environment_variables_count_as_unset() {
        let flags = FlagValues {
            config: Some(PathBuf::from("/nonexistent/reconctl.toml")),
            ..FlagValues::default()
        };
        // A named config file that is missing is an error ...
        let error = Settings::resolve(&flags, &env(&[])).expect_err("missing file");
        assert!(
            error.message.contains("/nonexistent/reconctl.toml"),
            "{error:?}"
        );
        // ... and an empty address falls back to the default.
        let dir = tempfile::tempdir().expect("temp dir");
        let flags = FlagValues {
            config: Some(config(&dir, "")),
            ..FlagValues::default()
        };
        let settings = Settings::resolve(&flags, &env(&[(ADDR_ENV, "")])).expect("valid");
        assert_eq!(settings.addr.value, DEFAULT_ADDR);
        assert_eq!(settings.addr.source, Source::Default);
    }

    #[test]
    fn a_token_file_is_read_and_trimmed_and_both_forms_at_once_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let token_path = dir.path().join("admin.token");
        std::fs::write(&token_path, "rcda_secret\n").expect("write token");
        let flags = FlagValues {
            config: Some(config(&dir, "")),
            ..FlagValues::default()
        };
        let settings = Settings::resolve(
            &flags,
            &env(&[(TOKEN_FILE_ENV, token_path.to_str().expect("utf-8"))]),
        )
        .expect("valid");
        let token = settings.token.expect("a token");
        assert_eq!(token.value, "rcda_secret");
        assert!(token.source.to_string().contains(TOKEN_FILE_ENV));

        let both = Settings::resolve(
            &flags,
            &env(&[
                (TOKEN_ENV, "x"),
                (TOKEN_FILE_ENV, token_path.to_str().expect("utf-8")),
            ]),
        )
        .expect_err("ambiguous");
        assert!(both.message.contains("keep one"), "{both:?}");
    }

    #[test]
    fn unknown_config_keys_are_refused_with_their_name() {
        let dir = tempfile::tempdir().expect("temp dir");
        let flags = FlagValues {
            config: Some(config(&dir, "adress = \"x\"\n")),
            ..FlagValues::default()
        };
        let error = Settings::resolve(&flags, &env(&[])).expect_err("unknown key");
        assert!(error.message.contains("adress"), "{error:?}");
    }
}
