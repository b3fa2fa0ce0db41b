//! Checks the fn under `#[job]` and builds the model `expand` writes out.

use syn::ext::IdentExt;
use syn::{Ident, ItemFn, LitStr, ReturnType, Type};

use super::parse::JobOptions;
use crate::common::{
    Errors, Param, ParamRules, Params, Piece, Slot, check_generics, derived_ident, first_borrow,
    first_unnamed, parse_template, pascal_case, typed_inputs,
};

/// A checked `#[job]` fn.
pub(crate) struct JobModel {
    pub(crate) options: JobOptions,
    /// The generated struct's name.
    pub(crate) struct_ident: Ident,
    /// `Job::NAME`.
    pub(crate) name: String,
    /// The fields, in parameter order.
    pub(crate) params: Vec<Param>,
    /// The fn's parameters in order.
    pub(crate) slots: Vec<Slot>,
    /// The return type as written: `Result<T, E>` under any name, which
    /// the expansion resolves through the type system (`JobReturn`).
    pub(crate) ret: Type,
    /// The parsed `key = "..."` template.
    pub(crate) key: Option<Vec<Piece>>,
    /// The parsed `concurrency_key = "..."` template.
    pub(crate) concurrency_key: Option<Vec<Piece>>,
}

const RULES: ParamRules<'static> = ParamRules {
    attribute: "#[job]",
    what: "job",
    context: "JobContext",
    other_context: "StepContext",
};

/// Checks everything about the fn, reporting each mistake; `None` when the
/// fn cannot be modelled at all.
pub(crate) fn validate(
    func: &ItemFn,
    options: JobOptions,
    errors: &mut Errors,
) -> Option<JobModel> {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        errors.spanned(
            sig.fn_token,
            format!(
                "`#[job]` goes on an `async fn`: write `async fn {}(...)`",
                sig.ident
            ),
        );
    }
    if let Some(constness) = &sig.constness {
        errors.spanned(constness, "a `#[job]` fn cannot be `const`: remove `const`");
    }
    if let Some(unsafety) = &sig.unsafety {
        errors.spanned(
            unsafety,
            "a `#[job]` fn cannot be `unsafe`: the runner calls it from safe code; make it safe and use an `unsafe` block inside",
        );
    }
    if let Some(abi) = &sig.abi {
        errors.spanned(abi, "a `#[job]` fn cannot have an ABI: remove the `extern`");
    }
    if let Some(variadic) = &sig.variadic {
        errors.spanned(variadic, "a `#[job]` fn cannot be variadic");
    }
    check_generics(
        &sig.generics,
        "a `#[job]` fn",
        "its parameters become the fields of a job struct, which needs concrete types; replace each type parameter with the concrete type (lifetimes, as in `JobContext<'a>` or `&'a str`, are fine)",
        errors,
    );

    let (_, typed) = typed_inputs(
        &sig.inputs,
        Some(
            "a `#[job]` fn cannot take `self`: jobs are free functions whose parameters become the job's fields; move the fn out of the impl block and pass what it needs as parameters, or through `JobRunnerBuilder::state` and `ctx.state::<T>()`",
        ),
        errors,
    );
    let mut fields = Params::default();
    for arg in typed {
        fields.push(arg, &RULES, errors);
    }
    let Params { params, slots, .. } = fields;

    let ret = match &sig.output {
        ReturnType::Default => {
            errors.at(
                sig.paren_token.span.close(),
                format!(
                    "a `#[job]` fn must return `Result<T, E>`: write `async fn {}(...) -> Result<(), YourError>`",
                    sig.ident
                ),
            );
            None
        }
        ReturnType::Type(_, ty) => match (first_borrow(ty), first_unnamed(ty)) {
            (Some(lifetime), _) => {
                errors.spanned(
                    &lifetime,
                    "a job's output and error are stored and sent to the caller, so they cannot borrow: return owned types (`String` instead of `&str` or `Cow<'_, str>`)",
                );
                None
            }
            (None, Some(unnamed)) => {
                errors.spanned(
                    unnamed,
                    "a job's output and error are its `Job::Output` and `Job::Error` types, which the caller decodes: name them (`Result<Receipt, ChargeError>`), not `impl Trait` or `_`",
                );
                None
            }
            (None, None) => Some((**ty).clone()),
        },
    };

    let key = options.key.as_ref().and_then(|lit| {
        let pieces = match parse_template(&lit.value()) {
            Ok(pieces) => pieces,
            Err(message) => {
                errors.spanned(lit, message);
                return None;
            }
        };
        // A key without placeholders is constant: every submission is the
        // same job (a singleton). Only an empty one is refused: it would be
        // the key of every job that wrote it.
        if lit.value().trim().is_empty() {
            let name = options
                .name
                .as_ref()
                .map(LitStr::value)
                .unwrap_or_else(|| sig.ident.unraw().to_string());
            errors.spanned(
                lit,
                format!(
                    "the key template is empty: write a constant key for a singleton job, one run at a time (`key = {name:?}`), name the parameters that make a submission unique (`key = \"{name}:{{param}}\"`), or write `idempotent` for a key from the whole payload"
                ),
            );
            return None;
        }
        check_fields(&pieces, lit, "key", &params, sig, errors).then_some(pieces)
    });
    let concurrency_key = options.concurrency_key.as_ref().and_then(|lit| {
        let pieces = match parse_template(&lit.value()) {
            Ok(pieces) => pieces,
            Err(message) => {
                errors.spanned(lit, message.replace("key template", "concurrency_key template"));
                return None;
            }
        };
        let text = lit.value();
        if text.trim().is_empty() {
            errors.spanned(
                lit,
                "the concurrency_key template is empty: name the parameter the limit is per (`concurrency_key = \"{customer}\"`), or write a constant key for one limit over every run of the job",
            );
            return None;
        }
        let constant: String = pieces
            .iter()
            .filter_map(|piece| match piece {
                Piece::Text(text) => Some(text.as_str()),
                Piece::Field { .. } => None,
            })
            .collect();
        if constant.contains('/') || constant.chars().any(char::is_control) {
            errors.spanned(
                lit,
                "a concurrency key may not hold a `/` or a control character: write `:` or `-` between its parts",
            );
            return None;
        }
        check_fields(&pieces, lit, "concurrency_key", &params, sig, errors).then_some(pieces)
    });

    let struct_ident = match &options.struct_name {
        Some(ident) => Some(ident.clone()),
        None => {
            let derived = pascal_case(&sig.ident.to_string());
            let ident = derived_ident(&derived, sig.ident.span());
            if ident.is_none() {
                errors.spanned(
                    &sig.ident,
                    format!(
                        "the job struct is named after the fn in PascalCase, and `{}` gives `{derived}`, which is not an identifier: name the struct with `#[job(struct_name = ...)]`",
                        sig.ident
                    ),
                );
            }
            ident
        }
    };
    let name = options
        .name
        .as_ref()
        .map(|lit| lit.value())
        .unwrap_or_else(|| sig.ident.unraw().to_string());
    let ret = ret?;
    let struct_ident = struct_ident?;
    Some(JobModel {
        options,
        struct_ident,
        name,
        params,
        slots,
        ret,
        key,
        concurrency_key,
    })
}

/// Checks that every `{field}` of a template (`what`: `key`,
/// `concurrency_key`) names a parameter present in every build.
fn check_fields(
    pieces: &[Piece],
    lit: &LitStr,
    what: &str,
    params: &[Param],
    sig: &syn::Signature,
    errors: &mut Errors,
) -> bool {
    let mut ok = true;
    for piece in pieces {
        if let Piece::Field { name, .. } = piece
            && !params.iter().any(|p| p.name() == *name)
        {
            let known = params
                .iter()
                .map(|p| format!("`{}`", p.name()))
                .collect::<Vec<_>>();
            let listed = if known.is_empty() {
                format!("`{}` has no parameters besides the context", sig.ident)
            } else {
                format!("the parameters of `{}` are {}", sig.ident, known.join(", "))
            };
            errors.spanned(
                lit,
                format!(
                    "`{{{name}}}` in the {what} template is not a parameter of the job: {listed}"
                ),
            );
            ok = false;
        } else if let Piece::Field { name, .. } = piece
            && params
                .iter()
                .any(|p| p.name() == *name && !p.cfgs.is_empty())
        {
            errors.spanned(
                lit,
                format!(
                    "`{{{name}}}` in the {what} template is a `#[cfg]`-gated parameter, absent from some builds: name only parameters present in every build"
                ),
            );
            ok = false;
        }
    }
    ok
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::*;
    use crate::job::parse;

    fn run(attr: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> (bool, Vec<String>) {
        let func: ItemFn = syn::parse2(item).unwrap();
        let mut errors = Errors::new();
        let options = parse::parse(attr, &mut errors);
        let model = validate(&func, options, &mut errors);
        (model.is_some(), errors.messages())
    }

    #[test]
    fn a_plain_job_validates() {
        let func: ItemFn = syn::parse2(quote!(
            async fn send_email(to: &str, ctx: JobContext<'_>, mut n: u32) -> Result<Id, E> {}
        ))
        .unwrap();
        let mut errors = Errors::new();
        let model = validate(&func, JobOptions::default(), &mut errors).unwrap();
        assert!(errors.is_empty());
        assert_eq!(model.struct_ident, "SendEmail");
        assert_eq!(model.name, "send_email");
        assert_eq!(model.params.len(), 2);
        assert!(matches!(
            model.slots[..],
            [Slot::Field(0), Slot::Context(_), Slot::Field(1)]
        ));
    }

    #[test]
    fn every_signature_mistake_is_reported_at_once() {
        let (_, messages) = run(
            quote!(),
            quote!(
                fn bad<T>(self, (a, b): (u8, u8), x: impl Display) -> (u32, u32) {}
            ),
        );
        let expected = [
            "goes on an `async fn`",
            "cannot be generic (it has type or const parameters)",
            "cannot take `self`",
            "destructuring patterns",
            "`impl Trait`",
        ];
        assert_eq!(messages.len(), expected.len(), "{messages:?}");
        for (message, needle) in messages.iter().zip(expected) {
            assert!(message.contains(needle), "{message} / {needle}");
        }
    }

    #[test]
    fn missing_return_type_is_reported() {
        let (ok, messages) = run(
            quote!(),
            quote!(
                async fn f(a: u8) {}
            ),
        );
        assert!(!ok);
        assert!(messages[0].contains("-> Result<(), YourError>"));
    }

    #[test]
    fn key_template_fields_are_checked() {
        let (_, messages) = run(
            quote!(key = "email:{to}:{subjet}"),
            quote!(
                async fn f(to: String, subject: String) -> Result<(), E> {}
            ),
        );
        assert_eq!(messages.len(), 1);
        assert!(
            messages[0].contains("`{subjet}` in the key template"),
            "{messages:?}"
        );
        assert!(messages[0].contains("`to`, `subject`"));
    }

    #[test]
    fn a_constant_key_is_a_singleton_and_an_empty_one_is_reported() {
        for key in ["report", "{{literal}}", "report:all"] {
            for item in [
                quote!(
                    async fn report() -> Result<(), E> {}
                ),
                quote!(
                    async fn report(day: u32) -> Result<(), E> {}
                ),
            ] {
                let (ok, messages) = run(quote!(key = #key), item);
                assert!(ok && messages.is_empty(), "{key}: {messages:?}");
            }
        }
        for key in ["", "  "] {
            let (_, messages) = run(
                quote!(key = #key),
                quote!(
                    async fn report() -> Result<(), E> {}
                ),
            );
            assert_eq!(messages.len(), 1, "{key:?}: {messages:?}");
            assert!(messages[0].contains("is empty"), "{messages:?}");
            assert!(messages[0].contains("`key = \"report\"`"), "{messages:?}");
        }
    }

    #[test]
    fn a_placeholder_naming_no_parameter_is_reported() {
        let (_, messages) = run(
            quote!(key = "reindex:{scope}"),
            quote!(
                async fn reindex() -> Result<(), E> {}
            ),
        );
        assert_eq!(messages.len(), 1, "{messages:?}");
        assert!(
            messages[0].contains("`{scope}` in the key template is not a parameter of the job: `reindex` has no parameters besides the context"),
            "{messages:?}"
        );
    }

    #[test]
    fn raw_identifiers_name_fields_without_the_prefix() {
        let (ok, messages) = run(
            quote!(key = "{type}"),
            quote!(
                async fn r#move(r#type: String) -> Result<(), E> {}
            ),
        );
        assert!(ok && messages.is_empty(), "{messages:?}");
    }
}
