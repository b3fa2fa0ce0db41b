//! The serialization of the generated types' fields and their one bound
//! check each.
//!
//! Each field of a job struct or step enum variant is serialized,
//! deserialized and (a by-value job parameter) cloned through
//! `__private::FieldProbe`, which type-checks whatever the field's type is,
//! so that code states no bound. The bounds are checked once per field, by
//! naming its marker trait (`JobField`, `JobFieldOwned`, `StepField`) at
//! the parameter's type: a type that misses one is one error, there.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote};
use syn::{Attribute, Ident, Type};

use super::respan;

/// The helper fns a field is serialized with, named by its
/// `#[serde(serialize_with, deserialize_with)]`.
pub(crate) struct SerdeFns {
    /// The `#[serde(...)]` attribute of the field.
    pub(crate) attr: TokenStream,
    /// The two fns, written beside the generated type (in the same module).
    pub(crate) fns: TokenStream,
}

/// The serde fns of a field of type `ty` (as written where the generated
/// type is), named after `tag` (unique in the module), under `cfgs`.
pub(crate) fn serde_fns(tag: &str, ty: &Type, cfgs: &[Attribute], krate: &TokenStream) -> SerdeFns {
    let ser = format_ident!("__taquba_ser_{tag}");
    let de = format_ident!("__taquba_de_{tag}");
    let (ser_name, de_name) = (
        syn::LitStr::new(&ser.to_string(), Span::call_site()),
        syn::LitStr::new(&de.to_string(), Span::call_site()),
    );
    let value = Ident::new("__taquba_value", Span::mixed_site());
    let serializer = Ident::new("__taquba_serializer", Span::mixed_site());
    let deserializer = Ident::new("__taquba_deserializer", Span::mixed_site());
    let probe = quote!((&#krate::__private::FieldProbe::<#ty>::new()).serde_via());
    let fns = quote! {
        #(#cfgs)*
        fn #ser<__S: #krate::__private::serde::Serializer>(
            #value: &#ty,
            #serializer: __S,
        ) -> ::core::result::Result<__S::Ok, __S::Error> {
            #[allow(unused_imports)]
            use #krate::__private::{ProbeSerde as _, ProbeSerdeUnchecked as _};
            #probe.serialize(#value, #serializer)
        }

        #(#cfgs)*
        #[allow(single_use_lifetimes)]
        fn #de<'de, __D: #krate::__private::serde::Deserializer<'de>>(
            #deserializer: __D,
        ) -> ::core::result::Result<#ty, __D::Error> {
            #[allow(unused_imports)]
            use #krate::__private::{ProbeSerde as _, ProbeSerdeUnchecked as _};
            #probe.deserialize(#deserializer)
        }
    };
    SerdeFns {
        attr: quote!(#[serde(serialize_with = #ser_name, deserialize_with = #de_name)]),
        fns,
    }
}

/// `let _ = <ty as check>::check;` under `cfgs`: the field's one bound
/// check, spanning the type as written (`check` is the marker trait's name
/// in `__private`), so a type missing a bound is one error, at the type.
pub(crate) fn bound_check(
    ty: &Type,
    check: &str,
    cfgs: &[Attribute],
    krate: &TokenStream,
) -> TokenStream {
    let (first, last) = end_spans(ty);
    let open = respan(&quote!(<), first);
    let trait_ident = Ident::new(check, last);
    let rest = respan(&quote!(as #krate::__private::#trait_ident>::check), last);
    quote!(#(#cfgs)* let _ = #open #ty #rest;)
}

/// The spans of the first and last tokens of `ty` (groups by their
/// delimiters): a path expression around the type from one to the other is
/// located at the type as a whole.
fn end_spans(ty: &Type) -> (Span, Span) {
    let tokens: Vec<TokenTree> = ty.to_token_stream().into_iter().collect();
    let span_of = |tree: &TokenTree| match tree {
        TokenTree::Group(group) => group.span(),
        other => other.span(),
    };
    match (tokens.first(), tokens.last()) {
        (Some(first), Some(last)) => (span_of(first), span_of(last)),
        _ => (Span::call_site(), Span::call_site()),
    }
}
