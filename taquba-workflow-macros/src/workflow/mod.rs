//! `#[workflow]`: an impl block of `#[step]` async fns becomes a workflow.

use proc_macro2::TokenStream;

/// The whole `#[workflow]` expansion.
pub(crate) fn workflow(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}

/// `#[step]` outside a `#[workflow]` impl block.
pub(crate) fn stray_step(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}
