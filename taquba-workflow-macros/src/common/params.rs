//! A fn's parameters: which one is the context, how each other one becomes
//! a stored field (its owned type, its attributes, its `#[cfg]`s), and
//! what cannot be one (reported at the token to change).

use proc_macro2::TokenStream;
use quote::{ToTokens, quote};
use syn::ext::IdentExt;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{Attribute, FnArg, Ident, Meta, Pat, PatType, Token, Type, TypePath, TypeReference};

use super::{Errors, type_text};

/// Whether a type's last path segment is `name` (`JobContext<'_>`,
/// `taquba_workflow::jobs::JobContext<'_>`).
pub(crate) fn is_named(ty: &Type, name: &str) -> bool {
    match ty {
        Type::Path(TypePath { qself: None, path }) => {
            path.segments.last().is_some_and(|s| s.ident == name)
        }
        Type::Group(g) => is_named(&g.elem, name),
        Type::Paren(p) => is_named(&p.elem, name),
        _ => false,
    }
}

/// How a parameter becomes a stored field.
pub(crate) struct Param {
    /// The parameter's name as written (possibly raw, `r#type`).
    pub(crate) ident: Ident,
    /// The owned type stored in the generated field.
    pub(crate) field_ty: Type,
    /// Whether the parameter is a reference, passed back as `&field`.
    pub(crate) by_ref: bool,
    /// The attributes the generated field carries: doc comments, lint
    /// levels, `#[cfg]` and `#[cfg_attr]`.
    pub(crate) field_attrs: Vec<Attribute>,
    /// The `#[cfg]`s (and `#[cfg_attr]`s that can expand to one): every
    /// generated use of the field (call argument, pattern, struct
    /// expression) carries them, so a parameter configured out is absent
    /// everywhere.
    pub(crate) cfgs: Vec<Attribute>,
}

impl Param {
    /// The parameter's name without `r#`, as serde and key templates see it.
    pub(crate) fn name(&self) -> String {
        self.ident.unraw().to_string()
    }
}

/// What `classify_param` makes of one parameter.
pub(crate) enum ParamKind {
    /// The context parameter (`JobContext<'_>` / `StepContext<'_>`).
    Context(ContextParam),
    /// A field of the generated type.
    Field(Box<Param>),
    /// An error was reported; what the stand-in types written beside it
    /// hold for this parameter.
    Invalid(StandIn),
}

/// What the stand-in types beside an error hold for a parameter that was
/// refused: the types are written so that the user's code which names
/// them still resolves as meant, and is not reported on top.
pub(crate) enum StandIn {
    /// The field as it was meant: its name and type are clear (a refused
    /// attribute, `ref`, `&mut T`).
    Field(Box<Param>),
    /// Nothing: the parameter was not meant as a field (the other macro's
    /// context, `&Step`).
    Nothing,
    /// What was meant is unknown (a pattern without a name, a type that
    /// cannot be stored): no stand-in would match the user's code.
    Unknown,
}

/// How a fn takes its context.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ContextBy {
    /// `ctx: JobContext<'_>`.
    Value,
    /// `ctx: &JobContext<'_>`.
    Ref,
    /// `ctx: &mut JobContext<'_>`.
    Mut,
}

/// The context parameter of a fn.
pub(crate) struct ContextParam {
    /// Its `#[cfg]`s: the generated argument carries them.
    pub(crate) cfgs: Vec<Attribute>,
    /// By value or by reference.
    pub(crate) by: ContextBy,
}

/// Where each of a fn's parameters comes from in the generated call.
pub(crate) enum Slot {
    /// The context (`JobContext<'_>` / `StepContext<'_>`) the runtime
    /// passes.
    Context(ContextParam),
    /// The field with this index.
    Field(usize),
}

/// A fn's parameters as they are classified one by one: the fields, and
/// where each parameter comes from.
#[derive(Default)]
pub(crate) struct Params {
    /// The fields, in parameter order (with stand-ins for the refused
    /// ones whose meaning is clear: see [`StandIn`]).
    pub(crate) params: Vec<Param>,
    /// The fn's parameters in order.
    pub(crate) slots: Vec<Slot>,
    /// Whether a refused parameter has no stand-in ([`StandIn::Unknown`]):
    /// stand-in types beside the errors would not match the user's code.
    pub(crate) unknown: bool,
    context_seen: bool,
}

impl Params {
    /// Classifies the next parameter, reporting a second context.
    pub(crate) fn push(&mut self, arg: &PatType, rules: &ParamRules<'_>, errors: &mut Errors) {
        match classify_param(arg, rules, errors) {
            ParamKind::Context(context) => {
                let conditional = !context.cfgs.is_empty();
                if self.context_seen && !conditional {
                    errors.spanned(
                        arg,
                        format!(
                            "a `{}` fn takes at most one `{}<'_>` parameter: remove this one",
                            rules.attribute, rules.context
                        ),
                    );
                }
                self.context_seen |= !conditional;
                self.slots.push(Slot::Context(context));
            }
            ParamKind::Field(param) | ParamKind::Invalid(StandIn::Field(param)) => {
                self.slots.push(Slot::Field(self.params.len()));
                self.params.push(*param);
            }
            ParamKind::Invalid(StandIn::Nothing) => {}
            ParamKind::Invalid(StandIn::Unknown) => self.unknown = true,
        }
    }
}

/// Where in a macro a parameter is classified, for the messages.
pub(crate) struct ParamRules<'a> {
    /// `#[job]` or `#[step]`.
    pub(crate) attribute: &'a str,
    /// `job` or `step`.
    pub(crate) what: &'a str,
    /// `JobContext` or `StepContext`.
    pub(crate) context: &'a str,
    /// The other macro's context (`StepContext` for a job), refused with
    /// a message naming this one, not as a field that borrows.
    pub(crate) other_context: &'a str,
}

/// Classifies one typed parameter: the context, a field, or an error
/// (with what stands in for it beside the error).
pub(crate) fn classify_param(
    arg: &PatType,
    rules: &ParamRules<'_>,
    errors: &mut Errors,
) -> ParamKind {
    let (field_attrs, cfgs, mut ok) = param_attrs(&arg.attrs, rules, errors);
    // The context parameter, by value or by reference, in any position.
    let (context_ty, by) = match &*arg.ty {
        Type::Reference(r) if r.mutability.is_some() => (&*r.elem, ContextBy::Mut),
        Type::Reference(r) => (&*r.elem, ContextBy::Ref),
        ty => (ty, ContextBy::Value),
    };
    if is_named(context_ty, rules.context) {
        return if check_context_pat(&arg.pat, rules, errors) && ok {
            ParamKind::Context(ContextParam { cfgs, by })
        } else {
            ParamKind::Invalid(StandIn::Nothing)
        };
    }
    if is_named(context_ty, rules.other_context) {
        errors.spanned(
            &arg.ty,
            format!(
                "a `{}` fn takes its context as `ctx: {}<'_>`; `{}` is the context of a {}",
                rules.attribute,
                rules.context,
                rules.other_context,
                if rules.other_context == "StepContext" {
                    "workflow step"
                } else {
                    "job"
                }
            ),
        );
        return ParamKind::Invalid(StandIn::Nothing);
    }
    let ident = match &*arg.pat {
        Pat::Ident(pat) => {
            if let Some(by_ref) = &pat.by_ref {
                errors.spanned(
                    by_ref,
                    format!(
                        "`ref` parameters are not supported in a `{}` fn: write `{}: {}`",
                        rules.attribute,
                        pat.ident,
                        type_text(&arg.ty)
                    ),
                );
                ok = false;
            }
            if let Some((at, _)) = &pat.subpat {
                errors.spanned(
                    at,
                    format!(
                        "`@` patterns are not supported: each `{}` parameter is a plain name that becomes a field",
                        rules.attribute
                    ),
                );
                ok = false;
            }
            pat.ident.clone()
        }
        Pat::Wild(w) => {
            errors.spanned(
                w,
                format!(
                    "name this parameter: each `{}` parameter becomes a named field of the {}; write `name: {}` (a name starting with `_` if the body does not use it)",
                    rules.attribute,
                    rules.what,
                    type_text(&arg.ty)
                ),
            );
            return ParamKind::Invalid(StandIn::Unknown);
        }
        other => {
            errors.spanned(
                other,
                format!(
                    "destructuring patterns cannot be `{}` parameters: each parameter becomes a named field of the {}, stored under its name; write `value: {}` and destructure it in the body",
                    rules.attribute,
                    rules.what,
                    type_text(&arg.ty)
                ),
            );
            return ParamKind::Invalid(StandIn::Unknown);
        }
    };
    if !check_type(&arg.ty, rules, errors) {
        return ParamKind::Invalid(StandIn::Unknown);
    }
    let (field_ty, by_ref) = match &*arg.ty {
        Type::Reference(reference) => match owned_type(reference, rules, errors) {
            Some((owned, clean)) => {
                ok &= clean;
                (owned, true)
            }
            None => return ParamKind::Invalid(StandIn::Unknown),
        },
        ty => ((*ty).clone(), false),
    };
    if !check_borrows(&field_ty, &arg.ty, rules, errors) {
        return ParamKind::Invalid(StandIn::Unknown);
    }
    let param = Box::new(Param {
        ident,
        field_ty,
        by_ref,
        field_attrs,
        cfgs,
    });
    if ok {
        ParamKind::Field(param)
    } else {
        ParamKind::Invalid(StandIn::Field(param))
    }
}

/// The lint attributes a parameter may carry onto its field.
const LINTS: &[&str] = &["allow", "warn", "deny", "forbid"];

/// Splits a parameter's attributes into those of the generated field and
/// the `#[cfg]`s of its every use, reporting (and dropping) an attribute
/// that cannot be carried; the flag is `false` when one was.
///
/// Accepted: doc comments (moved to the field; rustc refuses them on
/// parameters, so the re-emitted fn drops them), `#[serde(default)]` and
/// `#[serde(default = "path")]` (moved to the field, likewise), `#[cfg]` and
/// `#[cfg_attr]` (on the fn, the field and every use), the lint levels
/// `allow`, `warn`, `deny`, `forbid` (on the fn and the field) and
/// `expect` (on the fn only: on the field it would be unfulfilled).
fn param_attrs(
    attrs: &[Attribute],
    rules: &ParamRules<'_>,
    errors: &mut Errors,
) -> (Vec<Attribute>, Vec<Attribute>, bool) {
    let mut field = Vec::new();
    let mut cfgs = Vec::new();
    let mut ok = true;
    for attr in attrs {
        let path = attr.path();
        if path.is_ident("doc") || LINTS.iter().any(|l| path.is_ident(l)) {
            field.push(attr.clone());
        } else if path.is_ident("cfg") {
            field.push(attr.clone());
            cfgs.push(attr.clone());
        } else if path.is_ident("cfg_attr") {
            field.push(attr.clone());
            if let Some(cfg) = cfg_part(attr) {
                cfgs.push(cfg);
            }
        } else if path.is_ident("expect") {
        } else if serde_default(attr) {
            // A field added by a later version: runs stored before it
            // decode with the default.
            field.push(attr.clone());
        } else {
            let name = path.to_token_stream().to_string().replace(' ', "");
            let instead = if path.is_ident("serde") {
                "; of `#[serde]` only `#[serde(default)]` and `#[serde(default = \"path\")]` are (a field added later, read with its default from runs stored before it); otherwise the field is serialized as its type is: put the `#[serde(...)]` attributes on that type".to_string()
            } else {
                String::new()
            };
            errors.spanned(
                attr,
                format!(
                    "`#[{name}]` cannot be carried onto the field this `{}` parameter becomes: a parameter takes doc comments, `#[cfg]`, `#[cfg_attr]` and the lint levels (`allow`, `warn`, `deny`, `forbid`, `expect`){instead}",
                    rules.attribute
                ),
            );
            ok = false;
        }
    }
    (field, cfgs, ok)
}

/// Whether `attr` is `#[serde(default)]` or `#[serde(default = "path")]`.
fn serde_default(attr: &Attribute) -> bool {
    if !attr.path().is_ident("serde") {
        return false;
    }
    let Ok(metas) = attr.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated) else {
        return false;
    };
    !metas.is_empty()
        && metas.iter().all(|meta| match meta {
            Meta::Path(path) => path.is_ident("default"),
            Meta::NameValue(nv) => {
                nv.path.is_ident("default")
                    && matches!(
                        &nv.value,
                        syn::Expr::Lit(syn::ExprLit {
                            lit: syn::Lit::Str(_),
                            ..
                        })
                    )
            }
            Meta::List(_) => false,
        })
}

/// The part of a `#[cfg_attr(predicate, attrs...)]` that can configure
/// the item out (its `cfg`s and nested `cfg_attr`s), as an attribute of
/// its own; `None` when there is none.
fn cfg_part(attr: &Attribute) -> Option<Attribute> {
    let meta = cfg_attr_cfgs(&attr.meta)?;
    Some(Attribute {
        meta,
        ..attr.clone()
    })
}

fn cfg_attr_cfgs(meta: &syn::Meta) -> Option<syn::Meta> {
    let syn::Meta::List(list) = meta else {
        return None;
    };
    let items: Punctuated<syn::Meta, Token![,]> =
        list.parse_args_with(Punctuated::parse_terminated).ok()?;
    let mut items = items.into_iter();
    let predicate = items.next()?;
    let kept: Vec<syn::Meta> = items
        .filter_map(|m| {
            if m.path().is_ident("cfg") {
                Some(m)
            } else if m.path().is_ident("cfg_attr") {
                cfg_attr_cfgs(&m)
            } else {
                None
            }
        })
        .collect();
    if kept.is_empty() {
        return None;
    }
    let path = &list.path;
    Some(syn::parse_quote!(#path(#predicate, #(#kept),*)))
}

/// Keeps on each parameter only the attributes rustc takes there
/// (`#[cfg]`, `#[cfg_attr]`, lint levels): doc comments moved to the
/// generated fields (rustc refuses them on parameters), and any other
/// attribute was reported, so re-emitting it would only add an error.
pub(crate) fn strip_param_attrs<'a>(inputs: impl IntoIterator<Item = &'a mut FnArg>) {
    for input in inputs {
        if let FnArg::Typed(arg) = input {
            arg.attrs.retain(|a| {
                let path = a.path();
                path.is_ident("cfg")
                    || path.is_ident("cfg_attr")
                    || path.is_ident("expect")
                    || LINTS.iter().any(|l| path.is_ident(l))
            });
        }
    }
}

/// Prepares a job or step fn to be re-emitted: removes the qualifiers the
/// macro reported and rustc refuses on an `async fn` too (`const`, an ABI,
/// `...`), so the macro's error is the only one; and allows
/// `clippy::unused_async` on it, since the macro requires the `async` of a
/// body that need not await.
pub(crate) fn prepare_emitted(attrs: &mut Vec<Attribute>, sig: &mut syn::Signature) {
    sig.constness = None;
    sig.abi = None;
    sig.variadic = None;
    if sig.asyncness.is_some() {
        attrs.push(syn::parse_quote!(#[allow(clippy::unused_async)]));
    }
}

/// Reports a lifetime other than `'static` in a field's owned type: a
/// stored field cannot borrow.
fn check_borrows(
    field_ty: &Type,
    written: &Type,
    rules: &ParamRules<'_>,
    errors: &mut Errors,
) -> bool {
    match first_borrow(field_ty) {
        None => true,
        Some(lifetime) => {
            errors.spanned(
                &lifetime,
                format!(
                    "a `{}` parameter is stored owned in the {}'s payload, and `{}` borrows for `{lifetime}`: take an owned type (for example `String` for `Cow<'_, str>`), or a plain reference `&T` whose `T` owns its data",
                    rules.attribute,
                    rules.what,
                    type_text(written)
                ),
            );
            false
        }
    }
}

/// The first lifetime other than `'static` in `ty`.
pub(crate) fn first_borrow(ty: &Type) -> Option<syn::Lifetime> {
    struct Finder(Option<syn::Lifetime>);
    impl<'ast> Visit<'ast> for Finder {
        fn visit_lifetime(&mut self, lifetime: &'ast syn::Lifetime) {
            if self.0.is_none() && lifetime.ident != "static" {
                self.0 = Some(lifetime.clone());
            }
        }
        fn visit_type_reference(&mut self, reference: &'ast TypeReference) {
            match &reference.lifetime {
                Some(lifetime) => self.visit_lifetime(lifetime),
                None if self.0.is_none() => {
                    self.0 = Some(syn::Lifetime::new("'_", reference.and_token.span));
                }
                None => {}
            }
            self.visit_type(&reference.elem);
        }
    }
    let mut finder = Finder(None);
    finder.visit_type(ty);
    finder.0
}

/// The first `impl Trait` or `_` in `ty`: a type that names no concrete
/// type to store.
pub(crate) fn first_unnamed(ty: &Type) -> Option<TokenStream> {
    struct Finder(Option<TokenStream>);
    impl<'ast> Visit<'ast> for Finder {
        fn visit_type_impl_trait(&mut self, node: &'ast syn::TypeImplTrait) {
            self.0.get_or_insert_with(|| node.to_token_stream());
        }
        fn visit_type_infer(&mut self, node: &'ast syn::TypeInfer) {
            self.0.get_or_insert_with(|| node.to_token_stream());
        }
    }
    let mut finder = Finder(None);
    finder.visit_type(ty);
    finder.0
}

/// Reports type and const generics (lifetimes are accepted): one error
/// spanning the generics and the `where` clause, saying "generic" (the word
/// users search for). `what` is `a \`#[job]\` fn`.
pub(crate) fn check_generics(
    generics: &syn::Generics,
    what: &str,
    reason: &str,
    errors: &mut Errors,
) -> bool {
    let typed = generics
        .params
        .iter()
        .any(|p| !matches!(p, syn::GenericParam::Lifetime(_)));
    let where_types = generics.where_clause.as_ref().is_some_and(|w| {
        w.predicates
            .iter()
            .any(|p| matches!(p, syn::WherePredicate::Type(t) if mentions_params(&t.bounded_ty, generics)))
    });
    if !typed && !where_types {
        return true;
    }
    let where_clause = &generics.where_clause;
    errors.spanned(
        quote!(#generics #where_clause),
        format!("{what} cannot be generic (it has type or const parameters): {reason}"),
    );
    false
}

fn mentions_params(ty: &Type, generics: &syn::Generics) -> bool {
    let names: Vec<&Ident> = generics
        .params
        .iter()
        .filter_map(|p| match p {
            syn::GenericParam::Type(t) => Some(&t.ident),
            syn::GenericParam::Const(c) => Some(&c.ident),
            syn::GenericParam::Lifetime(_) => None,
        })
        .collect();
    struct Finder<'n>(&'n [&'n Ident], bool);
    impl<'ast> Visit<'ast> for Finder<'_> {
        fn visit_ident(&mut self, ident: &'ast Ident) {
            self.1 |= self.0.contains(&ident);
        }
    }
    let mut finder = Finder(&names, false);
    finder.visit_type(ty);
    finder.1
}

fn check_context_pat(pat: &Pat, rules: &ParamRules<'_>, errors: &mut Errors) -> bool {
    match pat {
        Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => true,
        Pat::Wild(_) => true,
        other => {
            errors.spanned(
                other,
                format!(
                    "bind the context to a name: write `ctx: {}<'_>`",
                    rules.context
                ),
            );
            false
        }
    }
}

/// `&str` -> `String`, `&[T]` -> `Vec<T>`, `&Path` -> `PathBuf`, `&T` -> `T`,
/// and whether the reference is one a parameter can be (`&mut T` is
/// reported, and stands in as `&T` would); `None` for a nested reference.
fn owned_type(
    reference: &TypeReference,
    rules: &ParamRules<'_>,
    errors: &mut Errors,
) -> Option<(Type, bool)> {
    let mut clean = true;
    if let Some(m) = &reference.mutability {
        errors.spanned(
            m,
            format!(
                "`&mut` parameters are not supported: a {} gets its parameters from a stored value; take it by value and return what changed",
                rules.what
            ),
        );
        clean = false;
    }
    let elem = &*reference.elem;
    let span = elem.span();
    let owned: Type = match elem {
        Type::Path(TypePath { qself: None, path }) if path.is_ident("str") => {
            syn::parse_quote_spanned!(span=> ::std::string::String)
        }
        Type::Path(TypePath { qself: None, path })
            if path.segments.len() == 1 && path.is_ident("Path") =>
        {
            syn::parse_quote_spanned!(span=> ::std::path::PathBuf)
        }
        Type::Slice(slice) => {
            let inner = &slice.elem;
            syn::parse_quote_spanned!(span=> ::std::vec::Vec<#inner>)
        }
        Type::Reference(inner) => {
            errors.spanned(
                inner,
                format!(
                    "nested references are not supported in a {} parameter: take `&{}`",
                    rules.what,
                    type_text(&inner.elem)
                ),
            );
            return None;
        }
        other => other.clone(),
    };
    Some((owned, clean))
}

/// Rejects types a stored field cannot have: `impl Trait` and `_`.
fn check_type(ty: &Type, rules: &ParamRules<'_>, errors: &mut Errors) -> bool {
    struct Finder<'e, 'r> {
        errors: &'e mut Errors,
        rules: &'r ParamRules<'r>,
        ok: bool,
    }
    impl<'ast> Visit<'ast> for Finder<'_, '_> {
        fn visit_type_impl_trait(&mut self, node: &'ast syn::TypeImplTrait) {
            self.errors.spanned(
                node,
                format!(
                    "`impl Trait` cannot be the type of a `{}` parameter: it becomes a stored field, which needs a concrete type; name the type (for example `String` instead of `impl Into<String>`)",
                    self.rules.attribute
                ),
            );
            self.ok = false;
        }
        fn visit_type_infer(&mut self, node: &'ast syn::TypeInfer) {
            self.errors.spanned(
                node,
                format!(
                    "`_` cannot be the type of a `{}` parameter: write the type",
                    self.rules.attribute
                ),
            );
            self.ok = false;
        }
    }
    let mut finder = Finder {
        errors,
        rules,
        ok: true,
    };
    finder.visit_type(ty);
    finder.ok
}

/// Splits a fn's parameters, reporting `self` with `receiver_message`
/// (`None`: a receiver is allowed and returned).
pub(crate) fn typed_inputs<'a>(
    inputs: impl IntoIterator<Item = &'a FnArg>,
    receiver_message: Option<&str>,
    errors: &mut Errors,
) -> (Option<&'a syn::Receiver>, Vec<&'a PatType>) {
    let mut receiver = None;
    let mut typed = Vec::new();
    for input in inputs {
        match input {
            FnArg::Receiver(r) => match receiver_message {
                Some(message) => errors.spanned(r, message),
                None => receiver = Some(r),
            },
            FnArg::Typed(t) => typed.push(t),
        }
    }
    (receiver, typed)
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::*;

    fn classify(tokens: TokenStream) -> (ParamKind, Vec<String>) {
        let arg: PatType = syn::parse2(tokens).unwrap();
        let mut errors = Errors::new();
        let rules = ParamRules {
            attribute: "#[job]",
            what: "job",
            context: "JobContext",
            other_context: "StepContext",
        };
        let kind = classify_param(&arg, &rules, &mut errors);
        (kind, errors.messages())
    }

    #[test]
    fn params_record_slots_and_report_a_second_context() {
        for (rules, first, second, message) in [
            (
                ParamRules {
                    attribute: "#[job]",
                    what: "job",
                    context: "JobContext",
                    other_context: "StepContext",
                },
                quote!(ctx: JobContext<'_>),
                quote!(again: JobContext<'_>),
                "a `#[job]` fn takes at most one `JobContext<'_>` parameter: remove this one",
            ),
            (
                ParamRules {
                    attribute: "#[step]",
                    what: "step",
                    context: "StepContext",
                    other_context: "JobContext",
                },
                quote!(ctx: StepContext<'_>),
                quote!(again: StepContext<'_>),
                "a `#[step]` fn takes at most one `StepContext<'_>` parameter: remove this one",
            ),
        ] {
            let args: Vec<PatType> = [quote!(a: u8), first, quote!(b: &str), second]
                .into_iter()
                .map(|t| syn::parse2(t).unwrap())
                .collect();
            let mut errors = Errors::new();
            let mut fields = Params::default();
            for arg in &args {
                fields.push(arg, &rules, &mut errors);
            }
            assert_eq!(errors.messages(), [message]);
            assert_eq!(fields.params.len(), 2);
            assert!(matches!(
                fields.slots[..],
                [
                    Slot::Field(0),
                    Slot::Context(_),
                    Slot::Field(1),
                    Slot::Context(_)
                ]
            ));
        }
    }

    #[test]
    fn references_become_owned_fields() {
        for (input, owned) in [
            (quote!(to: &str), "::std::string::String"),
            (quote!(ids: &[u64]), "::std::vec::Vec<u64>"),
            (quote!(p: &Path), "::std::path::PathBuf"),
            (quote!(o: &Order), "Order"),
            (quote!(mut n: u32), "u32"),
        ] {
            let (kind, errors) = classify(input);
            assert!(errors.is_empty(), "{errors:?}");
            let ParamKind::Field(param) = kind else {
                panic!("not a field")
            };
            assert_eq!(
                param
                    .field_ty
                    .to_token_stream()
                    .to_string()
                    .replace(' ', ""),
                owned.replace(' ', "")
            );
        }
    }

    #[test]
    fn context_is_recognised_by_name() {
        assert!(matches!(
            classify(quote!(ctx: JobContext<'_>)).0,
            ParamKind::Context(_)
        ));
        assert!(matches!(
            classify(quote!(ctx: taquba_workflow::jobs::JobContext<'_>)).0,
            ParamKind::Context(_)
        ));
        for (input, by) in [
            (quote!(ctx: &JobContext<'_>), ContextBy::Ref),
            (quote!(ctx: &mut JobContext<'_>), ContextBy::Mut),
            (quote!(mut ctx: JobContext<'_>), ContextBy::Value),
            (quote!(_: JobContext<'_>), ContextBy::Value),
        ] {
            let (kind, errors) = classify(input.clone());
            assert!(errors.is_empty(), "{input}: {errors:?}");
            assert!(
                matches!(kind, ParamKind::Context(ContextParam { by: found, .. }) if found == by),
                "{input}"
            );
        }
        // The other macro's context is named as such, not as a field that
        // borrows.
        for wrong in [quote!(ctx: StepContext<'_>), quote!(ctx: &StepContext<'_>)] {
            let (kind, errors) = classify(wrong);
            assert!(matches!(kind, ParamKind::Invalid(_)));
            assert_eq!(errors.len(), 1, "{errors:?}");
            assert!(
                errors[0].contains(
                    "`ctx: JobContext<'_>`; `StepContext` is the context of a workflow step"
                ),
                "{errors:?}"
            );
        }
    }

    #[test]
    fn invalid_parameters_are_reported() {
        for (input, needle) in [
            (quote!((a, b): (u8, u8)), "destructuring"),
            (quote!(_: u8), "name this parameter"),
            (quote!(x: impl Into<String>), "`impl Trait`"),
            (quote!(x: &mut u8), "`&mut`"),
            (quote!(x: std::borrow::Cow<'a, str>), "borrows for `'a`"),
            (quote!(ref x: u8), "`ref`"),
            (quote!(x: Vec<_>), "`_`"),
        ] {
            let (kind, errors) = classify(input.clone());
            assert!(matches!(kind, ParamKind::Invalid(_)), "{input}");
            assert!(
                errors.iter().any(|e| e.contains(needle)),
                "{input}: {errors:?}"
            );
        }
    }
}
