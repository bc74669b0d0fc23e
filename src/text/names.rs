//! Enums written by name in gateway.toml: each lists its (name, value) pairs once, in a
//! `NAMES` constant that validation parses with, error messages list, and `as_str` reads, so a
//! name cannot be spelled one way in the parser and another in the admin API or metrics.

/// The name of `value` in `names` (every value of an enum is in its list).
pub fn name_of<T: Copy + PartialEq>(names: &'static [(&'static str, T)], value: T) -> &'static str {
    names
        .iter()
        .find(|(_, v)| *v == value)
        .map_or("", |(n, _)| n)
}

#[cfg(test)]
mod tests {
    use crate::config::{AuthMode, Backend, LogFormat};
    use crate::limiter::{Algorithm, LeakyMode};
    use crate::rules::{FailureMode, Scope};
    use crate::wire::normalize::EscapedSlashes;

    /// Every value has exactly one name and every name one value.
    fn bijective<T: Copy + PartialEq + std::fmt::Debug>(
        names: &'static [(&'static str, T)],
        as_str: impl Fn(T) -> &'static str,
    ) {
        for (i, (name, value)) in names.iter().enumerate() {
            assert_eq!(as_str(*value), *name);
            for (other, v) in &names[i + 1..] {
                assert_ne!(name, other);
                assert_ne!(value, v, "{value:?} listed twice");
            }
        }
    }

    #[test]
    fn every_enum_names_each_value_once() {
        bijective(Algorithm::NAMES, Algorithm::as_str);
        assert_eq!(Algorithm::NAMES.len(), Algorithm::ALL.len());
        bijective(LeakyMode::NAMES, LeakyMode::as_str);
        bijective(Scope::NAMES, Scope::as_str);
        bijective(FailureMode::NAMES, FailureMode::as_str);
        bijective(AuthMode::NAMES, AuthMode::as_str);
        bijective(Backend::NAMES, Backend::as_str);
        bijective(LogFormat::NAMES, LogFormat::as_str);
        bijective(EscapedSlashes::NAMES, EscapedSlashes::as_str);
    }
}
