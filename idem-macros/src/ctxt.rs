//! Collects every error of one attribute so a build reports them all.

use std::fmt::Display;

use proc_macro2::TokenStream;
use quote::ToTokens;

#[derive(Default)]
pub(crate) struct Ctxt {
    errors: Vec<syn::Error>,
}

impl Ctxt {
    /// Records an error spanning `tokens`.
    pub(crate) fn error_spanned_by<T: ToTokens, M: Display>(&mut self, tokens: T, msg: M) {
        self.errors
            .push(syn::Error::new_spanned(tokens.into_token_stream(), msg));
    }

    /// Records an error at `span`.
    pub(crate) fn error_at<M: Display>(&mut self, span: proc_macro2::Span, msg: M) {
        self.errors.push(syn::Error::new(span, msg));
    }

    pub(crate) fn syn_error(&mut self, e: syn::Error) {
        self.errors.push(e);
    }

    /// `Ok` when nothing was recorded, else every error as compile errors.
    pub(crate) fn finish(self) -> Result<(), TokenStream> {
        let mut errors = self.errors.into_iter();
        let Some(mut first) = errors.next() else {
            return Ok(());
        };
        for e in errors {
            first.combine(e);
        }
        Err(first.to_compile_error())
    }
}
