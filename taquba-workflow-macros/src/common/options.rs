//! The option lists of `#[job(...)]`, `#[workflow(...)]` and
//! `#[step(...)]`: parsed without stopping at the first mistake, each value
//! checked for its shape, unknown options reported with the closest known
//! one.

use std::collections::HashSet;

use proc_macro2::{Delimiter, Span, TokenStream, TokenTree};
use syn::ext::IdentExt;
use syn::punctuated::Punctuated;
use syn::{Ident, LitInt, LitStr, Path, Token};

use super::Errors;

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
        // Names are stored and compared exactly (the CLI's `--workflow`,
        // a re-registration): a space at either end is a typo that lasts.
        if value.trim() != value {
            errors.spanned(
                &lit,
                format!(
                    "`{0}` starts or ends with whitespace, which would be part of the stored name: write `{0} = {1:?}`",
                    self.name(),
                    value.trim()
                ),
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
            Ok(paths) => paths
                .into_iter()
                .filter(|path| {
                    let serde = path
                        .segments
                        .last()
                        .map(|s| s.ident.to_string())
                        .filter(|name| name == "Serialize" || name == "Deserialize");
                    if let Some(name) = &serde {
                        errors.spanned(
                            path,
                            format!(
                                "the generated types always derive `{name}` (through the runtime's serde, so your crate needs no serde of its own): remove `{name}` from `derive(...)`"
                            ),
                        );
                    }
                    serde.is_none()
                })
                .collect(),
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
        if !matches!(lit.suffix(), "" | "u32") {
            errors.spanned(
                &lit,
                format!(
                    "`{}` is a `u32`, not a `{}`: write `{example}`",
                    self.name(),
                    lit.suffix()
                ),
            );
            return None;
        }
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
///
/// Returns whether an entry went unread: one malformed, or unknown and not
/// applied as a known one. Whatever it was meant to set is then unknown
/// (`#[workflow(result = u32)]` may have meant the output).
pub(crate) fn for_each_option(
    tokens: TokenStream,
    attribute: &str,
    known: &[&str],
    misspelt_options: Misspelt,
    errors: &mut Errors,
    mut apply: impl FnMut(&str, &OptionArg, &mut Errors),
) -> bool {
    let mut seen = Seen::default();
    let mut misspelt = Vec::new();
    let before = errors.count();
    let args = parse_options(tokens, errors);
    let mut unread = errors.count() > before;
    for arg in args {
        let name = arg.name();
        if !known.contains(&name.as_str()) {
            errors.spanned(&arg.key, unknown_option(&arg, attribute, known));
            match suggestion(&name, known) {
                Some(meant) if misspelt_options == Misspelt::ReadAsMeant => {
                    misspelt.push((meant, arg));
                }
                _ => unread = true,
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
    unread
}

/// Options that may be given more than once (`#[step(alias = "a", alias =
/// "b")]`): each is handed to `apply` in turn.
const REPEATABLE_OPTIONS: &[&str] = &["alias"];

/// Tracks option names already seen, to report duplicates.
#[derive(Default)]
struct Seen(HashSet<String>);

impl Seen {
    /// Whether `arg` is new (or may repeat); reports it otherwise.
    fn first(&mut self, arg: &OptionArg, errors: &mut Errors) -> bool {
        let name = arg.name();
        if REPEATABLE_OPTIONS.contains(&name.as_str()) || self.0.insert(name) {
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

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::*;

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
}
