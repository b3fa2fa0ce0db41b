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
    fn pascal_case_converts_snake_case() {
        assert_eq!(pascal_case("send_email"), "SendEmail");
        assert_eq!(pascal_case("r#type"), "Type");
        assert_eq!(pascal_case("_leading__double"), "LeadingDouble");
        assert_eq!(pascal_case("v2_upload"), "V2Upload");
    }
}
