//! What the written types say, read from their syntax (the macro cannot
//! resolve types).

use syn::Type;

/// The names of a path's segments, without their generic arguments:
/// `std::vec::Vec<T>` gives `["std", "vec", "Vec"]`.
pub(crate) fn segment_names(path: &syn::Path) -> Vec<String> {
    path.segments.iter().map(|s| s.ident.to_string()).collect()
}

/// The `T` of a `&mut T` parameter: in first position, the handler's
/// transaction. Whether `T` is one is the runtime's to say (its
/// `StoreTransaction` trait), on that type.
pub(crate) fn mut_referent(ty: &Type) -> Option<&Type> {
    match ty {
        Type::Reference(r) if r.mutability.is_some() => Some(&r.elem),
        Type::Paren(p) => mut_referent(&p.elem),
        Type::Group(g) => mut_referent(&g.elem),
        _ => None,
    }
}

/// `(T)` as `T`: a parenthesized type turbofished as it is would draw
/// `unused_parens`.
pub(crate) fn unparenthesized(ty: &Type) -> &Type {
    match ty {
        Type::Paren(p) => unparenthesized(&p.elem),
        Type::Group(g) => unparenthesized(&g.elem),
        other => other,
    }
}

/// Whether `ty` holds `impl Trait` anywhere.
pub(crate) fn holds_impl_trait(ty: &Type) -> bool {
    struct Finder(bool);
    impl<'ast> syn::visit::Visit<'ast> for Finder {
        fn visit_type_impl_trait(&mut self, _: &'ast syn::TypeImplTrait) {
            self.0 = true;
        }
    }
    let mut finder = Finder(false);
    syn::visit::Visit::visit_type(&mut finder, ty);
    finder.0
}

/// The `Output` of a future type as written: `X` of `impl Future<Output = X>`
/// (with any other bounds), of `Pin<Box<dyn Future<Output = X> + ...>>` and
/// of `BoxFuture<'_, X>` or `LocalBoxFuture<'_, X>` (the futures crate's
/// aliases). `None` for any other type.
pub(crate) fn future_output(ty: &Type) -> Option<&Type> {
    match ty {
        Type::ImplTrait(t) => output_of_bounds(&t.bounds),
        Type::Paren(p) => future_output(&p.elem),
        Type::Group(g) => future_output(&g.elem),
        Type::Path(p) if p.qself.is_none() => {
            let last = p.path.segments.last()?;
            let mut types = type_arguments(&last.arguments);
            match last.ident.to_string().as_str() {
                "Pin" => {
                    let Some(Type::Path(boxed)) = types.next() else {
                        return None;
                    };
                    let last = boxed.path.segments.last()?;
                    if last.ident != "Box" {
                        return None;
                    }
                    match type_arguments(&last.arguments).next()? {
                        Type::TraitObject(dyn_trait) => output_of_bounds(&dyn_trait.bounds),
                        _ => None,
                    }
                }
                "BoxFuture" | "LocalBoxFuture" => types.last(),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The type arguments of a path segment, `<'a, T, U>` giving `T` and `U`.
fn type_arguments(args: &syn::PathArguments) -> impl Iterator<Item = &Type> {
    let args = match args {
        syn::PathArguments::AngleBracketed(a) => Some(a.args.iter()),
        _ => None,
    };
    args.into_iter().flatten().filter_map(|g| match g {
        syn::GenericArgument::Type(t) => Some(t),
        _ => None,
    })
}

/// `X` of the bound `Future<Output = X>` (any path ending in `Future`).
fn output_of_bounds<P>(
    bounds: &syn::punctuated::Punctuated<syn::TypeParamBound, P>,
) -> Option<&Type> {
    bounds.iter().find_map(|bound| {
        let syn::TypeParamBound::Trait(t) = bound else {
            return None;
        };
        let last = t.path.segments.last()?;
        if last.ident != "Future" {
            return None;
        }
        let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
            return None;
        };
        args.args.iter().find_map(|g| match g {
            syn::GenericArgument::AssocType(a) if a.ident == "Output" => Some(&a.ty),
            _ => None,
        })
    })
}

/// A type as a person writes it, for a message: `Result<u64, std::io::Error>`,
/// not the token stream's `Result < u64 , std :: io :: Error >`.
pub(crate) fn written(ty: &Type) -> String {
    let mut out = String::new();
    write_tokens(&mut out, quote::quote!(#ty));
    out
}

fn write_tokens(out: &mut String, tokens: proc_macro2::TokenStream) {
    use proc_macro2::{Delimiter, Spacing, TokenTree};
    // What the previous token asks of the space after it.
    #[derive(Clone, Copy, PartialEq)]
    enum Prev {
        /// Start of the stream, `<`, `&`, `*`, `?`, `'`, `::` or a joint
        /// punctuation: no space.
        Tight,
        /// An identifier that is not a keyword: `Vec<`, `Fn(` are tight.
        Name,
        /// Anything else: a space before the next word.
        Word,
    }
    let mut prev = Prev::Tight;
    for tt in tokens {
        match tt {
            TokenTree::Punct(p) => {
                let c = p.as_char();
                let tight_before =
                    matches!(c, ',' | ';' | '>' | ':' | '.') || (c == '<' && prev == Prev::Name);
                if prev != Prev::Tight && !tight_before {
                    out.push(' ');
                }
                out.push(c);
                prev = if p.spacing() == Spacing::Joint
                    || matches!(c, '<' | '&' | '*' | '?' | '\'' | ':')
                {
                    Prev::Tight
                } else {
                    Prev::Word
                };
            }
            TokenTree::Group(g) => {
                let (open, close) = match g.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::Brace => ("{ ", " }"),
                    Delimiter::None => ("", ""),
                };
                if prev == Prev::Word {
                    out.push(' ');
                }
                out.push_str(open);
                write_tokens(out, g.stream());
                out.push_str(close);
                prev = Prev::Word;
            }
            TokenTree::Ident(i) => {
                if prev != Prev::Tight {
                    out.push(' ');
                }
                let word = i.to_string();
                let keyword = matches!(word.as_str(), "mut" | "dyn" | "impl" | "as" | "const");
                out.push_str(&word);
                prev = if keyword { Prev::Word } else { Prev::Name };
            }
            TokenTree::Literal(l) => {
                if prev != Prev::Tight {
                    out.push(' ');
                }
                out.push_str(&l.to_string());
                prev = Prev::Word;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{future_output, written};

    fn ty(text: &str) -> syn::Type {
        syn::parse_str(text).expect("a type")
    }

    #[test]
    fn types_print_as_written() {
        for text in [
            "Result<u64, std::io::Error>",
            "Result<(), AppError>",
            "Result<Vec<&'a str>, Box<dyn std::error::Error + Send + Sync>>",
            "Result<(u64, [u8; 4]), E>",
            "<T as Trait>::Out",
            "&mut Vec<u8>",
            "&'static str",
            "*const u8",
            "impl Fn(u8) -> Result<u8, E> + Send",
            "impl Future<Output = Result<u64, E>> + '_",
            "Option<Box<dyn Fn() -> u8>>",
            "::std::result::Result<!, E>",
            "Vec<T>",
        ] {
            assert_eq!(written(&ty(text)), text);
        }
    }

    #[test]
    fn the_output_of_futures() {
        for (future, output) in [
            ("impl Future<Output = Result<u64, E>>", "Result<u64, E>"),
            (
                "impl std::future::Future<Output = Result<u64, E>> + Send + '_",
                "Result<u64, E>",
            ),
            ("impl Send + Future<Output = u8>", "u8"),
            (
                "Pin<Box<dyn Future<Output = Result<(), E>> + Send + 'a>>",
                "Result<(), E>",
            ),
            ("std::pin::Pin<Box<dyn Future<Output = u8>>>", "u8"),
            ("BoxFuture<'static, Result<u8, E>>", "Result<u8, E>"),
            ("futures::future::LocalBoxFuture<'_, u8>", "u8"),
        ] {
            let found = future_output(&ty(future)).map(written);
            assert_eq!(found.as_deref(), Some(output), "{future}");
        }
        for other in [
            "Result<u64, E>",
            "impl Debug",
            "Box<dyn Future<Output = u8>>",
            "Pin<&mut dyn Future<Output = u8>>",
            "impl Future",
        ] {
            assert!(future_output(&ty(other)).is_none(), "{other}");
        }
    }
}
