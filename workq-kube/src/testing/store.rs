//! The server's write rules: resource versions, uids, `metadata.generation`, the status
//! subresource, finalizers and `deletionTimestamp`, and the watch log every write feeds.

use serde_json::{Map, Value, json};

use super::state::{ApiError, ApiState, Entry, Key};

/// What a write did.
#[derive(Debug)]
pub(super) enum Written {
    /// The object was created.
    Created(Value),
    /// The object was changed.
    Modified(Value),
    /// The object was removed (its last finalizer went while it was being deleted).
    Deleted(Value),
}

impl Written {
    /// The object as the write left it.
    pub(super) fn object(&self) -> &Value {
        match self {
            Written::Created(object) | Written::Modified(object) | Written::Deleted(object) => {
                object
            }
        }
    }
}

/// Whether objects of `api_version` carry `metadata.generation`: custom resources and the
/// named groups' kinds do; the core group's (`v1`: ConfigMaps, Secrets) do not.
fn has_generation(api_version: &str) -> bool {
    api_version.contains('/')
}

/// The object without `metadata` and `status`: what a change of bumps the generation.
fn spec_part(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(fields) = object.as_object_mut() {
        fields.remove("metadata");
        fields.remove("status");
        fields.remove("apiVersion");
        fields.remove("kind");
    }
    object
}

/// An object's finalizers.
fn finalizers(object: &Value) -> Vec<String> {
    object["metadata"]["finalizers"]
        .as_array()
        .map(|list| {
            list.iter()
                .filter_map(|name| name.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The object's `metadata`, made an object if it was not.
fn metadata(object: &mut Value) -> &mut Map<String, Value> {
    let fields = object.as_object_mut().expect("objects are JSON objects");
    let metadata = fields.entry("metadata").or_insert_with(|| json!({}));
    if !metadata.is_object() {
        *metadata = json!({});
    }
    metadata.as_object_mut().expect("made an object above")
}

impl ApiState {
    /// The object at `key`, if any.
    pub(super) fn object(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Writes `new` at `key` (creating or replacing), applying the server's rules: the
    /// resource version, the uid, the generation, no new finalizers on an object being
    /// deleted, and its removal once its last finalizer is gone.
    pub(super) fn write(&mut self, key: &Key, mut new: Value) -> Result<Written, ApiError> {
        if !new.is_object() {
            return Err(ApiError::bad_request("the body is not a JSON object"));
        }
        let (api_version, kind) = self
            .kinds
            .get(&key.0)
            .cloned()
            .ok_or_else(|| ApiError::not_found(&key.0, &key.2))?;
        let old = self.objects.get(key).cloned();
        let old_meta = old.as_ref().map(|old| old["metadata"].clone());
        if let Some(old_meta) = &old_meta
            && old_meta
                .get("deletionTimestamp")
                .is_some_and(|t| !t.is_null())
        {
            let before = finalizers(old.as_ref().expect("old is set with its metadata"));
            if finalizers(&new).iter().any(|name| !before.contains(name)) {
                return Err(ApiError::invalid(
                    "no new finalizers can be added if the object is being deleted",
                ));
            }
        }
        let fields = new.as_object_mut().expect("checked above");
        fields.insert("apiVersion".into(), api_version.clone().into());
        fields.insert("kind".into(), kind.into());
        self.resource_version += 1;
        let resource_version = self.resource_version;
        let uid = match &old_meta {
            Some(meta) => meta["uid"].clone(),
            None => {
                self.uid += 1;
                Value::String(format!("uid-{}", self.uid))
            }
        };
        let generation = if has_generation(&api_version) {
            let previous = old_meta
                .as_ref()
                .and_then(|meta| meta["generation"].as_i64());
            Some(match (previous, &old) {
                (Some(previous), Some(old)) if spec_part(old) == spec_part(&new) => previous,
                (Some(previous), Some(_)) => previous + 1,
                _ => 1,
            })
        } else {
            None
        };
        let meta = metadata(&mut new);
        meta.insert("name".into(), key.2.clone().into());
        if key.1.is_empty() {
            meta.remove("namespace");
        } else {
            meta.insert("namespace".into(), key.1.clone().into());
        }
        meta.insert("uid".into(), uid);
        meta.insert(
            "resourceVersion".into(),
            resource_version.to_string().into(),
        );
        match generation {
            Some(generation) => meta.insert("generation".into(), generation.into()),
            None => meta.remove("generation"),
        };
        // Only a delete sets the deletion timestamp, and nothing clears it.
        match old_meta.as_ref().map(|meta| &meta["deletionTimestamp"]) {
            Some(stamp) if !stamp.is_null() => {
                meta.insert("deletionTimestamp".into(), stamp.clone())
            }
            _ => meta.remove("deletionTimestamp"),
        };
        if meta
            .get("finalizers")
            .is_some_and(|list| list.as_array().is_some_and(Vec::is_empty))
        {
            meta.remove("finalizers");
        }
        let deleting = meta.contains_key("deletionTimestamp");
        if deleting && finalizers(&new).is_empty() {
            self.objects.remove(key);
            self.log_event(key, "DELETED", new.clone(), old);
            return Ok(Written::Deleted(new));
        }
        self.objects.insert(key.clone(), new.clone());
        let event = if old.is_some() { "MODIFIED" } else { "ADDED" };
        self.log_event(key, event, new.clone(), old.clone());
        Ok(if old.is_some() {
            Written::Modified(new)
        } else {
            Written::Created(new)
        })
    }

    /// Deletes the object at `key`: at once without finalizers; otherwise it gets a
    /// `deletionTimestamp` (and a new generation) and goes when its last finalizer does.
    pub(super) fn delete(&mut self, key: &Key) -> Result<Written, ApiError> {
        let Some(mut object) = self.objects.get(key).cloned() else {
            return Err(ApiError::not_found(&key.0, &key.2));
        };
        if finalizers(&object).is_empty() {
            self.objects.remove(key);
            self.resource_version += 1;
            metadata(&mut object).insert(
                "resourceVersion".into(),
                self.resource_version.to_string().into(),
            );
            self.log_event(key, "DELETED", object.clone(), None);
            return Ok(Written::Deleted(object));
        }
        if object["metadata"]["deletionTimestamp"].is_string() {
            return Ok(Written::Modified(object));
        }
        let api_version = object["apiVersion"].as_str().unwrap_or_default().to_owned();
        let meta = metadata(&mut object);
        meta.insert(
            "deletionTimestamp".into(),
            k8s_openapi::jiff::Timestamp::now().to_string().into(),
        );
        if has_generation(&api_version) {
            let generation = meta.get("generation").and_then(Value::as_i64).unwrap_or(0);
            meta.insert("generation".into(), (generation + 1).into());
        }
        let previous = self.objects.insert(key.clone(), object.clone());
        self.resource_version += 1;
        let stamped = self.objects.get_mut(key).expect("inserted above");
        stamped["metadata"]["resourceVersion"] = self.resource_version.to_string().into();
        let object = stamped.clone();
        self.log_event(key, "MODIFIED", object.clone(), previous);
        Ok(Written::Modified(object))
    }

    /// Appends a watch event at the current resource version.
    fn log_event(&mut self, key: &Key, kind: &'static str, object: Value, previous: Option<Value>) {
        self.log.push(Entry {
            resource_version: self.resource_version,
            resource: key.0.clone(),
            namespace: key.1.clone(),
            kind,
            object,
            previous,
        });
    }
}
