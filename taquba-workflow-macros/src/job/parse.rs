//! The options of `#[job(...)]`.

use proc_macro2::TokenStream;
use syn::{Expr, Ident, LitInt, LitStr, Path};

use crate::common::{Errors, Misspelt, OptionArg, OptionValue, for_each_option};

/// Every option `#[job]` accepts, for the unknown-option message.
pub(crate) const OPTIONS: &[&str] = &[
    "name",
    "key",
    "idempotent",
    "max_attempts",
    "concurrency_key",
    "limit",
    "classify",
    "struct_name",
    "derive",
    "crate",
];

/// The options as written; each is checked for its own shape here and
/// against the fn in `validate`.
#[derive(Default)]
pub(crate) struct JobOptions {
    /// `name = "email.send"`: the job's stable name (default: the fn name).
    pub(crate) name: Option<LitStr>,
    /// `key = "email:{to}"`: the idempotency key template.
    pub(crate) key: Option<LitStr>,
    /// `idempotent`: the payload is the idempotency key.
    pub(crate) idempotent: Option<Ident>,
    /// `max_attempts = 5`.
    pub(crate) max_attempts: Option<LitInt>,
    /// `concurrency_key = "{customer}"`: the concurrency key template.
    pub(crate) concurrency_key: Option<LitStr>,
    /// `limit = 1`: the concurrency limit of `concurrency_key`.
    pub(crate) limit: Option<LitInt>,
    /// `classify = path::to::fn` or a closure (`|e| ...`): coerced to a
    /// `fn(&E) -> StepErrorKind`.
    pub(crate) classify: Option<Expr>,
    /// `struct_name = SendEmail`: the generated struct's name.
    pub(crate) struct_name: Option<Ident>,
    /// `derive(Debug, Clone)`: extra derives on the generated struct.
    pub(crate) derives: Vec<Path>,
    /// `crate = path`: where the runtime crate is (default
    /// `::taquba_workflow`).
    pub(crate) krate: Option<Path>,
}

/// Parses the attribute's tokens, reporting every malformed, unknown or
/// duplicate option.
pub(crate) fn parse(attr: TokenStream, errors: &mut Errors) -> JobOptions {
    let mut options = JobOptions::default();
    // With an error, the expansion is the fn alone: nothing depends on
    // what an unread option meant.
    let _unread = for_each_option(
        attr,
        "job",
        OPTIONS,
        Misspelt::Skip,
        errors,
        |name, arg, errors| match name {
            "name" => options.name = arg.name_str("name = \"email.send\"", errors),
            "key" => options.key = arg.lit_str("key = \"email:{to}\"", errors),
            "idempotent" if arg.flag(errors) => options.idempotent = Some(arg.key.clone()),
            "max_attempts" => options.max_attempts = arg.positive_u32("max_attempts = 5", errors),
            "concurrency_key" => {
                options.concurrency_key = arg.lit_str("concurrency_key = \"{customer}\"", errors)
            }
            "limit" => options.limit = arg.positive_u32("limit = 1", errors),
            "classify" => options.classify = classify(arg, errors),
            "struct_name" => {
                options.struct_name =
                    arg.parse_value("an identifier", "struct_name = SendEmail", errors)
            }
            "derive" => options.derives = arg.derives(errors),
            "crate" => options.krate = arg.crate_path(errors),
            _ => {}
        },
    );
    if let (Some(_), Some(idempotent)) = (&options.key, &options.idempotent) {
        errors.spanned(
            idempotent,
            "`key = \"...\"` and `idempotent` both set the idempotency key: keep one of them",
        );
    }
    if let (None, Some(limit)) = (&options.concurrency_key, &options.limit) {
        errors.spanned(
            limit,
            "`limit` is the concurrency limit of a `concurrency_key`: add `concurrency_key = \"{param}\"` naming what the limit is per",
        );
    }
    options
}

/// `classify = path::to::fn` or `classify = |error| ...` (a closure that
/// captures nothing, which coerces to the fn pointer as a fn does).
fn classify(arg: &OptionArg, errors: &mut Errors) -> Option<Expr> {
    if let OptionValue::Value(_, tokens) = &arg.value
        && let Ok(closure) = syn::parse2::<syn::ExprClosure>(tokens.clone())
    {
        return Some(Expr::Closure(closure));
    }
    let path: Path = arg.parse_value(
        "a path to a fn or a closure",
        "classify = path::to::classify_fn",
        errors,
    )?;
    Some(Expr::Path(syn::ExprPath {
        attrs: Vec::new(),
        qself: None,
        path,
    }))
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::*;

    #[test]
    fn every_option_parses() {
        let mut errors = Errors::new();
        let options = parse(
            quote!(
                name = "email.send",
                key = "email:{to}",
                max_attempts = 3,
                classify = errors::classify,
                struct_name = Email,
                derive(Debug, Clone),
                crate = ::my_runtime
            ),
            &mut errors,
        );
        assert!(errors.is_empty(), "{:?}", errors.messages());
        assert_eq!(
            options.name.map(|n| n.value()).as_deref(),
            Some("email.send")
        );
        assert_eq!(
            options.key.map(|n| n.value()).as_deref(),
            Some("email:{to}")
        );
        assert_eq!(
            options.max_attempts.map(|n| n.to_string()).as_deref(),
            Some("3")
        );
        assert!(matches!(options.classify, Some(Expr::Path(_))));
        assert_eq!(
            options.struct_name.map(|i| i.to_string()).as_deref(),
            Some("Email")
        );
        assert_eq!(options.derives.len(), 2);
        assert!(options.krate.is_some());
    }

    #[test]
    fn classify_takes_a_closure() {
        let mut errors = Errors::new();
        let options = parse(
            quote!(
                classify = |e: &E| if e.0 {
                    Kind::Permanent
                } else {
                    Kind::Transient
                },
                max_attempts = 2
            ),
            &mut errors,
        );
        assert!(errors.is_empty(), "{:?}", errors.messages());
        assert!(matches!(options.classify, Some(Expr::Closure(_))));
        assert!(options.max_attempts.is_some());
    }

    #[test]
    fn mistakes_are_all_reported() {
        let mut errors = Errors::new();
        let options = parse(
            quote!(
                name = 3,
                nme = "x",
                max_attempts = 0,
                idempotent = true,
                key = "k",
                key = "j"
            ),
            &mut errors,
        );
        let messages = errors.messages();
        assert_eq!(messages.len(), 5, "{messages:?}");
        assert!(messages[0].contains("`name` takes a string literal"));
        assert!(messages[1].contains("did you mean `name`?"));
        assert!(messages[2].contains("at least 1"));
        assert!(messages[3].contains("takes no value"));
        assert!(messages[4].contains("duplicate option `key`"));
        assert!(options.name.is_none());
    }

    #[test]
    fn values_of_the_right_kind_that_cannot_be_right_are_reported() {
        let mut errors = Errors::new();
        let options = parse(
            quote!(
                max_attempts = 5u8,
                name = "a ",
                derive(Debug, serde::Deserialize, Serialize)
            ),
            &mut errors,
        );
        let messages = errors.messages();
        assert_eq!(messages.len(), 4, "{messages:?}");
        assert!(messages[0].contains("is a `u32`, not a `u8`"));
        assert!(messages[1].contains("starts or ends with whitespace"));
        assert!(messages[2].contains("always derive `Deserialize`"));
        assert!(messages[3].contains("always derive `Serialize`"));
        assert!(options.max_attempts.is_none() && options.name.is_none());
        assert_eq!(options.derives.len(), 1, "the other derives are kept");

        let mut errors = Errors::new();
        let options = parse(quote!(max_attempts = 7u32), &mut errors);
        assert!(errors.is_empty());
        assert!(options.max_attempts.is_some());
    }

    #[test]
    fn concurrency_options_parse_and_a_limit_needs_a_key() {
        let mut errors = Errors::new();
        let options = parse(
            quote!(concurrency_key = "{customer}", limit = 2),
            &mut errors,
        );
        assert!(errors.is_empty(), "{:?}", errors.messages());
        assert_eq!(
            options.concurrency_key.map(|k| k.value()).as_deref(),
            Some("{customer}")
        );
        assert!(options.limit.is_some());
        let mut errors = Errors::new();
        parse(quote!(limit = 1), &mut errors);
        assert!(errors.messages()[0].contains("add `concurrency_key"));
        let mut errors = Errors::new();
        parse(quote!(concurrency_key = "c", limit = 0), &mut errors);
        assert!(errors.messages()[0].contains("at least 1"));
    }

    #[test]
    fn key_and_idempotent_conflict() {
        let mut errors = Errors::new();
        parse(quote!(key = "k", idempotent), &mut errors);
        assert!(errors.messages()[0].contains("keep one of them"));
    }
}
