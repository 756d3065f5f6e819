//! Option values: the types an option's text parses into ([`Size`], [`HumanDuration`], [`Count`],
//! [`AdminAddress`], [`LogFormat`]) and how clap and serde parse every one of them through its
//! `FromStr`, so a flag and a YAML key give the same value or the same error.

use std::ffi::OsStr;
use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;

use clap::builder::{TypedValueParser, ValueParserFactory};
use serde::Deserialize;

use super::{invalid, ConfigError};
use crate::outputs::spans::{Grouping, Protocol};
use crate::proxy::Endpoint;

/// The value parser of every typed option: the type's own `FromStr`, with an error that names
/// the option (the arg's id is its YAML key), its flag and the value.
#[derive(Clone)]
pub struct Parsed<T>(PhantomData<fn() -> T>);

impl<T> TypedValueParser for Parsed<T>
where
    T: FromStr + Clone + Send + Sync + 'static,
    T::Err: fmt::Display,
{
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let id = arg.map_or("", |a| a.get_id().as_str());
        let text = value.to_string_lossy();
        text.parse().map_err(|reason: T::Err| {
            let mut e = invalid(id, &text, reason.to_string());
            // A subcommand's own flag (not an option of `run`): named by its flag.
            if let (ConfigError::Invalid { option, .. }, Some(long)) =
                (&mut e, arg.and_then(|a| a.get_long()))
            {
                if option == id {
                    *option = format!("--{long}");
                }
            }
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{e}\n"))
                .with_cmd(cmd)
        })
    }
}

/// Deserializes `T` from a YAML string or number through its `FromStr`; the error carries the
/// value and the reason, and [`Options::from_file`] adds the key and its flag.
fn from_scalar<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: FromStr,
    T::Err: fmt::Display,
{
    struct Scalar<T>(PhantomData<T>);
    impl<T: FromStr<Err: fmt::Display>> serde::de::Visitor<'_> for Scalar<T> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string or a number")
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<T, E> {
            s.parse()
                .map_err(|reason| E::custom(format!("{s:?}: {reason}")))
        }
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<T, E> {
            self.visit_str(&n.to_string())
        }
        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<T, E> {
            self.visit_str(&n.to_string())
        }
        fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<T, E> {
            self.visit_str(&n.to_string())
        }
    }
    d.deserialize_any(Scalar(PhantomData))
}

/// Makes a `FromStr` type an option value: clap parses it with [`Parsed`], serde with
/// [`from_scalar`].
macro_rules! option_value {
    ($($t:ty),*) => {$(
        impl ValueParserFactory for $t {
            type Parser = Parsed<$t>;
            fn value_parser() -> Parsed<$t> {
                Parsed(PhantomData)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                from_scalar(d)
            }
        }
    )*};
}

option_value!(
    Endpoint,
    Size,
    HumanDuration,
    Count,
    AdminAddress,
    LogFormat,
    Protocol,
    Grouping
);

/// Why a string is not a value of an option's type.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// Not of the form: what is.
    #[error("expected {0}")]
    Expected(&'static str),
    /// A number with a unit the type does not know.
    #[error("unknown unit {unit:?}; use {known}")]
    Unit {
        /// The unit given.
        unit: String,
        /// The units there are.
        known: &'static str,
    },
    /// Too large (or negative).
    #[error("out of range")]
    Range,
    /// Neither `off` nor an address.
    #[error("{0} (or off)")]
    Admin(#[from] crate::proxy::AddressError),
}

/// A byte size: `1048576`, `64KiB`, `16MiB`, `1GiB`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

impl FromStr for Size {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        let s = s.trim();
        let (number, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
        let n: u64 = number
            .parse()
            .map_err(|_| ValueError::Expected("a size such as 65536, 64KiB or 16MiB"))?;
        let factor = match unit.trim() {
            "" | "B" => 1,
            "KiB" | "K" => 1 << 10,
            "MiB" | "M" => 1 << 20,
            "GiB" | "G" => 1 << 30,
            other => {
                return Err(ValueError::Unit {
                    unit: other.to_string(),
                    known: "KiB, MiB or GiB",
                })
            }
        };
        n.checked_mul(factor).map(Size).ok_or(ValueError::Range)
    }
}

impl fmt::Display for Size {
    /// In the largest unit that divides it: `256MiB`, `1000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        match [(30, "GiB"), (20, "MiB"), (10, "KiB")]
            .into_iter()
            .find(|(shift, _)| n != 0 && n.is_multiple_of(1u64 << shift))
        {
            Some((shift, unit)) => write!(f, "{}{unit}", n >> shift),
            None => write!(f, "{n}"),
        }
    }
}

/// A duration: `10s`, `500ms`, `2m`, `1h`; a bare number is seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HumanDuration(pub std::time::Duration);

impl FromStr for HumanDuration {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        let s = s.trim();
        let split = s
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .unwrap_or(s.len());
        let (number, unit) = s.split_at(split);
        let n: f64 = number
            .parse()
            .map_err(|_| ValueError::Expected("a duration such as 10s, 500ms or 2m"))?;
        let secs = match unit.trim() {
            "ms" => n / 1000.0,
            "" | "s" => n,
            "m" => n * 60.0,
            "h" => n * 3600.0,
            other => {
                return Err(ValueError::Unit {
                    unit: other.to_string(),
                    known: "ms, s, m or h",
                })
            }
        };
        if !secs.is_finite() || !(0.0..=86_400.0 * 365.0).contains(&secs) {
            return Err(ValueError::Range);
        }
        Ok(HumanDuration(std::time::Duration::from_secs_f64(secs)))
    }
}

impl fmt::Display for HumanDuration {
    /// As it is written: `10s`, `10m`, `1h`, `500ms`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        match (d.as_secs(), d.subsec_nanos()) {
            (0, 0) => f.write_str("0s"),
            (s, 0) if s != 0 && s.is_multiple_of(3600) => write!(f, "{}h", s / 3600),
            (s, 0) if s != 0 && s.is_multiple_of(60) => write!(f, "{}m", s / 60),
            _ => write!(f, "{d:?}"),
        }
    }
}

impl HumanDuration {
    /// The duration, or an error naming option `id` when it is zero.
    pub(super) fn positive(self, id: &str) -> Result<std::time::Duration, ConfigError> {
        if self.0.is_zero() {
            return Err(invalid(id, self, "must be greater than 0"));
        }
        Ok(self.0)
    }
}

/// A whole number of things (threads, nodes, spans): at least 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Count(pub usize);

impl FromStr for Count {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        match s.trim().parse::<usize>() {
            Ok(n) if n >= 1 => Ok(Count(n)),
            _ => Err(ValueError::Expected("a whole number of at least 1")),
        }
    }
}

/// `host:port`, `unix:/path`, or `off`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdminAddress {
    /// No admin server.
    Off,
    /// Listen here.
    At(Endpoint),
}

impl FromStr for AdminAddress {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        if s == "off" {
            return Ok(AdminAddress::Off);
        }
        Ok(AdminAddress::At(s.parse()?))
    }
}

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

impl FromStr for LogFormat {
    type Err = ValueError;
    fn from_str(s: &str) -> Result<Self, ValueError> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(ValueError::Expected("text or json")),
        }
    }
}

/// A name that is none of a setting's choices.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}: expected {choices}")]
pub struct UnknownName {
    /// The setting.
    pub what: &'static str,
    /// What was given.
    pub value: String,
    /// What it may be.
    pub choices: &'static str,
}
/// The OTLP transports by the names `OTEL_EXPORTER_OTLP_PROTOCOL` gives them.
impl std::str::FromStr for Protocol {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "grpc" => Ok(Protocol::Grpc),
            "http/protobuf" | "http" => Ok(Protocol::HttpProtobuf),
            other => Err(UnknownName {
                what: "OTLP protocol",
                value: other.to_string(),
                choices: "grpc or http/protobuf",
            }),
        }
    }
}

/// The groupings by their option values.
impl std::str::FromStr for Grouping {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "version" => Ok(Grouping::Version),
            "push" => Ok(Grouping::Push),
            other => Err(UnknownName {
                what: "grouping",
                value: other.to_string(),
                choices: "version or push",
            }),
        }
    }
}
