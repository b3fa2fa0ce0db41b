//! `#[workflow]`: an impl block of `#[step]` async fns becomes a workflow.
//!
//! [`parse`] reads `#[workflow(...)]` and each `#[step(...)]`, [`validate`]
//! checks the impl block and builds the [`validate::WorkflowModel`],
//! [`expand`] writes the generated code. Errors accumulate in one
//! [`Errors`]; with any, the impl block (without its `#[step]` markers) is
//! emitted with stand-in types so the crate keeps resolving.

pub(crate) mod expand;
pub(crate) mod parse;
pub(crate) mod validate;

use proc_macro2::TokenStream;
use quote::quote;
use syn::ItemImpl;

use crate::common::Errors;

/// The whole `#[workflow]` expansion.
pub(crate) fn workflow(attr: TokenStream, item: TokenStream) -> TokenStream {
    let impl_block: ItemImpl = match syn::parse2(item.clone()) {
        Ok(item) => item,
        Err(_) => {
            let error = syn::Error::new_spanned(
                &item,
                "`#[workflow]` goes on an impl block whose `#[step]` async fns are the workflow's steps: write `#[workflow] impl Order { #[step(start)] async fn first(...) -> Result<Transition<OrderStep>, StepError> { ... } }`",
            )
            .to_compile_error();
            return quote!(#item #error);
        }
    };
    let mut errors = Errors::new();
    let options = parse::parse(attr, &mut errors);
    let (stripped, model) = validate::validate(impl_block, options, &mut errors);
    let fallback = !errors.is_empty();
    let compile_errors = errors.to_compile_errors();
    match model {
        Some(model) => {
            let expanded = expand::expand(&model, fallback);
            quote!(#expanded #compile_errors)
        }
        None => quote!(#stripped #compile_errors),
    }
}

/// `#[step]` outside a `#[workflow]` impl block: an error, with the item
/// emitted unchanged.
pub(crate) fn stray_step(_attr: TokenStream, item: TokenStream) -> TokenStream {
    let error = syn::Error::new(
        proc_macro2::Span::call_site(),
        "`#[step]` marks a step of a `#[workflow]` impl block: put `#[workflow]` on the impl block that holds this fn",
    )
    .to_compile_error();
    quote!(#item #error)
}
