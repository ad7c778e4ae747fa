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
