//! The error accumulator every stage of an expansion reports into.

use std::fmt::Display;

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;

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
