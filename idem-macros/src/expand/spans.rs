//! Spans for generated tokens, so that rustc reports on the user's own.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::Type;

/// `before #ty after`, with `before` spanned on the first token of `ty` and
/// `after` on its last. rustc spans a type or path from its first token to
/// its last, so whatever it reports on the result points at exactly the
/// written type (a stable proc macro cannot join spans itself).
pub(super) fn around(before: TokenStream, ty: &Type, after: TokenStream) -> TokenStream {
    let (first, last) = ends(ty);
    let before = respan(before, first);
    let after = respan(after, last);
    quote!(#before #ty #after)
}

/// The spans of the first and the last token of `ty`.
pub(super) fn ends(ty: &Type) -> (Span, Span) {
    let mut tokens = quote!(#ty).into_iter();
    let first = tokens.next().map_or_else(Span::call_site, |t| t.span());
    let last = tokens.last().map_or(first, |t| t.span());
    (first, last)
}

/// Gives every token of `tokens` the span `span` (generated tokens only:
/// never pass user tokens, whose own spans matter).
pub(super) fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|mut tt| {
            if let proc_macro2::TokenTree::Group(g) = &tt {
                let mut group = proc_macro2::Group::new(g.delimiter(), respan(g.stream(), span));
                group.set_span(span);
                tt = proc_macro2::TokenTree::Group(group);
            } else {
                tt.set_span(span);
            }
            tt
        })
        .collect()
}
