//! `#[job]`: an async fn becomes a typed job.
//!
//! [`parse`] reads the attribute's options, [`validate`] checks the fn and
//! builds the [`validate::JobModel`], [`expand`] writes the generated code.
//! Every stage reports into one [`Errors`] so a single compile shows every
//! mistake; when there is any, the fn is emitted unchanged beside the
//! errors so the rest of the crate still type-checks.

pub(crate) mod expand;
pub(crate) mod parse;
pub(crate) mod validate;

use proc_macro2::TokenStream;
use quote::quote;
use syn::ItemFn;

use crate::common::Errors;

/// The whole `#[job]` expansion.
pub(crate) fn job(attr: TokenStream, item: TokenStream) -> TokenStream {
    let func: ItemFn = match syn::parse2(item.clone()) {
        Ok(func) => func,
        Err(_) => {
            let error = syn::Error::new_spanned(
                &item,
                "`#[job]` goes on an `async fn`: write `#[job] async fn name(arg: Type) -> Result<T, E> { ... }`",
            )
            .to_compile_error();
            return quote!(#item #error);
        }
    };
    // Re-emitted without the parameters' doc comments, which the struct's
    // fields carry (rustc refuses them on parameters).
    let mut emitted = func.clone();
    crate::common::strip_param_attrs(emitted.sig.inputs.iter_mut());
    crate::common::prepare_emitted(&mut emitted.attrs, &mut emitted.sig);
    let mut errors = Errors::new();
    let options = parse::parse(attr, &mut errors);
    let model = validate::validate(&func, options, &mut errors);
    match model {
        Some(model) if errors.is_empty() => expand::expand(&model, &emitted),
        _ => {
            let compile_errors = errors.to_compile_errors();
            quote!(#emitted #compile_errors)
        }
    }
}
