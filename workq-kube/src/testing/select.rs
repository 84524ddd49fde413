//! Label and field selectors, as the API server reads them from `labelSelector` and
//! `fieldSelector`.

use serde_json::Value;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    /// `key=value`, `key==value`.
    Equals(String, String),
    /// `key!=value` (also true when the key is absent).
    NotEquals(String, String),
    /// `key in (a,b)`.
    In(String, Vec<String>),
    /// `key notin (a,b)` (also true when the key is absent).
    NotIn(String, Vec<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    DoesNotExist(String),
}

/// A parsed selector: every requirement must hold. Empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Selector(Vec<Requirement>);

/// Splits at the commas that are not inside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0_i32, 0);
    for (index, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// The values of `(a, b)`.
fn set_values(text: &str) -> Option<Vec<String>> {
    let inner = text.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|value| value.trim().to_owned())
            .collect(),
    )
}

impl Selector {
    /// Parses a label selector (equality and set-based requirements); `None` if malformed.
    pub(crate) fn labels(text: &str) -> Option<Self> {
        Self::parse(text, true)
    }

    /// Parses a field selector (`=`, `==`, `!=` on dotted paths); `None` if malformed.
    pub(crate) fn fields(text: &str) -> Option<Self> {
        Self::parse(text, false)
    }

    fn parse(text: &str, set_based: bool) -> Option<Self> {
        let mut requirements = Vec::new();
        if text.trim().is_empty() {
            return Some(Self(requirements));
        }
        for part in split_top_level(text) {
            let part = part.trim();
            let requirement = if let Some((key, value)) = part.split_once("!=") {
                Requirement::NotEquals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = part.split_once("==") {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = part.split_once('=') {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if !set_based {
                return None;
            } else if let Some((key, values)) = part.split_once(" notin ") {
                Requirement::NotIn(key.trim().to_owned(), set_values(values)?)
            } else if let Some((key, values)) = part.split_once(" in ") {
                Requirement::In(key.trim().to_owned(), set_values(values)?)
            } else if let Some(key) = part.strip_prefix('!') {
                Requirement::DoesNotExist(key.trim().to_owned())
            } else {
                Requirement::Exists(part.to_owned())
            };
            let key = match &requirement {
                Requirement::Equals(key, _)
                | Requirement::NotEquals(key, _)
                | Requirement::In(key, _)
                | Requirement::NotIn(key, _)
                | Requirement::Exists(key)
                | Requirement::DoesNotExist(key) => key,
            };
            if key.is_empty() || key.contains(char::is_whitespace) {
                return None;
            }
            requirements.push(requirement);
        }
        Some(Self(requirements))
    }

    /// Whether an object whose labels (or fields) `lookup` reads satisfies every
    /// requirement.
    fn matches_with(&self, lookup: impl Fn(&str) -> Option<String>) -> bool {
        self.0.iter().all(|requirement| match requirement {
            Requirement::Equals(key, value) => lookup(key).as_deref() == Some(value),
            Requirement::NotEquals(key, value) => lookup(key).as_deref() != Some(value),
            Requirement::In(key, values) => lookup(key).is_some_and(|v| values.contains(&v)),
            Requirement::NotIn(key, values) => lookup(key).is_none_or(|v| !values.contains(&v)),
            Requirement::Exists(key) => lookup(key).is_some(),
            Requirement::DoesNotExist(key) => lookup(key).is_none(),
        })
    }

    /// Whether `object`'s labels satisfy this label selector.
    pub(crate) fn matches_labels(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        self.matches_with(|key| labels.get(key).and_then(Value::as_str).map(str::to_owned))
    }

    /// Whether `object`'s fields (dotted paths such as `metadata.name`, `status.phase`)
    /// satisfy this field selector.
    pub(crate) fn matches_fields(&self, object: &Value) -> bool {
        self.matches_with(|path| {
            let value = path
                .split('.')
                .try_fold(object, |value, segment| value.get(segment))?;
            match value {
                Value::String(text) => Some(text.clone()),
                Value::Null => None,
                other => Some(other.to_string()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object() -> Value {
        json!({
            "metadata": { "name": "web", "namespace": "default", "labels": { "app": "web", "tier": "front" } },
            "status": { "phase": "Running", "replicas": 3 },
        })
    }

    #[test]
    fn label_requirements_of_every_form() {
        let object = object();
        for (selector, expected) in [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("missing!=x", true),
            ("app in (web, db)", true),
            ("app in (db)", false),
            ("tier notin (back)", true),
            ("missing notin (x)", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("app=web,tier in (front,back),!missing", true),
            ("app=web,tier=back", false),
        ] {
            let parsed = Selector::labels(selector).unwrap();
            assert_eq!(parsed.matches_labels(&object), expected, "{selector:?}");
        }
    }

    #[test]
    fn field_requirements_read_dotted_paths() {
        let object = object();
        for (selector, expected) in [
            ("metadata.name=web", true),
            ("metadata.name!=web", false),
            ("metadata.namespace==default,status.phase=Running", true),
            ("status.replicas=3", true),
            ("status.phase=Pending", false),
        ] {
            let parsed = Selector::fields(selector).unwrap();
            assert_eq!(parsed.matches_fields(&object), expected, "{selector:?}");
        }
    }

    #[test]
    fn malformed_selectors_are_refused() {
        assert_eq!(Selector::labels("app in web"), None);
        assert_eq!(Selector::labels("=web"), None);
        assert_eq!(Selector::fields("metadata.name"), None);
        assert_eq!(Selector::labels("a b=c"), None);
    }
}
