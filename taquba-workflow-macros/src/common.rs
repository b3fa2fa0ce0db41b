//! Pieces shared by `#[job]` and `#[workflow]`: the error accumulator, the
//! option-list parser, parameter classification and case conversion.

use std::collections::HashSet;
use std::fmt::Display;

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote};
use syn::ext::IdentExt;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{
    Attribute, FnArg, Ident, LitInt, LitStr, Pat, PatType, Path, Token, Type, TypePath,
    TypeReference,
};

/// Accumulates every error of one expansion so a single compile shows all
/// of them (`syn::Error::combine`).
#[derive(Default)]
pub(crate) struct Errors {
    inner: Option<syn::Error>,
}

impl Errors {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.inner {
            Some(existing) => existing.combine(error),
            None => self.inner = Some(error),
        }
    }

    /// An error spanning the tokens of `tokens`.
    pub(crate) fn spanned(&mut self, tokens: impl ToTokens, message: impl Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// An error at one span.
    pub(crate) fn at(&mut self, span: Span, message: impl Display) {
        self.push(syn::Error::new(span, message));
    }

    /// How many errors were pushed.
    pub(crate) fn count(&self) -> usize {
        self.inner
            .iter()
            .flat_map(|e| e.clone().into_iter())
            .count()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.inner.is_none()
    }

    /// The `compile_error!` invocations of every error pushed.
    pub(crate) fn to_compile_errors(&self) -> TokenStream {
        match &self.inner {
            Some(error) => error.to_compile_error(),
            None => TokenStream::new(),
        }
    }

    #[cfg(test)]
    pub(crate) fn messages(&self) -> Vec<String> {
        self.inner
            .iter()
            .flat_map(|e| e.clone().into_iter())
            .map(|e| e.to_string())
            .collect()
    }
}

/// One entry of an attribute's option list: `key`, `key = value` or
/// `key(...)`.
pub(crate) struct OptionArg {
    pub(crate) key: Ident,
    pub(crate) value: OptionValue,
}

/// The shape of an option's value.
pub(crate) enum OptionValue {
    /// `key` alone.
    Flag,
    /// `key = tokens`; the span is the `=`'s.
    Value(Span, TokenStream),
    /// `key(tokens)`; the span is the parentheses'.
    List(Span, TokenStream),
}

impl OptionArg {
    pub(crate) fn name(&self) -> String {
        self.key.unraw().to_string()
    }

    /// The tokens after `=`, or an error saying how to write the option.
    pub(crate) fn value(&self, example: &str, errors: &mut Errors) -> Option<&TokenStream> {
        match &self.value {
            OptionValue::Value(_, tokens) => Some(tokens),
            _ => {
                errors.spanned(
                    &self.key,
                    format!("`{}` needs a value: write `{example}`", self.name()),
                );
                None
            }
        }
    }

    /// Checks that the option is a bare flag.
    pub(crate) fn flag(&self, errors: &mut Errors) -> bool {
        match &self.value {
            OptionValue::Flag => true,
            OptionValue::Value(span, _) | OptionValue::List(span, _) => {
                errors.at(
                    *span,
                    format!("`{0}` takes no value: write `{0}` alone", self.name()),
                );
                false
            }
        }
    }

    /// The tokens inside `key(...)`.
    pub(crate) fn list(&self, example: &str, errors: &mut Errors) -> Option<&TokenStream> {
        match &self.value {
            OptionValue::List(_, tokens) => Some(tokens),
            _ => {
                errors.spanned(
                    &self.key,
                    format!("`{}` takes a list: write `{example}`", self.name()),
                );
                None
            }
        }
    }

    pub(crate) fn lit_str(&self, example: &str, errors: &mut Errors) -> Option<LitStr> {
        let tokens = self.value(example, errors)?;
        match syn::parse2::<LitStr>(tokens.clone()) {
            Ok(lit) => Some(lit),
            Err(_) => {
                errors.spanned(
                    tokens,
                    format!(
                        "`{}` takes a string literal: write `{example}`",
                        self.name()
                    ),
                );
                None
            }
        }
    }

    pub(crate) fn parse_value<T: syn::parse::Parse>(
        &self,
        what: &str,
        example: &str,
        errors: &mut Errors,
    ) -> Option<T> {
        let tokens = self.value(example, errors)?;
        match syn::parse2::<T>(tokens.clone()) {
            Ok(value) => Some(value),
            Err(_) => {
                // Quoted (`output = "u32"`): reported with the fix, and the
                // value used as meant, so the expansion beside the error
                // (the stand-in types) matches the user's code.
                if let Ok(lit) = syn::parse2::<LitStr>(tokens.clone())
                    && let Ok(value) = lit.parse::<T>()
                {
                    errors.spanned(
                        tokens,
                        format!(
                            "`{0}` takes {what}, not a string: write `{0} = {1}`",
                            self.name(),
                            lit.value().trim()
                        ),
                    );
                    return Some(value);
                }
                errors.spanned(
                    tokens,
                    format!("`{}` takes {what}: write `{example}`", self.name()),
                );
                None
            }
        }
    }

    /// A string literal that must not be empty or contain control
    /// characters (a name stored in payloads).
    pub(crate) fn name_str(&self, example: &str, errors: &mut Errors) -> Option<LitStr> {
        let lit = self.lit_str(example, errors)?;
        let value = lit.value();
        if value.trim().is_empty() {
            errors.spanned(
                &lit,
                format!("`{}` cannot be empty: write `{example}`", self.name()),
            );
            return None;
        }
        if value.chars().any(char::is_control) {
            errors.spanned(
                &lit,
                format!("`{}` cannot contain control characters", self.name()),
            );
            return None;
        }
        Some(lit)
    }

    /// `derive(Debug, Clone)`: the paths in the list (none when the
    /// option is malformed, which is reported).
    pub(crate) fn derives(&self, errors: &mut Errors) -> Vec<Path> {
        let Some(tokens) = self.list("derive(Debug, Clone)", errors) else {
            return Vec::new();
        };
        match syn::parse::Parser::parse2(
            Punctuated::<Path, Token![,]>::parse_terminated,
            tokens.clone(),
        ) {
            Ok(paths) => paths.into_iter().collect(),
            Err(error) => {
                errors.push(error);
                Vec::new()
            }
        }
    }

    /// `crate = path`: where the runtime crate is.
    pub(crate) fn crate_path(&self, errors: &mut Errors) -> Option<Path> {
        self.parse_value("a path", "crate = ::taquba_workflow", errors)
    }

    pub(crate) fn positive_u32(&self, example: &str, errors: &mut Errors) -> Option<LitInt> {
        let lit: LitInt = self.parse_value("a positive integer", example, errors)?;
        match lit.base10_parse::<u32>() {
            Ok(0) => {
                errors.spanned(&lit, format!("`{}` must be at least 1", self.name()));
                None
            }
            Ok(_) => Some(lit),
            Err(_) => {
                errors.spanned(
                    &lit,
                    format!(
                        "`{}` must be an integer from 1 to {}",
                        self.name(),
                        u32::MAX
                    ),
                );
                None
            }
        }
    }
}

/// Parses `a, b = value, c(list)` without stopping at the first mistake:
/// a malformed entry is reported and skipped up to the next comma.
pub(crate) fn parse_options(tokens: TokenStream, errors: &mut Errors) -> Vec<OptionArg> {
    let mut out = Vec::new();
    let mut iter = tokens.into_iter().peekable();
    while let Some(tree) = iter.next() {
        let key = match tree {
            TokenTree::Ident(ident) => ident,
            other => {
                errors.spanned(&other, "expected an option name such as `name = \"...\"`");
                skip_to_comma(&mut iter);
                continue;
            }
        };
        let value = match iter.peek() {
            None => OptionValue::Flag,
            Some(TokenTree::Punct(p)) if p.as_char() == ',' => OptionValue::Flag,
            Some(TokenTree::Punct(p)) if p.as_char() == '=' => {
                let eq_span = p.span();
                iter.next();
                let value = take_to_comma(&mut iter);
                if value.is_empty() {
                    errors.at(
                        eq_span,
                        format!("expected a value after `{} =`", key.unraw()),
                    );
                    iter.next();
                    continue;
                }
                OptionValue::Value(eq_span, value)
            }
            Some(TokenTree::Group(g)) if g.delimiter() == Delimiter::Parenthesis => {
                let span = g.span();
                let stream = g.stream();
                iter.next();
                OptionValue::List(span, stream)
            }
            Some(other) => {
                errors.spanned(
                    other,
                    format!(
                        "expected `=`, `(...)` or `,` after the option `{}`",
                        key.unraw()
                    ),
                );
                skip_to_comma(&mut iter);
                continue;
            }
        };
        match iter.next() {
            None => {}
            Some(TokenTree::Punct(p)) if p.as_char() == ',' => {}
            Some(other) => {
                errors.spanned(&other, "expected `,` between options");
                skip_to_comma(&mut iter);
            }
        }
        out.push(OptionArg { key, value });
    }
    out
}

fn take_to_comma(
    iter: &mut std::iter::Peekable<proc_macro2::token_stream::IntoIter>,
) -> TokenStream {
    let mut out = TokenStream::new();
    let mut depth = 0usize;
    let mut prev_dash = false;
    while let Some(tree) = iter.peek() {
        if let TokenTree::Punct(p) = tree {
            match p.as_char() {
                ',' if depth == 0 => break,
                '<' => depth += 1,
                '>' if !prev_dash => depth = depth.saturating_sub(1),
                _ => {}
            }
            prev_dash = p.as_char() == '-';
        } else {
            prev_dash = false;
        }
        if let Some(tree) = iter.next() {
            out.extend(std::iter::once(tree));
        }
    }
    out
}

fn skip_to_comma(iter: &mut std::iter::Peekable<proc_macro2::token_stream::IntoIter>) {
    take_to_comma(iter);
    iter.next();
}

/// What [`for_each_option`] does with a misspelt option (one close to a
/// known one), besides reporting it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Misspelt {
    /// Nothing more: the attribute's expansion beside an error does not
    /// depend on its options (`#[job]`, `#[step]`, where a guess could
    /// clash with another option and be reported on top).
    Skip,
    /// Apply it as the option it is close to, when that one is not set,
    /// without reporting its value's mistakes: the stand-in types beside
    /// the error then match the user's code (`#[workflow(outptu = u32)]`).
    ReadAsMeant,
}

/// Parses the option list of `#[attribute(...)]` and hands each known,
/// first-seen option to `apply` with its name; malformed, unknown
/// (`known` lists the accepted names) and duplicate options are reported
/// and skipped (a misspelt one then applied as `misspelt` says).
pub(crate) fn for_each_option(
    tokens: TokenStream,
    attribute: &str,
    known: &[&str],
    misspelt_options: Misspelt,
    errors: &mut Errors,
    mut apply: impl FnMut(&str, &OptionArg, &mut Errors),
) {
    let mut seen = Seen::default();
    let mut misspelt = Vec::new();
    for arg in parse_options(tokens, errors) {
        let name = arg.name();
        if !known.contains(&name.as_str()) {
            errors.spanned(&arg.key, unknown_option(&arg, attribute, known));
            if let Some(meant) = suggestion(&name, known)
                && misspelt_options == Misspelt::ReadAsMeant
            {
                misspelt.push((meant, arg));
            }
            continue;
        }
        if !seen.first(&arg, errors) {
            continue;
        }
        apply(&name, &arg, errors);
    }
    // The build fails on the typo anyway; read as meant, the expansion
    // beside it matches the user's code instead of cascading (a
    // `Transition::done(5)` checked against the default output).
    for (meant, arg) in misspelt {
        if seen.0.insert(meant.to_string()) {
            apply(meant, &arg, &mut Errors::new());
        }
    }
}

/// Tracks option names already seen, to report duplicates.
#[derive(Default)]
struct Seen(HashSet<String>);

impl Seen {
    /// Whether `arg` is new; reports it otherwise.
    fn first(&mut self, arg: &OptionArg, errors: &mut Errors) -> bool {
        if self.0.insert(arg.name()) {
            true
        } else {
            errors.spanned(
                &arg.key,
                format!(
                    "duplicate option `{}`: it is already set in this attribute; remove one of them",
                    arg.name()
                ),
            );
            false
        }
    }
}

/// The message for an unknown option, with a suggestion when a known one
/// is close.
pub(crate) fn unknown_option(arg: &OptionArg, attribute: &str, known: &[&str]) -> String {
    let name = arg.name();
    let listed = known
        .iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    let base = format!("unknown `#[{attribute}]` option `{name}`");
    match suggestion(&name, known) {
        Some(suggestion) => {
            format!("{base}: did you mean `{suggestion}`? The options are {listed}")
        }
        None => format!("{base}: the options are {listed}"),
    }
}

/// The known option closest to `name`, when one is close (at most two
/// edits away).
fn suggestion<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(name, k), *k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let current = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(row[j]).min(row[j + 1])
            };
            prev = current;
        }
    }
    row[b.len()]
}

/// `send_email` -> `SendEmail`; `r#type` -> `Type`.
pub(crate) fn pascal_case(snake: &str) -> String {
    let snake = snake.strip_prefix("r#").unwrap_or(snake);
    let mut out = String::with_capacity(snake.len());
    let mut upper = true;
    for c in snake.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// The `#[doc]` attributes of an item.
pub(crate) fn doc_attrs(attrs: &[Attribute]) -> Vec<&Attribute> {
    attrs.iter().filter(|a| a.path().is_ident("doc")).collect()
}

/// The `#[cfg]` attributes of an item: generated siblings of a
/// conditionally compiled item must be compiled under the same condition.
pub(crate) fn cfg_attrs(attrs: &[Attribute]) -> Vec<&Attribute> {
    attrs.iter().filter(|a| a.path().is_ident("cfg")).collect()
}

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
    /// The parameter's type as written.
    pub(crate) ty: Type,
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
    /// The context parameter (`JobContext<'_>` / `StepContext<'_>`), with
    /// its `#[cfg]`s.
    Context(Vec<Attribute>),
    /// A field of the generated type.
    Field(Box<Param>),
    /// An error was reported.
    Invalid,
}

/// Where each of a fn's parameters comes from in the generated call.
pub(crate) enum Slot {
    /// The context (`JobContext<'_>` / `StepContext<'_>`) the runtime
    /// passes, with the parameter's `#[cfg]`s.
    Context(Vec<Attribute>),
    /// The field with this index.
    Field(usize),
}

/// A fn's parameters as they are classified one by one: the fields, and
/// where each parameter comes from.
#[derive(Default)]
pub(crate) struct Params {
    /// The fields, in parameter order.
    pub(crate) params: Vec<Param>,
    /// The fn's parameters in order.
    pub(crate) slots: Vec<Slot>,
    context_seen: bool,
}

impl Params {
    /// Classifies the next parameter, reporting a second context.
    pub(crate) fn push(&mut self, arg: &PatType, rules: &ParamRules<'_>, errors: &mut Errors) {
        match classify_param(arg, rules, errors) {
            ParamKind::Context(cfgs) => {
                let conditional = !cfgs.is_empty();
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
                self.slots.push(Slot::Context(cfgs));
            }
            ParamKind::Field(param) => {
                self.slots.push(Slot::Field(self.params.len()));
                self.params.push(*param);
            }
            ParamKind::Invalid => {}
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
    /// Whether `Self` in a type is an error (the generated type lives
    /// outside the impl block).
    pub(crate) forbid_self: bool,
}

/// Classifies one typed parameter: the context, a field, or an error.
pub(crate) fn classify_param(
    arg: &PatType,
    rules: &ParamRules<'_>,
    errors: &mut Errors,
) -> ParamKind {
    let mut ok = true;
    let (field_attrs, cfgs) = match param_attrs(&arg.attrs, rules, errors) {
        Some(split) => split,
        None => {
            ok = false;
            (Vec::new(), Vec::new())
        }
    };
    // The context parameter, by value, in any position.
    if is_named(&arg.ty, rules.context) {
        return if check_context_pat(&arg.pat, rules, errors) && ok {
            ParamKind::Context(cfgs)
        } else {
            ParamKind::Invalid
        };
    }
    let other = match &*arg.ty {
        Type::Reference(r) => &*r.elem,
        ty => ty,
    };
    if is_named(other, rules.other_context) {
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
        return ParamKind::Invalid;
    }
    if let Type::Reference(r) = &*arg.ty
        && is_named(&r.elem, rules.context)
    {
        errors.spanned(
            &arg.ty,
            format!(
                "take the context by value: write `ctx: {}<'_>`",
                rules.context
            ),
        );
        return ParamKind::Invalid;
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
                        arg.ty.to_token_stream()
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
                    "name this parameter: each `{}` parameter becomes a named field of the {}; write `name: {}`",
                    rules.attribute,
                    rules.what,
                    arg.ty.to_token_stream()
                ),
            );
            return ParamKind::Invalid;
        }
        other => {
            errors.spanned(
                other,
                format!(
                    "destructuring patterns cannot be `{}` parameters: each parameter becomes a named field of the {}; write `value: {}` and destructure it in the body",
                    rules.attribute,
                    rules.what,
                    arg.ty.to_token_stream()
                ),
            );
            return ParamKind::Invalid;
        }
    };
    ok &= check_type(&arg.ty, rules, errors);
    let (field_ty, by_ref) = match &*arg.ty {
        Type::Reference(reference) => match owned_type(reference, rules, errors) {
            Some(owned) => (owned, true),
            None => return ParamKind::Invalid,
        },
        ty => ((*ty).clone(), false),
    };
    ok &= check_borrows(&field_ty, &arg.ty, rules, errors);
    if !ok {
        return ParamKind::Invalid;
    }
    ParamKind::Field(Box::new(Param {
        ident,
        ty: (*arg.ty).clone(),
        field_ty,
        by_ref,
        field_attrs,
        cfgs,
    }))
}

/// The lint attributes a parameter may carry onto its field.
const LINTS: &[&str] = &["allow", "warn", "deny", "forbid"];

/// Splits a parameter's attributes into those of the generated field and
/// the `#[cfg]`s of its every use, reporting an attribute that cannot be
/// carried (`None` then).
///
/// Accepted: doc comments (moved to the field; rustc refuses them on
/// parameters, so the re-emitted fn drops them), `#[cfg]` and
/// `#[cfg_attr]` (on the fn, the field and every use), the lint levels
/// `allow`, `warn`, `deny`, `forbid` (on the fn and the field) and
/// `expect` (on the fn only: on the field it would be unfulfilled).
fn param_attrs(
    attrs: &[Attribute],
    rules: &ParamRules<'_>,
    errors: &mut Errors,
) -> Option<(Vec<Attribute>, Vec<Attribute>)> {
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
        } else {
            errors.spanned(
                attr,
                format!(
                    "`#[{}]` cannot be carried onto the field this `{}` parameter becomes: a parameter takes doc comments, `#[cfg]`, `#[cfg_attr]` and the lint levels (`allow`, `warn`, `deny`, `forbid`, `expect`); move this attribute into the body",
                    path.to_token_stream().to_string().replace(' ', ""),
                    rules.attribute
                ),
            );
            ok = false;
        }
    }
    ok.then_some((field, cfgs))
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
                    written.to_token_stream()
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

/// Reports type and const generics (lifetimes are accepted): one error
/// spanning the generics and the `where` clause. `what` is `a \`#[job]\` fn`.
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
        format!("{what} cannot have type or const parameters: {reason}"),
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

/// `&str` -> `String`, `&[T]` -> `Vec<T>`, `&Path` -> `PathBuf`, `&T` -> `T`.
fn owned_type(
    reference: &TypeReference,
    rules: &ParamRules<'_>,
    errors: &mut Errors,
) -> Option<Type> {
    if let Some(m) = &reference.mutability {
        errors.spanned(
            m,
            format!(
                "`&mut` parameters are not supported: a {} gets its parameters from a stored value; take it by value and return what changed",
                rules.what
            ),
        );
        return None;
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
                    inner.elem.to_token_stream()
                ),
            );
            return None;
        }
        other => other.clone(),
    };
    Some(owned)
}

/// Rejects types a stored field cannot have: `impl Trait`, `_`, and (for
/// steps) `Self`.
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
        fn visit_path(&mut self, node: &'ast Path) {
            if self.rules.forbid_self
                && let Some(first) = node.segments.first()
                && first.ident == "Self"
            {
                self.errors.spanned(
                    &first.ident,
                    "`Self` cannot appear in a step parameter type: the step enum is declared outside the impl block; write the type's name",
                );
                self.ok = false;
            }
            syn::visit::visit_path(self, node);
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

/// One piece of a key template.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    /// Literal text (braces already unescaped).
    Text(String),
    /// `{field}` or `{field:spec}`.
    Field { name: String, spec: String },
}

/// Parses `"email:{to}:{subject}"`; `{{` and `}}` are literal braces.
pub(crate) fn parse_template(template: &str) -> Result<Vec<Piece>, String> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '}' => {
                return Err(
                    "unmatched `}` in the key template: write `}}` for a literal brace".into(),
                );
            }
            '{' => {
                let mut inner = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => inner.push(c),
                        None => {
                            return Err("unclosed `{` in the key template: write `{field}`, or `{{` for a literal brace".into());
                        }
                    }
                }
                let (name, spec) = match inner.split_once(':') {
                    Some((name, spec)) => (name.trim().to_string(), spec.to_string()),
                    None => (inner.trim().to_string(), String::new()),
                };
                if name.is_empty() {
                    return Err(
                        "`{}` in the key template must name a parameter: write `{to}`".into(),
                    );
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Field { name, spec });
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// The generated types live in a hidden module beside the annotated item
/// and are glob re-exported from it: an item of the user's with the same
/// name shadows the glob instead of clashing with it, and the expansion
/// checks that the name still means the generated type (one error naming
/// the option that renames it). Written in the module, a visibility is one
/// level deeper: `pub(super)` there is private here.
pub(crate) fn inner_visibility(vis: &syn::Visibility) -> TokenStream {
    match vis {
        syn::Visibility::Public(_) => quote!(pub),
        syn::Visibility::Inherited => quote!(pub(super)),
        syn::Visibility::Restricted(restricted) => {
            let path = &restricted.path;
            let first = path.segments.first().map(|s| s.ident.to_string());
            match first.as_deref() {
                Some("crate") => quote!(#vis),
                Some("self") => {
                    let rest = path.segments.iter().skip(1);
                    quote!(pub(in super #(::#rest)*))
                }
                _ => quote!(pub(in super::#path)),
            }
        }
    }
}

/// `ty` as written in the hidden module: a path starting with `self` or
/// `super` is one module deeper there (every other name resolves through
/// the module's `use super::*`).
pub(crate) fn inner_type(ty: &Type) -> Type {
    struct Deeper;
    impl syn::visit_mut::VisitMut for Deeper {
        fn visit_path_mut(&mut self, path: &mut Path) {
            if path.leading_colon.is_none()
                && let Some(first) = path.segments.first_mut()
            {
                if first.ident == "self" {
                    first.ident = Ident::new("super", first.ident.span());
                } else if first.ident == "super" {
                    let span = first.ident.span();
                    path.segments.insert(0, Ident::new("super", span).into());
                }
            }
            syn::visit_mut::visit_path_mut(self, path);
        }
    }
    let mut ty = ty.clone();
    syn::visit_mut::VisitMut::visit_type_mut(&mut Deeper, &mut ty);
    ty
}

/// `tokens` with every token (and group) at `span`: generated code that
/// names a user's type through the runtime crate's path is located at the
/// user's token as a whole, so a failed bound there is reported at that
/// token rather than at the attribute (an expression's span runs from its
/// first token, which would otherwise be the path's, at the attribute).
pub(crate) fn respan(tokens: &TokenStream, span: proc_macro2::Span) -> TokenStream {
    tokens
        .clone()
        .into_iter()
        .map(|mut tree| {
            if let proc_macro2::TokenTree::Group(group) = &tree {
                let mut inner =
                    proc_macro2::Group::new(group.delimiter(), respan(&group.stream(), span));
                inner.set_span(span);
                tree = proc_macro2::TokenTree::Group(inner);
            } else {
                tree.set_span(span);
            }
            tree
        })
        .collect()
}

/// The runtime crate's path: `::taquba_workflow` unless `crate = path`.
pub(crate) fn crate_path(custom: Option<&Path>) -> TokenStream {
    match custom {
        Some(path) => quote!(#path),
        None => quote!(::taquba_workflow),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pascal_case_converts_snake_case() {
        assert_eq!(pascal_case("send_email"), "SendEmail");
        assert_eq!(pascal_case("r#type"), "Type");
        assert_eq!(pascal_case("_leading__double"), "LeadingDouble");
        assert_eq!(pascal_case("v2_upload"), "V2Upload");
    }

    #[test]
    fn options_parse_every_shape_and_keep_going() {
        let mut errors = Errors::new();
        let args = parse_options(
            quote!(name = "a", idempotent, derive(Debug, Clone), output = Vec<(u8, u8)>, 3, key = "k"),
            &mut errors,
        );
        let names: Vec<_> = args.iter().map(OptionArg::name).collect();
        assert_eq!(names, ["name", "idempotent", "derive", "output", "key"]);
        assert!(
            matches!(args[3].value, OptionValue::Value(_, ref t) if t.to_string() == "Vec < (u8 , u8) >")
        );
        assert_eq!(errors.messages().len(), 1);
    }

    #[test]
    fn empty_value_is_reported() {
        let mut errors = Errors::new();
        let args = parse_options(quote!(name =, key = "x"), &mut errors);
        assert_eq!(args.len(), 1);
        assert!(errors.messages()[0].contains("expected a value after `name =`"));
    }

    #[test]
    fn unknown_option_suggests_a_close_one() {
        let mut errors = Errors::new();
        let args = parse_options(quote!(nmae = "x"), &mut errors);
        let message = unknown_option(&args[0], "job", &["name", "key"]);
        assert!(message.contains("did you mean `name`?"), "{message}");
    }

    #[test]
    fn templates_parse_fields_specs_and_escapes() {
        assert_eq!(
            parse_template("email:{to}:{{x}}{n:>3}").unwrap(),
            vec![
                Piece::Text("email:".into()),
                Piece::Field {
                    name: "to".into(),
                    spec: String::new()
                },
                Piece::Text(":{x}".into()),
                Piece::Field {
                    name: "n".into(),
                    spec: ">3".into()
                },
            ]
        );
        assert!(parse_template("a{").is_err());
        assert!(parse_template("a}").is_err());
        assert!(parse_template("{}").is_err());
    }

    fn classify(tokens: TokenStream) -> (ParamKind, Vec<String>) {
        let arg: PatType = syn::parse2(tokens).unwrap();
        let mut errors = Errors::new();
        let rules = ParamRules {
            attribute: "#[job]",
            what: "job",
            context: "JobContext",
            other_context: "StepContext",
            forbid_self: false,
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
                    forbid_self: false,
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
                    forbid_self: true,
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
        let (kind, errors) = classify(quote!(ctx: &JobContext<'_>));
        assert!(matches!(kind, ParamKind::Invalid));
        assert!(errors[0].contains("by value"));
        // The other macro's context is named as such, not as a field that
        // borrows.
        for wrong in [quote!(ctx: StepContext<'_>), quote!(ctx: &StepContext<'_>)] {
            let (kind, errors) = classify(wrong);
            assert!(matches!(kind, ParamKind::Invalid));
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
            assert!(matches!(kind, ParamKind::Invalid), "{input}");
            assert!(
                errors.iter().any(|e| e.contains(needle)),
                "{input}: {errors:?}"
            );
        }
    }
}
