//! The names a controller gives its sources: a kind's name from its Rust type.

use kube::Resource;

/// `K`'s kind for names, from its `Debug`-free type name when it has a dynamic type.
pub(crate) fn kind_of<T: Resource>() -> String {
    short_type_name::<T>()
}

/// The last segment of a type's name, without generics: `Secret`, `Widget`.
pub(crate) fn short_type_name<T>() -> String {
    let full = std::any::type_name::<T>();
    let base = full.split('<').next().unwrap_or(full);
    base.rsplit("::").next().unwrap_or(base).to_owned()
}
