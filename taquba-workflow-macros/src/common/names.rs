//! The names and paths generated code uses: type names derived from fn
//! names, the hidden module's visibilities and paths, spans moved onto the
//! user's tokens, the runtime crate's path.

use proc_macro2::TokenStream;
use quote::quote;
use syn::{Attribute, Ident, Path, Type};

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

/// `name` as an identifier at `span`, or `None` when it is not one (a
/// keyword such as `Self`, or a name starting with a digit: `_1st` in
/// PascalCase is `1st`).
pub(crate) fn derived_ident(name: &str, span: proc_macro2::Span) -> Option<Ident> {
    let mut ident = syn::parse_str::<Ident>(name).ok()?;
    ident.set_span(span);
    Some(ident)
}

/// `ty` with `Self` replaced by `self_ty`: a type written in an impl block,
/// as it is named outside of it (`Vec<Self>` -> `Vec<Order>`,
/// `Self::Id` -> `<Order>::Id`).
pub(crate) fn replace_self(ty: &Type, self_ty: &Type) -> Type {
    struct Replace<'a>(&'a Type);
    impl syn::visit_mut::VisitMut for Replace<'_> {
        fn visit_type_mut(&mut self, ty: &mut Type) {
            if let Type::Path(syn::TypePath { qself: None, path }) = ty
                && path.leading_colon.is_none()
                && path.segments.first().is_some_and(|s| s.ident == "Self")
            {
                let rest: Vec<_> = path.segments.iter().skip(1).cloned().collect();
                let self_ty = self.0;
                *ty = if rest.is_empty() {
                    self_ty.clone()
                } else {
                    syn::parse_quote!(<#self_ty>::#(#rest)::*)
                };
                return;
            }
            syn::visit_mut::visit_type_mut(self, ty);
        }
    }
    let mut ty = ty.clone();
    syn::visit_mut::VisitMut::visit_type_mut(&mut Replace(self_ty), &mut ty);
    ty
}

/// `ty` as a user writes it, for messages: `Cow<'a, str>`, not the
/// token stream's `Cow < 'a , str >`.
pub(crate) fn type_text(ty: &Type) -> String {
    let spaced = quote!(#ty).to_string();
    let mut out = String::with_capacity(spaced.len());
    let mut chars = spaced.chars().peekable();
    while let Some(c) = chars.next() {
        if c == ' ' {
            let before = out.chars().last();
            let after = chars.peek().copied();
            // Keep the space between two words (`dyn Trait`, `impl Fn`) and
            // after a comma or before `+`; drop it around other punctuation.
            let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
            let keep = (word(before) && (word(after) || after == Some('\'')))
                || before == Some(',')
                || after == Some('+')
                || before == Some('+')
                || (before == Some('>') && word(after));
            if keep {
                out.push(' ');
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// An item's doc attributes written again on a generated item (the job
/// struct, a step's variant), outside doctest builds: the docs render on
/// both, and an example in them is collected once, from the user's item,
/// not a second time from the copy.
pub(crate) fn copied_docs(docs: &[&Attribute]) -> TokenStream {
    let metas = docs.iter().map(|attr| &attr.meta);
    quote!(#(#[cfg_attr(not(doctest), #metas)])*)
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
    fn derived_names_must_be_identifiers() {
        let span = proc_macro2::Span::call_site();
        assert_eq!(derived_ident("SendEmail", span).unwrap(), "SendEmail");
        for bad in ["1st", "", "Self", "self"] {
            assert!(derived_ident(bad, span).is_none(), "{bad}");
        }
    }

    #[test]
    fn self_is_replaced_by_the_type() {
        let order: Type = syn::parse_quote!(crate::shop::Order);
        for (written, expected) in [
            (quote!(Self), "crate :: shop :: Order"),
            (quote!(Vec<Self>), "Vec < crate :: shop :: Order >"),
            (quote!(Self::Id), "< crate :: shop :: Order > :: Id"),
            (
                quote!(<Self as Tr>::Out),
                "< crate :: shop :: Order as Tr > :: Out",
            ),
            (quote!(SelfService), "SelfService"),
        ] {
            let ty: Type = syn::parse2(written).unwrap();
            let replaced = replace_self(&ty, &order);
            assert_eq!(quote!(#replaced).to_string(), expected);
        }
    }

    #[test]
    fn types_print_as_written() {
        for written in [
            quote!(std::borrow::Cow<'a, str>),
            quote!((JobContext<'_>,)),
            quote!(Box<dyn std::error::Error + Send + Sync>),
            quote!(&'static [u8]),
            quote!(impl Into<String>),
            quote!(Vec<(u8, u8)>),
        ] {
            let ty: Type = syn::parse2(written.clone()).unwrap();
            let text = type_text(&ty);
            let reparsed: Type = syn::parse_str(&text).unwrap();
            assert_eq!(quote!(#reparsed).to_string(), written.to_string(), "{text}");
        }
        let ty: Type = syn::parse_quote!(std::borrow::Cow<'a, str>);
        assert_eq!(type_text(&ty), "std::borrow::Cow<'a, str>");
        let ty: Type = syn::parse_quote!(Box<dyn std::error::Error + Send>);
        assert_eq!(type_text(&ty), "Box<dyn std::error::Error + Send>");
    }

    #[test]
    fn pascal_case_converts_snake_case() {
        assert_eq!(pascal_case("send_email"), "SendEmail");
        assert_eq!(pascal_case("r#type"), "Type");
        assert_eq!(pascal_case("_leading__double"), "LeadingDouble");
        assert_eq!(pascal_case("v2_upload"), "V2Upload");
    }
}
