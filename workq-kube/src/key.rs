//! [`ObjectKey`]: how an [`ObjectRef`] is written into a queue's items.

use std::fmt;
use std::hash::Hash;

use kube::Resource;
use kube::runtime::reflector::{ObjectRef, ObjectRefExtra};

/// What a controller's queue holds for an object of kind `K`: the object's reference, or a
/// text that names it.
///
/// Two encodings come with the crate:
///
/// | item type | encoding | for |
/// | --- | --- | --- |
/// | [`ObjectRef<K>`] | the reference itself (its `resource_version` and `uid` dropped, so that one object is one key) | the in-memory [`WorkQueue`](workq::WorkQueue) |
/// | [`String`] | `"namespace/name"`, or `"name"` for a cluster-scoped object: client-go's `MetaNamespaceKeyFunc` | queues that store text, such as `workq_redis::RedisQueue<String>` |
///
/// The kind is not part of the key: one controller's queue holds one kind, so two
/// controllers sharing a backend use two queue names.
///
/// # Examples
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kube::runtime::reflector::ObjectRef;
/// use workq_kube::ObjectKey;
///
/// let object = ObjectRef::<ConfigMap>::new("web").within("default");
/// let key = <String as ObjectKey<ConfigMap>>::from_object_ref(&object);
/// assert_eq!(key, "default/web");
/// assert_eq!(ObjectKey::<ConfigMap>::to_object_ref(&key, &()), object);
/// ```
pub trait ObjectKey<K: Resource>: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static {
    /// The key for `object`.
    fn from_object_ref(object: &ObjectRef<K>) -> Self;

    /// The reference the key names; `dyntype` is the controller's dynamic type (`()` for
    /// k8s-openapi types and custom resources with a static type).
    fn to_object_ref(&self, dyntype: &K::DynamicType) -> ObjectRef<K>;
}

impl<K> ObjectKey<K> for ObjectRef<K>
where
    K: Resource + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync + fmt::Debug + 'static,
{
    fn from_object_ref(object: &ObjectRef<K>) -> Self {
        let mut key = object.clone();
        // The extra fields (resource version, uid) take no part in equality; dropping them
        // keeps a key's memory to its name.
        key.extra = ObjectRefExtra::default();
        key
    }

    fn to_object_ref(&self, _dyntype: &K::DynamicType) -> ObjectRef<K> {
        self.clone()
    }
}

impl<K> ObjectKey<K> for String
where
    K: Resource,
    K::DynamicType: Clone,
{
    fn from_object_ref(object: &ObjectRef<K>) -> Self {
        match &object.namespace {
            Some(namespace) => format!("{namespace}/{}", object.name),
            None => object.name.clone(),
        }
    }

    fn to_object_ref(&self, dyntype: &K::DynamicType) -> ObjectRef<K> {
        // Neither names nor namespaces may contain '/', so the split is unambiguous.
        match self.split_once('/') {
            Some((namespace, name)) => ObjectRef::new_with(name, dyntype.clone()).within(namespace),
            None => ObjectRef::new_with(self, dyntype.clone()),
        }
    }
}
