//! The pages of the dashboard, one module each, and the query-string
//! helpers they share.

pub mod actions;
pub mod dead;
pub mod groups;
pub mod keys;
pub mod login;
pub mod run;
pub mod runs;
pub mod schedules;
pub mod store;

use taquba_workflow::RunId;

use crate::ui::error::{UiError, UiResult};

/// `path?key=value&…` with the pairs whose value is not empty, encoded.
pub fn url(path: &str, pairs: &[(&str, &str)]) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    let mut any = false;
    for (key, value) in pairs {
        if !value.is_empty() {
            query.append_pair(key, value);
            any = true;
        }
    }
    if any {
        format!("{path}?{}", query.finish())
    } else {
        path.to_string()
    }
}

/// A run id from a path or a form.
///
/// # Errors
/// 400 naming the value and the rule it breaks.
pub fn run_id(value: &str) -> UiResult<RunId> {
    RunId::new(value).map_err(|e| UiError::bad_request(e.to_string()))
}

/// A query value that is not empty.
pub fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().map(str::trim).filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_keep_only_given_values_and_encode_them() {
        assert_eq!(url("/runs", &[("status", ""), ("q", "")]), "/runs");
        assert_eq!(
            url("/runs", &[("status", "failed"), ("q", "a&b c")]),
            "/runs?status=failed&q=a%26b+c"
        );
    }
}
