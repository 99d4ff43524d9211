//! Settings declared once. [`settings!`](crate::settings) declares a
//! struct whose every field is a setting written in one place: its
//! variable, default, documentation, parser and check. From that one
//! declaration come the struct, its `Default`, the parsing of a value
//! (checked where it is written, so an error names the variable or the
//! file's key), a `Debug` that never prints a secret, and the rows of the
//! README's configuration table and of `fastack config` ([`Section::docs`]).
//!
//! The configuration ([`crate::Config`]) is one such section with nested
//! ones; a part of the product declared in another crate (a sink) declares
//! its own section in its own file and is loaded with the rest through an
//! [`Extension`].

use std::{any::Any, fmt::Debug, path::PathBuf, sync::Arc, time::Duration};

use crate::error::{Error, Result};

/// One row of the configuration table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettingDoc {
    /// The variable, or a family's pattern (`FASTACK_PLAN_<PLAN>_RPS / …`).
    pub name: &'static str,
    /// The default as the table shows it.
    pub default: &'static str,
    /// What it does, one line.
    pub meaning: String,
    /// Its value is never shown (`fastack config` prints `(set)`).
    pub secret: bool,
    /// The concrete variables the row stands for.
    pub names: Vec<String>,
}

impl SettingDoc {
    /// The row of one variable; `doc` are the lines of its `///` comment.
    pub fn one(name: &'static str, default: &'static str, doc: &[&str], secret: bool) -> Self {
        SettingDoc {
            name,
            default,
            meaning: doc.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" "),
            secret,
            names: vec![name.to_owned()],
        }
    }
}

/// A group of settings that loads itself.
pub trait Section: Default + Clone + Debug + Send + Sync + 'static {
    /// Its rows of the configuration table, in declaration order.
    fn docs() -> Vec<SettingDoc>;

    /// Parses and checks `value` into the setting `key` names; `Ok(false)`
    /// when no setting of this section has that name.
    fn apply(&mut self, key: &str, value: &str) -> Result<bool>;
}

/// A section held without its type being known here (a sink's).
pub trait AnySection: Any + Debug + Send + Sync {
    fn docs(&self) -> Vec<SettingDoc>;
    fn apply(&mut self, key: &str, value: &str) -> Result<bool>;
    fn as_any(&self) -> &dyn Any;
}

impl<S: Section> AnySection for S {
    fn docs(&self) -> Vec<SettingDoc> {
        S::docs()
    }
    fn apply(&mut self, key: &str, value: &str) -> Result<bool> {
        Section::apply(self, key, value)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A section declared outside this crate, loaded with the configuration
/// (`Config::load`): its settings are known, documented and checked like
/// every other.
#[derive(Clone, Copy)]
pub struct Extension {
    make: fn() -> Box<dyn AnySection>,
}

fn boxed_default<S: Section>() -> Box<dyn AnySection> {
    Box::new(S::default())
}

impl Extension {
    pub const fn of<S: Section>() -> Extension {
        Extension {
            make: boxed_default::<S>,
        }
    }

    pub(crate) fn make(&self) -> Box<dyn AnySection> {
        (self.make)()
    }
}

/// The extension sections a configuration was loaded with, by type.
#[derive(Clone, Default)]
pub struct Sections(Vec<Arc<dyn AnySection>>);

impl Sections {
    pub(crate) fn from_loaded(loaded: Vec<Box<dyn AnySection>>) -> Sections {
        Sections(loaded.into_iter().map(Arc::from).collect())
    }

    /// The section of type `S`; `None` when the configuration was loaded
    /// without it.
    pub fn get<S: Section>(&self) -> Option<&S> {
        self.0.iter().find_map(|s| s.as_any().downcast_ref::<S>())
    }

    /// Sets (or replaces) the section of type `S`: for a configuration
    /// built in code.
    pub fn set<S: Section>(&mut self, section: S) {
        self.0.retain(|s| !s.as_any().is::<S>());
        self.0.push(Arc::new(section));
    }
}

impl Debug for Sections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

const REDACTED: &str = "[redacted]";

/// A URL with its password (if any) replaced, for logs and `Debug`.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some(REDACTED));
            u.to_string()
        }
        Ok(u) => u.to_string(),
        Err(_) => REDACTED.to_owned(),
    }
}

/// How `Debug` shows a setting that must not be printed as is.
pub mod show {
    use super::{REDACTED, redact_url};

    /// Whether it is set, never its value.
    pub fn secret(v: &Option<String>) -> Option<&'static str> {
        v.as_ref().map(|_| REDACTED)
    }

    /// A URL without its password.
    pub fn url(v: &Option<String>) -> Option<String> {
        v.as_deref().map(redact_url)
    }
}

/// Parsers of setting values (`Err` says what was expected).
pub mod parse {
    use super::*;

    pub fn from_str<T: std::str::FromStr>(value: &str) -> std::result::Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        value.trim().parse().map_err(|e: T::Err| e.to_string())
    }

    /// Empty is unset.
    pub fn optional<T: std::str::FromStr>(value: &str) -> std::result::Result<Option<T>, String>
    where
        T::Err: std::fmt::Display,
    {
        if value.trim().is_empty() {
            Ok(None)
        } else {
            from_str(value).map(Some)
        }
    }

    /// Text as written.
    pub fn text(value: &str) -> std::result::Result<String, String> {
        Ok(value.to_owned())
    }

    /// Text, empty being unset.
    pub fn optional_text(value: &str) -> std::result::Result<Option<String>, String> {
        Ok((!value.trim().is_empty()).then(|| value.to_owned()))
    }

    pub fn path(value: &str) -> std::result::Result<PathBuf, String> {
        Ok(PathBuf::from(value))
    }

    pub fn boolean(value: &str) -> std::result::Result<bool, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" | "" => Ok(false),
            _ => Err("expected true or false".to_owned()),
        }
    }

    pub fn millis(value: &str) -> std::result::Result<Duration, String> {
        from_str(value).map(Duration::from_millis)
    }

    pub fn secs(value: &str) -> std::result::Result<Duration, String> {
        from_str(value).map(Duration::from_secs)
    }

    pub fn hours(value: &str) -> std::result::Result<Duration, String> {
        from_str::<u64>(value).map(|h| Duration::from_secs(h.saturating_mul(3600)))
    }
}

/// Checks of parsed values (`Err` completes "<VARIABLE> …").
pub mod check {
    pub fn positive<T: PartialOrd + Default>(v: &T) -> Result<(), String> {
        if *v > T::default() {
            Ok(())
        } else {
            Err("must be positive".to_owned())
        }
    }
}

/// The error of a value that does not parse or check.
pub fn invalid(key: &str, value: &str, why: String) -> Error {
    Error::Config(format!("{key}={value:?}: {why}"))
}

/// The error of a value that parses but fails its check.
pub fn refused(key: &str, why: String) -> Error {
    Error::Config(format!("{key} {why}"))
}

/// Declares a struct of settings, each written once:
///
/// ```ignore
/// settings! {
///     /// What the section is.
///     pub struct Http {
///         /// tenant API and ops endpoints
///         pub listen: SocketAddr = "FASTACK_LISTEN" {
///             default: "127.0.0.1:8080",
///             parse: parse::from_str,
///         },
///         /// bearer token of the admin listener
///         pub token: Option<String> = "FASTACK_ADMIN_TOKEN" {
///             default: "",
///             shown: "(unset: admin listener off)",
///             parse: parse::optional_text,
///             check: |t: &Option<String>| …,
///             show: secret,
///         },
///     }
///     nested { pub s3: S3Settings }
///     internal { pub sections: Sections }
/// }
/// ```
///
/// `default` is parsed like a value (a test parses every default);
/// `shown` replaces it in the table; `check` refuses a parsed value with
/// the rest of "<VARIABLE> …"; `show` is `secret` (never printed) or `url`
/// (printed without its password). `nested` sections load with this one;
/// `internal` fields are not settings.
#[macro_export]
macro_rules! settings {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[doc = $doc:literal])*
                $fvis:vis $field:ident : $ty:ty = $env:literal {
                    default: $default:literal,
                    $(shown: $shown:literal,)?
                    parse: $parse:expr,
                    $(check: $check:expr,)?
                    $(show: $show:ident,)?
                }
            ),* $(,)?
        }
        $(nested { $($(#[doc = $ndoc:literal])* $nvis:vis $nfield:ident : $nty:ty),* $(,)? })?
        $(internal { $($(#[doc = $idoc:literal])* $ivis:vis $ifield:ident : $ity:ty),* $(,)? })?
    ) => {
        $(#[$meta])*
        #[derive(Clone)]
        $vis struct $name {
            $(
                $(#[doc = $doc])*
                #[doc = concat!("\n\n`", $env, "`")]
                $fvis $field: $ty,
            )*
            $($($(#[doc = $ndoc])* $nvis $nfield: $nty,)*)?
            $($($(#[doc = $idoc])* $ivis $ifield: $ity,)*)?
        }

        impl ::std::default::Default for $name {
            fn default() -> Self {
                $name {
                    $(
                        $field: match ($parse)($default) {
                            Ok(v) => v,
                            // A test parses every declared default.
                            Err(e) => panic!("the default of {} does not parse: {e}", $env),
                        },
                    )*
                    $($($nfield: ::std::default::Default::default(),)*)?
                    $($($ifield: ::std::default::Default::default(),)*)?
                }
            }
        }

        impl $crate::settings::Section for $name {
            fn docs() -> ::std::vec::Vec<$crate::settings::SettingDoc> {
                #[allow(unused_mut)]
                let mut docs = vec![$(
                    $crate::settings::SettingDoc::one(
                        $env,
                        $crate::__setting_shown!($($shown,)? $default),
                        &[$($doc),*],
                        $crate::__setting_secret!($($show)?),
                    ),
                )*];
                $($(docs.extend(<$nty as $crate::settings::Section>::docs());)*)?
                docs
            }

            fn apply(&mut self, key: &str, value: &str) -> $crate::Result<bool> {
                match key {
                    $(
                        $env => {
                            let parsed: $ty = ($parse)(value)
                                .map_err(|why| $crate::settings::invalid(key, value, why))?;
                            $(($check)(&parsed).map_err(|why| $crate::settings::refused(key, why))?;)?
                            self.$field = parsed;
                            Ok(true)
                        }
                    )*
                    _ => {
                        $($(
                            if $crate::settings::Section::apply(&mut self.$nfield, key, value)? {
                                return Ok(true);
                            }
                        )*)?
                        Ok(false)
                    }
                }
            }
        }

        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($name))
                    $(.field(stringify!($field), &$crate::__setting_show!(self.$field $(, $show)?)))*
                    $($(.field(stringify!($nfield), &self.$nfield))*)?
                    $($(.field(stringify!($ifield), &self.$ifield))*)?
                    .finish()
            }
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __setting_shown {
    ($shown:literal, $default:literal) => {
        $shown
    };
    ($default:literal) => {
        $default
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __setting_secret {
    (secret) => {
        true
    };
    ($other:ident) => {
        false
    };
    () => {
        false
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __setting_show {
    ($value:expr) => {
        $value
    };
    ($value:expr, $show:ident) => {
        $crate::settings::show::$show(&$value)
    };
}
