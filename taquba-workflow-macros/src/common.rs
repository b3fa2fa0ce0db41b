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

/// Parses the option list of `#[attribute(...)]` and hands each known,
/// first-seen option to `apply` with its name; malformed, unknown
/// (`known` lists the accepted names) and duplicate options are reported
/// and skipped.
pub(crate) fn for_each_option(
    tokens: TokenStream,
    attribute: &str,
    known: &[&str],
    errors: &mut Errors,
    mut apply: impl FnMut(&str, &OptionArg, &mut Errors),
) {
    let mut seen = Seen::default();
    for arg in parse_options(tokens, errors) {
        let name = arg.name();
        if !known.contains(&name.as_str()) {
            errors.spanned(&arg.key, unknown_option(&arg, attribute, known));
            continue;
        }
        if !seen.first(&arg, errors) {
            continue;
        }
        apply(&name, &arg, errors);
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
    match known
        .iter()
        .map(|k| (edit_distance(&name, k), k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
    {
        Some((_, suggestion)) => {
            format!("{base}: did you mean `{suggestion}`? The options are {listed}")
        }
        None => format!("{base}: the options are {listed}"),
    }
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
    Context,
    /// A field of the generated type.
    Field(Box<Param>),
    /// An error was reported.
    Invalid,
}

/// Where each of a fn's parameters comes from in the generated call.
pub(crate) enum Slot {
    /// The context (`JobContext<'_>` / `StepContext<'_>`) the runtime
    /// passes.
    Context,
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
            ParamKind::Context => {
                if self.context_seen {
                    errors.spanned(
                        arg,
                        format!(
                            "a `{}` fn takes at most one `{}<'_>` parameter: remove this one",
                            rules.attribute, rules.context
                        ),
                    );
                }
                self.context_seen = true;
                self.slots.push(Slot::Context);
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
    if let Some(attr) = arg.attrs.first() {
        errors.spanned(
            attr,
            format!(
                "attributes on `{}` parameters are not supported: each parameter becomes a field of the generated type; move the attribute into the body",
                rules.attribute
            ),
        );
        ok = false;
    }
    // The context parameter, by value, in any position.
    if is_named(&arg.ty, rules.context) {
        return if check_context_pat(&arg.pat, rules, errors) && ok {
            ParamKind::Context
        } else {
            ParamKind::Invalid
        };
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
    if !ok {
        return ParamKind::Invalid;
    }
    ParamKind::Field(Box::new(Param {
        ident,
        ty: (*arg.ty).clone(),
        field_ty,
        by_ref,
    }))
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
    if let Some(lifetime) = &reference.lifetime
        && lifetime.ident != "_"
    {
        errors.spanned(
            lifetime,
            format!(
                "remove the lifetime `{lifetime}`: a reference parameter of a {} is stored owned and lent back for the call; write `&{}`",
                rules.what,
                reference.elem.to_token_stream()
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
                [Slot::Field(0), Slot::Context, Slot::Field(1), Slot::Context]
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
            ParamKind::Context
        ));
        assert!(matches!(
            classify(quote!(ctx: taquba_workflow::jobs::JobContext<'_>)).0,
            ParamKind::Context
        ));
        let (kind, errors) = classify(quote!(ctx: &JobContext<'_>));
        assert!(matches!(kind, ParamKind::Invalid));
        assert!(errors[0].contains("by value"));
    }

    #[test]
    fn invalid_parameters_are_reported() {
        for (input, needle) in [
            (quote!((a, b): (u8, u8)), "destructuring"),
            (quote!(_: u8), "name this parameter"),
            (quote!(x: impl Into<String>), "`impl Trait`"),
            (quote!(x: &mut u8), "`&mut`"),
            (quote!(x: &'a str), "remove the lifetime"),
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
